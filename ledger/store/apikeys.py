"""API keys: ``alk_<key id>_<secret>``, stored as SHA-256 of the secret, compared in
constant time. Each key is bound to one tenant and one role.

An admin key reads only its own tenant unless it was created for all tenants; that
scope is stored in the role column as ``admin:all`` (no schema change, see
docs/decisions/0011-serving-errors-and-scopes.md), and read back as role ``admin`` with
``all_tenants`` set.

A server keeps every key in memory, reloaded from the database every ``cache_ttl_s`` by
a background thread (``start_refresh``), so authenticating a request never queries on
the event loop. A key revoked or created by another process takes effect within the TTL;
one revoked or created through this store takes effect at once.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, insert, select, update
from sqlalchemy.exc import SQLAlchemyError

from ledger.errors import BackendUnavailableError, InvalidInputError
from ledger.leaves.fields import check_tenant_name
from ledger.store.schema import api_keys

log = logging.getLogger(__name__)
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
    def __init__(self, engine: Engine, cache_ttl_s: float | None = None) -> None:
        self.engine = engine
        self.cache_ttl_s = cache_ttl_s
        # key id -> (secret hash, key); None until the first load (then no cache is used)
        self._cache: dict[str, tuple[bytes, ApiKey]] | None = None
        self._cache_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the in-memory copy -----------------------------------------------------------

    def refresh(self) -> None:
        """Reload every key from the database (blocking)."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(api_keys)).all()
        loaded = {r.key_id: (bytes(r.secret_hash), _key(r)) for r in rows}
        with self._cache_lock:
            self._cache = loaded

    def start_refresh(self) -> ApiKeyStore:
        """Load now, then reload every ``cache_ttl_s`` on a daemon thread."""
        if self.cache_ttl_s is None:
            raise ValueError("start_refresh needs cache_ttl_s")
        self.refresh()
        self._thread = threading.Thread(target=self._refresh_loop, name="api-key-cache",
                                        daemon=True)
        self._thread.start()
        return self

    def stop_refresh(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _refresh_loop(self) -> None:
        assert self.cache_ttl_s is not None
        while not self._stop.wait(self.cache_ttl_s):
            try:
                self.refresh()
            except Exception:  # the database is away: keep the keys we know
                log.warning("could not reload API keys; keeping the last copy")

    def _remember(self, secret_hash: bytes | None, key: ApiKey) -> None:
        with self._cache_lock:
            if self._cache is None:
                return
            if secret_hash is None:
                known = self._cache.get(key.key_id)
                if known is None:
                    return
                secret_hash = known[0]
            self._cache = {**self._cache, key.key_id: (secret_hash, key)}

    def is_active(self, key_id: str) -> bool:
        """Whether the key exists and is not revoked, read from the database (not the
        cache): a console session lives only as long as its key."""
        with self.engine.connect() as conn:
            row = conn.execute(select(api_keys.c.revoked_at)
                               .where(api_keys.c.key_id == key_id)).first()
        return row is not None and row.revoked_at is None

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
        check_tenant_name(tenant, new_key=True)
        key_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
        now = datetime.now(UTC).replace(tzinfo=None)
        with self.engine.begin() as conn:
            conn.execute(insert(api_keys).values(key_id=key_id, secret_hash=_hash(secret),
                                                 tenant=tenant,
                                                 role=_ADMIN_ALL if all_tenants else role,
                                                 created_at=now))
        key = ApiKey(key_id, tenant, role, now, None, all_tenants)
        self._remember(_hash(secret), key)
        return f"{PREFIX}{key_id}_{secret}", key

    def authenticate(self, token: str) -> ApiKey | None:
        """The key for ``token``; from memory once the cache is loaded (no I/O)."""
        if not token.startswith(PREFIX) or token.count("_") < 2:
            return None
        key_id, _, secret = token[len(PREFIX):].partition("_")
        cache = self._cache
        if cache is not None:
            found = cache.get(key_id)
            expected, key = (found[0], found[1]) if found else (bytes(32), None)
        else:
            try:
                with self.engine.connect() as conn:
                    row = conn.execute(
                        select(api_keys).where(api_keys.c.key_id == key_id)).first()
            except SQLAlchemyError as exc:  # its text may name hosts and databases
                raise BackendUnavailableError("the API key store is unreachable") from exc
            expected = bytes(row.secret_hash) if row else bytes(32)
            key = _key(row) if row else None
        # Compare even when the id is unknown, so timing does not reveal which ids exist.
        if not hmac.compare_digest(_hash(secret), expected) or key is None:
            return None
        if key.revoked_at is not None:
            return None
        return key

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
        known = self._cache.get(key_id) if self._cache is not None else None
        if known is not None and result.rowcount:
            self._remember(None, replace(known[1], revoked_at=now))
        return bool(result.rowcount)
