"""One lock per tenant that orders its key-store changes (an erasure replacing KEKs)
against the writes that wrap keys under them (retaining content, storing an answer).

PostgreSQL: a transaction-scoped advisory lock, shared by the writers and exclusive for
an erasure. SQLite: nothing to take here; every such transaction already holds the
database's one write lock (``BEGIN IMMEDIATE``, or a write as its first statement).
"""

from __future__ import annotations

import hashlib

from sqlalchemy import Connection, text


def tenant_lock_key(tenant: str) -> int:
    digest = hashlib.sha256(b"audit-ledger/tenant-keys\n" + tenant.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def lock_tenant(conn: Connection, tenant: str, *, exclusive: bool) -> None:
    """Held until ``conn``'s transaction ends."""
    if conn.dialect.name != "postgresql":
        return
    function = "pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared"
    conn.execute(text(f"SELECT {function}(:key)"), {"key": tenant_lock_key(tenant)})
