"""Fencing: the lease holder ends other replicas' writer sessions stuck on the sequencer.

PostgreSQL only (decision 0021, amended by 0028). A writer frozen between its statements
is ended by the server's idle-in-transaction timeout; one frozen while it was still
sending a statement leaves its session waiting for the rest of the request with no timer
armed, and only a terminate frees the ``tree_state`` row then.

A role sees the state of, and may signal, only its own sessions unless it is a member of
``pg_read_all_stats`` (to see) and ``pg_signal_backend`` (to signal); ``fencing_reach``
says which of the two a replica lacks, so it can say so instead of silently never
fencing replicas that connect as another role.
"""

from __future__ import annotations

import logging
import os
import secrets
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

log = logging.getLogger(__name__)

# Names this process's PostgreSQL sessions (``application_name``), so a lease holder can
# tell another process's stuck writer from its own.
PROCESS_TAG = f"{os.getpid()}-{secrets.token_hex(4)}"
WRITER_APPLICATION_PREFIX = "audit-ledger/writer/"
FENCING_ROLES = ("pg_read_all_stats", "pg_signal_backend")


@dataclass(frozen=True)
class FencingReach:
    """Whose stuck writer sessions this replica's database role can end."""

    role: str
    missing: tuple[str, ...]  # the FENCING_ROLES it is not a member of

    @property
    def other_roles(self) -> bool:
        """True if it can see and signal sessions of every non-superuser role, not
        only its own."""
        return not self.missing

    def describe(self) -> str:
        if self.other_roles:
            return f"role {self.role!r} can fence writer sessions of every role"
        return (f"role {self.role!r} is not a member of {' and '.join(self.missing)}: it can "
                "fence only replicas that connect as the same role; a replica of another "
                "role frozen mid-statement would hold the sequencer until it wakes")


class Fencing(Protocol):
    """What the lease holder fences through (the SQL ledger; nothing to do on SQLite)."""

    def fence_stuck_writers(self, older_than_s: float) -> list[tuple[int, str, float]]:
        """End other processes' writer sessions stuck on the sequencer this long; (pid,
        application name, seconds quiet) of each one ended."""

    def fencing_reach(self) -> FencingReach | None:
        """Whose stuck writers this replica can end; None where there is no fencing."""


def fencing_reach(engine: Engine) -> FencingReach:
    """Ask the server which fencing roles this engine's role is a member of (a superuser
    is a member of every role)."""
    with engine.connect() as conn:
        row = conn.execute(text(
            "SELECT current_user AS role,"
            " pg_has_role(current_user, 'pg_read_all_stats', 'MEMBER') AS read_stats,"
            " pg_has_role(current_user, 'pg_signal_backend', 'MEMBER') AS signal")).one()
        conn.rollback()
    missing = tuple(name for name, member in zip(FENCING_ROLES, (row.read_stats, row.signal),
                                                 strict=True) if not member)
    return FencingReach(str(row.role), missing)


_CANDIDATES = text(
    "SELECT a.pid, a.application_name, EXTRACT(EPOCH FROM clock_timestamp()"
    " - GREATEST(a.query_start, a.state_change))::float8 AS quiet_s"
    " FROM pg_stat_activity a"
    " WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()"
    " AND starts_with(a.application_name, :prefix) AND a.application_name <> :own"
    " AND (a.state LIKE 'idle in transaction%' OR a.wait_event_type = 'Client')"
    " AND GREATEST(a.query_start, a.state_change)"
    "     < clock_timestamp() - make_interval(secs => :after)"
    " AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.granted"
    " AND l.relation = 'tree_state'::regclass AND l.mode <> 'AccessShareLock')"
)


def fence_stuck_writers(engine: Engine, older_than_s: float) -> list[tuple[int, str, float]]:
    """End other processes' writer sessions stuck holding the sequencer row.

    A session qualifies when it belongs to another process's writer, holds the
    sequencer row (a row-level lock mode on ``tree_state``: ``FOR UPDATE`` or an
    ``UPDATE``, not a plain read), and has been waiting on its client (idle inside
    its transaction, or in the middle of a request) for more than ``older_than_s``
    since its last statement began. So a writer that queued for the row and has just
    got it (it has just run a statement) and a writer running a long statement (not
    waiting on its client) never qualify; a frozen one does.

    Its transaction is rolled back, so nothing it had not committed was acknowledged.
    ``pg_terminate_backend`` acts even on a session blocked reading from or writing to
    a frozen client, where a cancel (or ``statement_timeout``) would not. A session
    this role may not see or signal (see ``fencing_reach``; a superuser's) is skipped,
    and a refusal is logged. Returns (pid, application name, seconds since its last
    statement) for each one ended. The caller is the lease holder, so one replica fences.
    """
    ended: list[tuple[int, str, float]] = []
    with engine.connect() as conn:
        rows = conn.execute(_CANDIDATES, {"prefix": WRITER_APPLICATION_PREFIX,
                                          "own": WRITER_APPLICATION_PREFIX + PROCESS_TAG,
                                          "after": older_than_s}).all()
        conn.rollback()
        for row in rows:
            try:
                done = conn.execute(text("SELECT pg_terminate_backend(:pid)"),
                                    {"pid": row.pid}).scalar()
                conn.commit()
            except DBAPIError as exc:  # e.g. a superuser's session: not ours to end
                conn.rollback()
                log.warning("cannot end stuck writer session %d (%s): %s", row.pid,
                            row.application_name, str(exc.orig).splitlines()[0][:200])
                continue
            if done:
                ended.append((int(row.pid), str(row.application_name), float(row.quiet_s)))
    return ended
