"""API keys: ``alk_<key id>_<secret>``, stored as SHA-256 of the secret, compared in
constant time. Each key is bound to one tenant and one role.

An admin key reads only its own tenant unless it was created for all tenants; that
scope is stored in the role column as ``admin:all`` (no schema change, see
docs/decisions/0011-serving-errors-and-scopes.md), and read back as role ``admin`` with
``all_tenants`` set.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, insert, select, update
from sqlalchemy.exc import SQLAlchemyError

from ledger.errors import BackendUnavailableError, InvalidInputError
from ledger.store.schema import api_keys

ROLES = ("client", "auditor", "admin")
PREFIX = "alk_"
_ADMIN_ALL = "admin:all"  # the stored role of an admin key for every tenant


@dataclass(frozen=True)
class ApiKey:
    key_id: str
    tenant: str
    role: str
    created_at: datetime
    revoked_at: datetime | None
    all_tenants: bool = False  # an admin key that reads every tenant


def _key(row: Any) -> ApiKey:
    role, all_tenants = ("admin", True) if row.role == _ADMIN_ALL else (row.role, False)
    return ApiKey(row.key_id, row.tenant, role, row.created_at, row.revoked_at, all_tenants)


def _hash(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


class ApiKeyStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def create(self, tenant: str, role: str, *, all_tenants: bool = False
               ) -> tuple[str, ApiKey]:
        """Create a key; the full token is returned once and never stored.

        ``all_tenants`` (admin only) lets the key read every tenant's records.
        """
        if role not in ROLES:
            raise InvalidInputError("role", f"must be one of {', '.join(ROLES)}")
        if all_tenants and role != "admin":
            raise InvalidInputError("all_tenants", "only an admin key can be created for all "
                                    "tenants (an auditor key always reads every tenant)")
        if not tenant or len(tenant) > 128:
            raise InvalidInputError("tenant", "must be 1 to 128 characters")
        key_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
        now = datetime.now(UTC).replace(tzinfo=None)
        with self.engine.begin() as conn:
            conn.execute(insert(api_keys).values(key_id=key_id, secret_hash=_hash(secret),
                                                 tenant=tenant,
                                                 role=_ADMIN_ALL if all_tenants else role,
                                                 created_at=now))
        return (f"{PREFIX}{key_id}_{secret}",
                ApiKey(key_id, tenant, role, now, None, all_tenants))

    def authenticate(self, token: str) -> ApiKey | None:
        if not token.startswith(PREFIX) or token.count("_") < 2:
            return None
        key_id, _, secret = token[len(PREFIX):].partition("_")
        try:
            with self.engine.connect() as conn:
                row = conn.execute(select(api_keys).where(api_keys.c.key_id == key_id)).first()
        except SQLAlchemyError as exc:  # its text may name hosts and databases: not shown
            raise BackendUnavailableError("the API key store is unreachable") from exc
        # Compare even when the id is unknown, so timing does not reveal which ids exist.
        expected = bytes(row.secret_hash) if row else bytes(32)
        if not hmac.compare_digest(_hash(secret), expected) or row is None:
            return None
        if row.revoked_at is not None:
            return None
        return _key(row)

    def list(self) -> list[ApiKey]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(api_keys).order_by(api_keys.c.created_at))
            return [_key(r) for r in rows]

    def revoke(self, key_id: str) -> bool:
        now = datetime.now(UTC).replace(tzinfo=None)
        with self.engine.begin() as conn:
            result = conn.execute(update(api_keys).where(api_keys.c.key_id == key_id,
                                                         api_keys.c.revoked_at.is_(None))
                                  .values(revoked_at=now))
        return bool(result.rowcount)
