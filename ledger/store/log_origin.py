"""The log's origin as its database holds it: what v2 leaves written outside the
generate path (access, erasure and report leaves) need for their tenant tags."""

from __future__ import annotations

from sqlalchemy import Connection, select

from ledger.checkpoint import Checkpoint
from ledger.errors import LogIdentityError
from ledger.store.schema import checkpoints, log_meta


def stored_origin(conn: Connection) -> str:
    """The stored origin, or (a log made before origins were stored) its latest
    checkpoint's. Raises ``LogIdentityError`` for a log with neither: its tenant tags
    cannot be made until the service has given it an identity."""
    origin = conn.execute(select(log_meta.c.origin).where(log_meta.c.id == 1)).scalar()
    if origin is not None:
        return str(origin)
    note = conn.execute(select(checkpoints.c.note).order_by(checkpoints.c.size.desc())
                        .limit(1)).scalar()
    if note is not None:
        return Checkpoint.peek(bytes(note)).origin
    raise LogIdentityError("origin", "the log has no origin yet (no identity and no "
                           "checkpoint): start the service on it once, or give its origin")
