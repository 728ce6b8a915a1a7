"""The receipts store: answers to requests sent with an ``Idempotency-Key``.

One row per (tenant, key). A request claims its key (state ``pending``) before it
generates; when its record commits, the whole answer, salts included, is stored (state
``done``) whether or not the caller is still listening. A retry with the same key and
body gets that answer; a different body is refused. Rows expire after a TTL and are
purged; this table is never part of the log or the mirror.

Each claim carries an owner token. Completing and releasing are compare-and-set on it: a
request whose stale claim was taken over by another one finds, when it finishes late,
that it no longer owns the key, and changes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from ledger.store.schema import receipts


@dataclass(frozen=True)
class StoredReceipt:
    fingerprint: bytes
    state: str  # "pending" or "done"
    response: dict[str, Any] | None
    created_at: datetime
    owner: str | None = None


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


class ReceiptStore:
    def __init__(self, engine: Engine, ttl_s: float = 24 * 3600.0) -> None:
        self.engine = engine
        self.ttl = timedelta(seconds=ttl_s)

    def claim(self, tenant: str, key: str, fingerprint: bytes, stale_after_s: float,
              owner: str) -> StoredReceipt | None:
        """Claim ``key`` for a new request as ``owner``: None if claimed, else the row that
        holds it.

        An expired row, or a ``pending`` one older than ``stale_after_s`` (its process
        died before answering), is taken over: it then belongs to ``owner``.
        """
        now = _now()
        values = {"fingerprint": fingerprint, "state": "pending", "response": None,
                  "created_at": now, "expires_at": now + self.ttl, "owner": owner}
        try:
            with self.engine.begin() as conn:
                conn.execute(insert(receipts).values(tenant=tenant, idempotency_key=key,
                                                     **values))
            return None
        except IntegrityError:
            pass
        stale = now - timedelta(seconds=stale_after_s)
        with self.engine.begin() as conn:
            taken = conn.execute(
                update(receipts)
                .where(receipts.c.tenant == tenant, receipts.c.idempotency_key == key)
                .where((receipts.c.expires_at < now)
                       | ((receipts.c.state == "pending") & (receipts.c.created_at < stale)))
                .values(**values)
            ).rowcount
        if taken:
            return None
        found = self.get(tenant, key)
        if found is None:  # purged between the two statements: try once more
            return self.claim(tenant, key, fingerprint, stale_after_s, owner)
        if found.owner == owner and found.state == "pending":
            # A retried claim whose first INSERT committed though its answer was lost
            # (the connection dropped at the commit): the claim is already ours.
            return None
        return found

    def get(self, tenant: str, key: str) -> StoredReceipt | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(receipts).where(
                receipts.c.tenant == tenant, receipts.c.idempotency_key == key)).first()
        if row is None:
            return None
        return StoredReceipt(bytes(row.fingerprint), row.state,
                             json.loads(row.response) if row.response else None,
                             row.created_at, row.owner)

    def complete(self, tenant: str, key: str, owner: str, response: dict[str, Any]) -> bool:
        """Store the answer of a key ``owner`` still holds pending (its record is
        committed). False, and nothing changed, if the claim is no longer ``owner``'s."""
        with self.engine.begin() as conn:
            done = conn.execute(update(receipts).where(
                receipts.c.tenant == tenant, receipts.c.idempotency_key == key,
                receipts.c.owner == owner, receipts.c.state == "pending")
                .values(state="done", response=json.dumps(response))).rowcount
        return bool(done)

    def release(self, tenant: str, key: str, owner: str) -> bool:
        """Give up a pending claim ``owner`` still holds (nothing was committed): a retry
        may generate. False, and nothing changed, if the claim is no longer ``owner``'s."""
        with self.engine.begin() as conn:
            gone = conn.execute(delete(receipts).where(
                receipts.c.tenant == tenant, receipts.c.idempotency_key == key,
                receipts.c.owner == owner, receipts.c.state == "pending")).rowcount
        return bool(gone)

    def pending_owned(self, owner_prefix: str) -> list[tuple[str, str, str]]:
        """(tenant, key, owner) of every pending claim whose owner starts with
        ``owner_prefix`` (a host's claims, checked at start for dead processes)."""
        escaped = owner_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        with self.engine.connect() as conn:
            rows = conn.execute(select(receipts.c.tenant, receipts.c.idempotency_key,
                                       receipts.c.owner)
                                .where(receipts.c.state == "pending",
                                       receipts.c.owner.like(escaped + "%", escape="\\")))
            return [(r.tenant, r.idempotency_key, r.owner) for r in rows]

    def purge(self) -> int:
        """Delete every expired row; returns how many."""
        with self.engine.begin() as conn:
            result = conn.execute(delete(receipts).where(receipts.c.expires_at < _now()))
        return int(result.rowcount or 0)
