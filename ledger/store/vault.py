"""The content vault: retained prompts and outputs, encrypted per record, per tenant.

- ``retain`` stores the content of records whose tenant keeps content (one transaction
  per batch), called by the service after the records are durable.
- ``read_audited`` appends an ``access-record/v1`` leaf, waits until it is durable, and
  only then decrypts and returns the content.
- ``erase`` (by records or by data subject) and ``expire`` (end of the retention period)
  append ``erasure-record/v2`` leaves (several for a large erasure, decision 0061),
  then, in one transaction under the tenant's lock, check the legal holds again, clear
  the erased rows (ciphertexts, wrapped keys, subject hash), turn the stored answers
  naming them into 410s and re-wrap the surviving data keys of the erased records' KEKs
  under a new KEK; after the commit those KEKs are destroyed in the key store, so no
  copy of the erased rows anywhere opens again
  (docs/decisions/0038-erasure-destroys-key-store-keys.md). The log and the mirror are
  never touched, so every proof still holds.
- Bounds the service enforces itself (decision 39): a retention period between the
  minimum and ``MAX_DAYS``, applied again when content is retained; an expiry time no
  later than now plus ``CLOCK_SKEW``; an erasure before the minimum retention only with
  a stated legal basis, which its leaf records.

Tables live in ``ledger.store.schema`` (migration 0006); nothing here writes the log or
the mirror except through the ledger's own append.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import Connection, bindparam, event, func, insert, select, text, update

from ledger.content_records import check_legal_basis
from ledger.errors import InvalidInputError
from ledger.leaves.content_leaves import build_access, build_erasure, erasure_parts
from ledger.leaves.envelope import Leaf
from ledger.leaves.fields import check_tenant_name
from ledger.record import new_record_id, utc_timestamp
from ledger.store.log_origin import stored_origin
from ledger.store.receipts import erased_answer, names_any
from ledger.store.schema import (
    legal_holds,
    receipts,
    records,
    retention_policies,
    vault_content,
)
from ledger.store.sql import make_engine
from ledger.store.tenant_lock import lock_tenant
from ledger.vault_crypto import (
    RECEIPT_FINGERPRINT_BYTES_0062,
    SUBJECT_FIELD,
    Content,
    KeyEncryptionKeys,
    SealedContent,
    open_content,
    open_subject,
    receipt_wrap_context,
    rewrap,
    rewrap_under,
    seal_content,
    subject_hash,
)
from ledger.vault_errors import (
    ContentErasedError,
    ContentIntegrityError,
    ContentNotRetainedError,
    KeyUnavailableError,
    LegalHoldError,
)

log = logging.getLogger("audit_ledger.vault")

MODES = ("commitments", "content")
EXPIRY_LOCK_KEY = 0x7661756C74  # "vault": shared by every replica
MAX_SUBJECT_CHARS = 256
MAX_DAYS = 36_525  # a retention period of at most 100 years
CLOCK_SKEW = timedelta(minutes=5)  # how far ahead of this clock ``expire`` may be asked
REKEY_BATCH = 500
CIPHERTEXT_COLUMNS = {"prompt": "prompt_ct", "output": "output_ct",
                      "input_salt": "input_salt_ct", "output_salt": "output_salt_ct"}


class Appender(Protocol):
    """The calls of an ``Appender`` (``ledger.store.log_api``) the vault makes: each
    returns once its leaves are durable; ``append_many`` commits them together."""

    def append(self, record: Leaf, timeout: float | None = 60.0) -> Any: ...

    def append_many(self, records: Sequence[Leaf], timeout: float | None = 60.0
                    ) -> list[Any]: ...


@dataclass(frozen=True)
class Policy:
    tenant: str
    mode: str  # commitments | content
    days: int | None
    explicit: bool  # False: the service's default applies

    def to_dict(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "mode": self.mode, "days": self.days,
                "explicit": self.explicit}


@dataclass(frozen=True)
class RetainItem:
    """What the serving path hands over for one durable record."""

    record_id: str
    leaf_hash: bytes
    tenant: str
    created_at: str  # the record's own RFC 3339 timestamp
    prompt: str
    output: str
    input_salt: bytes
    output_salt: bytes
    subject: str | None = None


@dataclass(frozen=True)
class VaultRow:
    record_id: str
    tenant: str
    leaf_hash: bytes
    created_at: datetime
    expires_at: datetime
    subject_hash: str | None
    kek_id: str | None
    erased_at: datetime | None
    erasure_record_id: str | None


@dataclass(frozen=True)
class Hold:
    hold_id: str
    tenant: str
    record_id: str | None
    reason: str
    created_at: datetime
    released_at: datetime | None

    @property
    def scope(self) -> str:
        return f"record {self.record_id}" if self.record_id else f"tenant {self.tenant}"

    def to_dict(self) -> dict[str, Any]:
        return {"hold_id": self.hold_id, "tenant": self.tenant, "record_id": self.record_id,
                "reason": self.reason, "created_at": _iso(self.created_at),
                "released_at": _iso(self.released_at)}


@dataclass(frozen=True)
class Erasure:
    """One erasure: the leaves that announced it and the records whose keys were destroyed.

    A large erasure is announced in several leaves (``erasure_parts``); the first is
    ``erasure_record_id`` / ``leaf_index``, all of them ``erasure_record_ids`` /
    ``leaf_indexes`` in the same order."""

    tenant: str
    records: list[str]
    erasure_record_id: str | None  # None when there was nothing to erase
    leaf_index: int | None
    erased_at: datetime | None
    erasure_record_ids: tuple[str, ...] = ()
    leaf_indexes: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "records": self.records,
                "erasure_record_id": self.erasure_record_id, "leaf_index": self.leaf_index,
                "erasure_record_ids": list(self.erasure_record_ids),
                "leaf_indexes": list(self.leaf_indexes),
                "erased_at": _iso(self.erased_at)}


@dataclass(frozen=True)
class Accessor:
    """Who reads: an API key (id, role, its tenant) or a local operator."""

    key_id: str
    role: str
    tenant: str


@dataclass(frozen=True)
class AccessResult:
    row: VaultRow
    content: Content
    access_record_id: str
    access_leaf_index: int


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat(timespec="milliseconds") + "Z"


def _utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def _naive(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(tzinfo=None) if moment.tzinfo else moment


def _parse_created(text: str) -> datetime:
    return _naive(datetime.fromisoformat(text.replace("Z", "+00:00")))


class ContentVault:
    """Retained content over the ledger's database; key-encryption keys from ``keks``."""

    def __init__(self, url: str, keks: KeyEncryptionKeys, *, default_mode: str = "commitments",
                 default_days: int = 183, minimum_days: int = 183,
                 policy_cache_s: float = 2.0,
                 clock: Callable[[], datetime] = _utcnow, origin: str | None = None
                 ) -> None:
        if default_mode not in MODES:
            raise InvalidInputError("retention_default_mode", f"must be one of {MODES}")
        if default_days < minimum_days:
            raise InvalidInputError("retention_default_days",
                                    f"must be at least the minimum of {minimum_days} days")
        self.keks = keks
        self.default_mode = default_mode
        self.default_days = default_days
        self.minimum_days = minimum_days
        self.policy_cache_s = policy_cache_s
        self.clock = clock
        self._origin = origin  # the log's, for the tenant tags of access and erasure leaves
        self.engine = make_engine(url)
        # Writes take SQLite's write lock up front (read-then-write would deadlock).
        self._writer = make_engine(url, writer=True) if url.startswith("sqlite") else self.engine
        if url.startswith("sqlite"):
            for engine in {self.engine, self._writer}:
                # Freed pages (erased ciphertexts, destroyed keys) are overwritten with zeros.
                event.listen(engine, "connect", _secure_delete)
        self._policies: dict[str, tuple[float, Policy]] = {}
        self._policy_changes = 0  # bumped by set_policy: a read begun before is not cached
        self._lock = threading.Lock()
        # The tenants whose expiry failed in the last run (name -> error class): the
        # other tenants still expire, and this says the run was not whole.
        self.expiry_failures: dict[str, str] = {}

    def close(self) -> None:
        self.engine.dispose()
        if self._writer is not self.engine:
            self._writer.dispose()

    # --- policies ---------------------------------------------------------------------

    def policy(self, tenant: str) -> Policy:
        """The tenant's policy; cached for ``policy_cache_s`` (it is read per record)."""
        now = time.monotonic()
        with self._lock:
            cached = self._policies.get(tenant)
            changes = self._policy_changes
        if cached is not None and now - cached[0] < self.policy_cache_s:
            return cached[1]
        with self.engine.connect() as conn:
            row = conn.execute(select(retention_policies)
                               .where(retention_policies.c.tenant == tenant)).first()
        policy = (Policy(tenant, row.mode, self._bounded(row.mode, row.days), True)
                  if row is not None else
                  Policy(tenant, self.default_mode,
                         self.default_days if self.default_mode == "content" else None, False))
        with self._lock:
            # A set_policy that committed after this read began would be hidden for a
            # whole cache period by what the read saw: answer it, never cache it.
            if self._policy_changes == changes:
                self._policies[tenant] = (now, policy)
        return policy

    def _bounded(self, mode: str, days: int | None) -> int | None:
        """A stored period as this service applies it: never below its own minimum (a
        tool run with a lower minimum may have written it), never beyond ``MAX_DAYS``."""
        if mode != "content":
            return None
        return min(max(days or 0, self.minimum_days), MAX_DAYS)

    def may_keep_content(self, tenants: Iterable[str]) -> bool:
        """False only when every tenant's cached policy is fresh and keeps no content.

        Memory only (never SQL): the batcher asks it on the event loop to skip handing a
        batch to ``retain`` when there is nothing to keep. A stale or missing entry
        answers True, and ``retain`` then reads the policy afresh.
        """
        now = time.monotonic()
        with self._lock:
            for tenant in tenants:
                cached = self._policies.get(tenant)
                if (cached is None or not now - cached[0] < self.policy_cache_s
                        or cached[1].mode == "content"):
                    return True
        return False

    def set_policy(self, tenant: str, mode: str, days: int | None = None) -> Policy:
        _check_tenant(tenant)
        if mode not in MODES:
            raise InvalidInputError("mode", f"must be one of {', '.join(MODES)}")
        if mode == "content":
            days = self.default_days if days is None else days
            if not isinstance(days, int) or isinstance(days, bool):
                raise InvalidInputError("days", "must be a whole number of days")
            if days < self.minimum_days:
                raise InvalidInputError("days", f"{days} is below the minimum retention of "
                                        f"{self.minimum_days} days")
            if days > MAX_DAYS:
                raise InvalidInputError("days", f"{days} is beyond the longest retention of "
                                        f"{MAX_DAYS} days")
        elif days is not None:
            raise InvalidInputError("days", "applies only to mode content")
        now = self.clock()
        with self._writer.begin() as conn:
            found = conn.execute(select(retention_policies.c.tenant)
                                 .where(retention_policies.c.tenant == tenant)).first()
            values = {"mode": mode, "days": days, "updated_at": now}
            if found is None:
                conn.execute(insert(retention_policies).values(tenant=tenant, **values))
            else:
                conn.execute(update(retention_policies)
                             .where(retention_policies.c.tenant == tenant).values(**values))
        with self._lock:
            self._policies.pop(tenant, None)
            self._policy_changes += 1
        return Policy(tenant, mode, days, True)

    def policies(self) -> list[Policy]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(retention_policies).order_by(retention_policies.c.tenant))
            return [Policy(r.tenant, r.mode, r.days, True) for r in rows]

    # --- retaining --------------------------------------------------------------------

    def retain(self, items: Sequence[RetainItem]) -> int:
        """Encrypt and store the content of every item whose tenant keeps content; one
        transaction for all. Returns how many were stored."""
        kept: list[tuple[RetainItem, int]] = []
        for item in items:
            policy = self.policy(item.tenant)
            if policy.mode == "content":
                kept.append((item, min(max(policy.days or 0, self.minimum_days), MAX_DAYS)))
        if not kept:
            return 0
        with self._writer.begin() as conn:
            # Wrapped under the tenant lock: an erasure replacing a KEK waits for this
            # insert, or this wrap sees the KEK that replaced it.
            for tenant in sorted({item.tenant for item, _ in kept}):
                lock_tenant(conn, tenant, exclusive=False)
            rows = [self._sealed_row(item, days) for item, days in kept]
            conn.execute(insert(vault_content), rows)
        return len(rows)

    def _sealed_row(self, item: RetainItem, days: int) -> dict[str, Any]:
        sealed = seal_content(self.keks, item.tenant, item.record_id, item.leaf_hash,
                              Content(item.prompt, item.output, item.input_salt,
                                      item.output_salt), subject=item.subject)
        created = _parse_created(item.created_at)
        return {
            "record_id": item.record_id, "tenant": item.tenant,
            "leaf_hash": item.leaf_hash, "created_at": created,
            "expires_at": created + timedelta(days=days),
            "subject_hash": self.subject_hash(item.tenant, item.subject)
            if item.subject is not None else None,
            "subject_ct": sealed.ciphertexts.get(SUBJECT_FIELD),
            "kek_id": sealed.kek_id, "wrapped_key": sealed.wrapped_key,
            **{column: sealed.ciphertexts[name]
               for name, column in CIPHERTEXT_COLUMNS.items()},
        }

    def subject_hash(self, tenant: str, subject: str) -> str:
        return subject_hash(self.keks.subject_key(tenant), check_subject(subject))

    # --- reading ----------------------------------------------------------------------

    def state(self, record_id: str) -> VaultRow | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(vault_content)
                               .where(vault_content.c.record_id == record_id)).first()
        return _vault_row(row) if row is not None else None

    def rows(self, tenant: str, subject: str | None = None) -> list[VaultRow]:
        statement = select(vault_content).where(vault_content.c.tenant == tenant)
        if subject is not None:
            # Every subject key a stored hash may use (the old ones until a rotation ends).
            hashes = [subject_hash(key, check_subject(subject))
                      for key in self.keks.subject_keys(tenant)]
            statement = statement.where(vault_content.c.subject_hash.in_(hashes))
        with self.engine.connect() as conn:
            return [_vault_row(r) for r in
                    conn.execute(statement.order_by(vault_content.c.created_at))]

    def readable(self, record_id: str) -> VaultRow:
        """The row, if its content can be read; raises not-retained or erased."""
        row = self.state(record_id)
        if row is None:
            raise ContentNotRetainedError(record_id)
        if row.erased_at is not None:
            raise ContentErasedError(record_id, _iso(row.erased_at) or "",
                                     row.erasure_record_id)
        return row

    def decrypt(self, record_id: str) -> tuple[VaultRow, Content]:
        """Decrypt without logging; only ``read_audited`` and tests call it."""
        with self.engine.connect() as conn:
            raw = conn.execute(select(vault_content)
                               .where(vault_content.c.record_id == record_id)).first()
        if raw is None:
            raise ContentNotRetainedError(record_id)
        row = _vault_row(raw)
        if row.erased_at is not None or raw.wrapped_key is None:
            raise ContentErasedError(record_id, _iso(row.erased_at) or "",
                                     row.erasure_record_id)
        sealed = SealedContent(str(row.kek_id), bytes(raw.wrapped_key), {
            name: bytes(getattr(raw, column))
            for name, column in CIPHERTEXT_COLUMNS.items() if getattr(raw, column) is not None})
        return row, open_content(self.keks, row.tenant, row.record_id, row.leaf_hash, sealed)

    def origin(self) -> str:
        """The log's origin (given, or read once from the log's own database)."""
        if self._origin is None:
            with self.engine.connect() as conn:
                self._origin = stored_origin(conn)
        return self._origin

    def access_record(self, row: VaultRow, accessor: Accessor, purpose: str,
                      channel: str) -> Leaf:
        """The ``access-record/v2`` leaf of one read (decision 0043)."""
        return build_access(
            origin=self.origin(), leaf_id=new_record_id(), created_at=utc_timestamp(),
            record_id=row.record_id, record_tenant=row.tenant, key_id=accessor.key_id,
            role=accessor.role, key_tenant=accessor.tenant, purpose=purpose,
            channel=channel)

    def read_audited(self, ledger: Appender, record_id: str, accessor: Accessor,
                     purpose: str, channel: str) -> AccessResult:
        """Log the access durably first, then decrypt: no read without its leaf."""
        row = self.readable(record_id)
        leaf = self.access_record(row, accessor, purpose, channel)
        receipt = ledger.append(leaf)
        row, content = self.decrypt(record_id)
        return AccessResult(row, content, leaf.record_id, int(receipt.leaf_index))

    # --- legal holds ------------------------------------------------------------------

    def hold(self, tenant: str, reason: str, record_id: str | None = None) -> Hold:
        """A legal hold on one retained record of ``tenant``, or on the whole tenant (one
        this service knows: with a policy, retained content or records)."""
        _check_tenant(tenant)
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidInputError("reason", "a legal hold needs a reason")
        if record_id is not None and (not isinstance(record_id, str)
                                      or not 1 <= len(record_id) <= 64):
            raise InvalidInputError("record_id", "must be 1 to 64 characters")
        hold = Hold("hold-" + secrets.token_hex(6), tenant, record_id, reason.strip(),
                    self.clock(), None)
        with self._writer.begin() as conn:
            # Ordered with erasures: one that has not checked the holds yet sees this one.
            lock_tenant(conn, tenant, exclusive=False)
            if record_id is not None:
                owner = conn.execute(select(vault_content.c.tenant).where(
                    vault_content.c.record_id == record_id)).scalar()
                if owner != tenant:  # unknown, or another tenant's: say the same
                    raise InvalidInputError("record_id", f"tenant {tenant} has no retained "
                                            f"record {record_id}")
            elif not _tenant_known(conn, tenant):
                raise InvalidInputError("tenant", f"no tenant {tenant} is known here (no "
                                        "policy, retained content or records)")
            conn.execute(insert(legal_holds).values(
                hold_id=hold.hold_id, tenant=tenant, record_id=record_id, reason=hold.reason,
                created_at=hold.created_at))
        return hold

    def release(self, hold_id: str) -> Hold:
        with self._writer.begin() as conn:
            row = conn.execute(select(legal_holds)
                               .where(legal_holds.c.hold_id == hold_id)).first()
            if row is None or row.released_at is not None:
                raise InvalidInputError("hold_id", f"no active legal hold {hold_id}")
            now = self.clock()
            conn.execute(update(legal_holds).where(legal_holds.c.hold_id == hold_id)
                         .values(released_at=now))
        return Hold(row.hold_id, row.tenant, row.record_id, row.reason, row.created_at, now)

    def holds(self, tenant: str | None = None, active: bool = True) -> list[Hold]:
        with self.engine.connect() as conn:
            return _holds(conn, tenant, active)

    def _blocking_hold(self, tenant: str, record_ids: Sequence[str],
                       conn: Connection | None = None) -> Hold | None:
        if conn is None:
            with self.engine.connect() as fresh:
                return self._blocking_hold(tenant, record_ids, fresh)
        for hold in _holds(conn, tenant, True):
            if hold.record_id is None or hold.record_id in record_ids:
                return hold
        return None

    # --- erasure ---------------------------------------------------------------------

    def erase(self, ledger: Appender, tenant: str, *, record_ids: Sequence[str] = (),
              subject: str | None = None, requested_by: str,
              legal_basis: str | None = None) -> Erasure:
        """Crypto-shred records of one tenant, by id or by data subject.

        A record still inside the minimum retention is erased only with a stated
        ``legal_basis``, which the erasure leaf records (decision 39).
        """
        _check_tenant(tenant)
        legal_basis = check_legal_basis(legal_basis)
        if bool(record_ids) == (subject is not None):
            raise InvalidInputError("selector", "give either record ids or a subject")
        if subject is not None:
            targets = [r for r in self.rows(tenant, subject) if r.erased_at is None]
            selector = "subject"
        else:
            targets = []
            for record_id in dict.fromkeys(record_ids):
                row = self.state(record_id)
                if row is None or row.tenant != tenant:
                    raise ContentNotRetainedError(record_id)
                if row.erased_at is None:
                    targets.append(row)
            selector = "records"
        now = self.clock()
        early = [r.record_id for r in targets
                 if r.created_at + timedelta(days=self.minimum_days) > now]
        if early and legal_basis is None:
            raise InvalidInputError(
                "legal_basis", f"record {early[0]} (and {len(early) - 1} more) is inside the "
                f"minimum retention of {self.minimum_days} days: state the legal basis of "
                "erasing it now")
        return self._shred(ledger, tenant, [r.record_id for r in targets], selector,
                           "request", requested_by, legal_basis if early else None)

    def expire(self, ledger: Appender, now: datetime | None = None) -> tuple[list[Erasure],
                                                                          list[Hold]]:
        """Erase every record whose retention period has ended, unless held.

        ``now`` may be earlier than this clock, never later than it by more than
        ``CLOCK_SKEW`` (a time in the future would erase what is still to be kept).
        Returns the erasures (one per tenant) and the holds that kept records past their end.
        A tenant whose erasure fails is left for the next run and named, with the error's
        class, in ``expiry_failures``; the other tenants still expire.
        """
        current = self.clock()
        moment = _naive(now) if now is not None else current
        if moment > current + CLOCK_SKEW:
            raise InvalidInputError("now", f"{_iso(moment)} is later than this clock "
                                    f"({_iso(current)}) by more than {CLOCK_SKEW}")
        if self.engine.dialect.name != "postgresql":
            return self._expire(ledger, moment)
        # Replicas sharing one database: one expires at a time, the others skip this run
        # (each would otherwise log its own erasure leaf for the same records).
        with self.engine.connect() as lock:
            if not lock.execute(text("SELECT pg_try_advisory_lock(:k)"),
                                {"k": EXPIRY_LOCK_KEY}).scalar():
                return [], []
            try:
                return self._expire(ledger, moment)
            finally:
                lock.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": EXPIRY_LOCK_KEY})
                lock.commit()

    def _expire(self, ledger: Appender, moment: datetime) -> tuple[list[Erasure], list[Hold]]:
        with self.engine.connect() as conn:
            due = conn.execute(
                select(vault_content.c.record_id, vault_content.c.tenant)
                .where(vault_content.c.expires_at <= moment, vault_content.c.erased_at.is_(None))
                .order_by(vault_content.c.tenant, vault_content.c.record_id)).all()
        by_tenant: dict[str, list[str]] = {}
        for record_id, tenant in due:
            by_tenant.setdefault(tenant, []).append(record_id)
        erasures: list[Erasure] = []
        kept_by: list[Hold] = []
        failures: dict[str, str] = {}
        for tenant, ids in by_tenant.items():
            try:
                erasure = self._expire_tenant(ledger, tenant, ids, kept_by)
            except Exception as exc:  # one tenant's failure must not stop the others
                # The class only: a message may quote a tenant's name or record ids.
                log.error("retention expiry of one tenant failed: %s", type(exc).__name__)
                failures[tenant] = type(exc).__name__
                continue
            if erasure is not None:
                erasures.append(erasure)
        self.expiry_failures = failures
        return erasures, kept_by

    def _expire_tenant(self, ledger: Appender, tenant: str, ids: list[str],
                       kept_by: list[Hold]) -> Erasure | None:
        """Erase one tenant's due records ``ids`` but the held ones (their holds are
        added to ``kept_by``); None when all are held."""
        holds = self.holds(tenant)
        if any(h.record_id is None for h in holds):
            kept_by.extend(h for h in holds if h.record_id is None)
            return None
        held = {h.record_id for h in holds}
        kept_by.extend(h for h in holds if h.record_id in ids)
        free = [i for i in ids if i not in held]
        if not free:
            return None
        try:
            return self._shred(ledger, tenant, free, "expiry", "expiry", "retention-expiry")
        except LegalHoldError:  # placed while this erasure was being logged
            return None

    def _shred(self, ledger: Appender, tenant: str, record_ids: list[str], selector: str,
               reason: str, requested_by: str, legal_basis: str | None = None) -> Erasure:
        if not record_ids:
            return Erasure(tenant, [], None, None, None)
        hold = self._blocking_hold(tenant, record_ids)
        if hold is not None:  # refused before anything is logged
            raise LegalHoldError(hold.hold_id, hold.scope, hold.reason)
        # The leaves first: an erasure that happened is never missing from the log. If the
        # shredding below fails, running the erasure again finishes it (with new leaves).
        # A large erasure takes several leaves, so each body fits a tile bundle (0061).
        origin = self.origin()
        parts = [(build_erasure(
            origin=origin, leaf_id=new_record_id(), created_at=utc_timestamp(),
            tenant=tenant, records=part, reason=reason, selector=selector,
            requested_by=requested_by, legal_basis=legal_basis), part)
            for part in erasure_parts(record_ids)]
        # All parts in one transaction: a crash logs the whole erasure or none of it.
        receipts = _appended(ledger, [leaf for leaf, _ in parts])
        erased_at = self.clock()
        with self._writer.begin() as conn:
            lock_tenant(conn, tenant, exclusive=True)
            # Checked again where it acts: a hold placed while the leaves were being logged.
            hold = self._blocking_hold(tenant, record_ids, conn)
            doomed = [] if hold is not None else self._erase_rows(
                conn, tenant, [(leaf.record_id, part) for leaf, part in parts], erased_at)
        if hold is not None:
            _appended(ledger, [build_erasure(
                origin=origin, leaf_id=new_record_id(), created_at=utc_timestamp(),
                tenant=tenant, records=part, reason="cancelled", selector=selector,
                requested_by=f"hold:{hold.hold_id}", cancels=leaf.record_id)
                for leaf, part in parts])
            raise LegalHoldError(hold.hold_id, hold.scope, hold.reason)
        # Committed: the old KEKs hold only erased keys now. Destroying them makes every
        # copy of those keys (WAL frames, old pages, backups) unopenable. A crash before
        # this line leaves them marked doomed; the tenant's next erasure destroys them.
        self.keks.destroy(tenant, doomed)
        ids = tuple(leaf.record_id for leaf, _ in parts)
        indexes = tuple(int(r.leaf_index) for r in receipts)
        return Erasure(tenant, sorted(set(record_ids)), ids[0], indexes[0], erased_at,
                       ids, indexes)

    def _erase_rows(self, conn: Connection, tenant: str,
                    parts: list[tuple[str, list[str]]], erased_at: datetime) -> list[str]:
        """In the erasure's transaction: clear the rows (each names the leaf of its
        ``(erasure_record_id, record_ids)`` part), answer their stored answers with 410,
        re-key the survivors once. Returns the KEKs to destroy once committed."""
        kek_ids: set[str] = set()
        for erasure_record_id, record_ids in parts:
            live = conn.execute(select(vault_content.c.record_id, vault_content.c.kek_id)
                                .where(vault_content.c.tenant == tenant,
                                       vault_content.c.record_id.in_(record_ids),
                                       vault_content.c.erased_at.is_(None))).all()
            kek_ids.update(str(k) for _, k in live if k is not None)
            conn.execute(
                update(vault_content)
                .where(vault_content.c.tenant == tenant,
                       vault_content.c.record_id.in_(record_ids),
                       vault_content.c.erased_at.is_(None))
                .values(wrapped_key=None, prompt_ct=None, output_ct=None, input_salt_ct=None,
                        output_salt_ct=None, subject_ct=None, subject_hash=None,
                        erased_at=erased_at, erasure_record_id=erasure_record_id))
            # Idempotency-Key answers naming these records (stored before or while this
            # erasure ran) become 410s: the key stays bound to its record, nothing replays.
            # Their fingerprints go too: a 410 to any body tells no body apart (0062).
            # Their own keys' KEKs are destroyed with the content's, so a copy of the row
            # from before (a backup) cannot test a guessed body even with the key store
            # (0068): the other keys under those KEKs are re-wrapped first (``_rekey``).
            # A receipt still pending names no record yet, and may be one of these
            # records' (its answer turns 410 when completed): its KEK goes too, so a
            # backup of it from before cannot be tested either.
            kek_ids.update(str(k) for (k,) in conn.execute(
                select(receipts.c.kek_id).where(
                    receipts.c.tenant == tenant, receipts.c.kek_id.is_not(None),
                    names_any(record_ids) | (receipts.c.state == "pending"))).all())
            for record_id in record_ids:
                conn.execute(update(receipts).where(
                    receipts.c.tenant == tenant, names_any([record_id]))
                    .values(state="done", response=json.dumps(erased_answer(
                        record_id, erased_at, erasure_record_id)),
                        response_ct=None, wrapped_key=None, kek_id=None, fingerprint=None))
        return self._rekey(conn, tenant, kek_ids)

    def _rekey(self, conn: Connection, tenant: str, kek_ids: set[str],
               batch: int = REKEY_BATCH) -> list[str]:
        """Re-wrap every live key under ``kek_ids`` (and KEKs a crashed erasure left
        doomed) under one new KEK; returns the KEKs to destroy after the commit."""
        doomed = set(kek_ids) | set(self.keks.doomed(tenant))
        if not doomed:
            return []
        new_id = self.keks.replace(tenant, doomed)
        while True:
            rows = conn.execute(
                select(vault_content.c.record_id, vault_content.c.kek_id,
                       vault_content.c.wrapped_key)
                .where(vault_content.c.tenant == tenant,
                       vault_content.c.kek_id.in_(doomed),
                       vault_content.c.wrapped_key.is_not(None))
                .limit(batch)).all()
            if not rows:
                break
            conn.execute(
                update(vault_content)
                .where(vault_content.c.record_id == bindparam("rid"))
                .values(kek_id=bindparam("kek"), wrapped_key=bindparam("wrapped")),
                [dict(zip(("kek", "wrapped"), rewrap(self.keks, tenant, record_id,
                                                      str(kek_id), bytes(wrapped), new_id),
                          strict=True), rid=record_id)
                 for record_id, kek_id, wrapped in rows])
        answers = conn.execute(
            select(receipts.c.idempotency_key, receipts.c.kek_id, receipts.c.wrapped_key)
            .where(receipts.c.tenant == tenant, receipts.c.kek_id.in_(doomed),
                   receipts.c.wrapped_key.is_not(None))).all()
        rewrapped, unopenable = [], []
        for key, kek_id, wrapped in answers:
            try:
                kek, rewrapped_key = rewrap_under(
                    self.keks, tenant, receipt_wrap_context(tenant, key), key, str(kek_id),
                    bytes(wrapped), new_id)
            except (ContentIntegrityError, KeyUnavailableError):
                # A receipt whose key opens no more (restored from a backup, or altered)
                # can be compared and answered with nothing: it loses key and fingerprint
                # rather than stopping the erasure (0070).
                unopenable.append(key)
                continue
            rewrapped.append({"kek": kek, "wrapped": rewrapped_key, "key": key})
        if rewrapped:
            conn.execute(
                update(receipts)
                .where(receipts.c.tenant == tenant,
                       receipts.c.idempotency_key == bindparam("key"))
                .values(kek_id=bindparam("kek"), wrapped_key=bindparam("wrapped")),
                rewrapped)
        if unopenable:
            conn.execute(update(receipts).where(
                receipts.c.tenant == tenant, receipts.c.idempotency_key.in_(unopenable))
                .values(kek_id=None, wrapped_key=None, fingerprint=None))
        return sorted(doomed)

    # --- key rotation -----------------------------------------------------------------

    def rotate(self, tenant: str, batch: int = REKEY_BATCH) -> tuple[str, int, list[str]]:
        """New KEK for ``tenant``; re-wrap every live data key and stored answer under it;
        destroy the old KEKs. Then a new subject key: every live row's subject hash is
        recomputed from its encrypted subject id, and the old subject keys are destroyed
        (unless rows retained before migration 0011 still need one).

        Ciphertexts are not touched. Returns (new KEK id, keys re-wrapped, destroyed ids).
        """
        _check_tenant(tenant)
        with self._writer.begin() as conn:
            lock_tenant(conn, tenant, exclusive=True)
            used = set(conn.execute(
                select(vault_content.c.kek_id).distinct()
                .where(vault_content.c.tenant == tenant,
                       vault_content.c.wrapped_key.is_not(None))).scalars())
            used |= set(conn.execute(
                select(receipts.c.kek_id).distinct()
                .where(receipts.c.tenant == tenant,
                       receipts.c.wrapped_key.is_not(None))).scalars())
            count = int(conn.execute(
                select(func.count()).select_from(vault_content)
                .where(vault_content.c.tenant == tenant,
                       vault_content.c.wrapped_key.is_not(None))).scalar() or 0)
            doomed = self._rekey(conn, tenant, {str(k) for k in used if k is not None}
                                 | {self.keks.current_kek_id(tenant)}, batch)
        destroyed = self.keks.destroy(tenant, doomed)
        self.rotate_subject_key(tenant)
        return self.keks.current_kek_id(tenant), count, destroyed

    def rotate_subject_key(self, tenant: str) -> int:
        """New subject key; re-hash every live row's subject; destroy the old keys. Returns
        how many rows still hash under an old key (retained before subject ids were kept
        encrypted): their key is kept until they expire or are erased."""
        _check_tenant(tenant)
        key = self.keks.rotate_subject_key(tenant)
        with self._writer.begin() as conn:
            lock_tenant(conn, tenant, exclusive=True)
            rows = conn.execute(
                select(vault_content.c.record_id, vault_content.c.leaf_hash,
                       vault_content.c.kek_id, vault_content.c.wrapped_key,
                       vault_content.c.subject_ct)
                .where(vault_content.c.tenant == tenant,
                       vault_content.c.subject_hash.is_not(None),
                       vault_content.c.erased_at.is_(None))).all()
            rehashed = [{"rid": r.record_id, "hash": subject_hash(key, open_subject(
                self.keks, tenant, r.record_id, bytes(r.leaf_hash), str(r.kek_id),
                bytes(r.wrapped_key), bytes(r.subject_ct)))}
                for r in rows if r.subject_ct is not None and r.wrapped_key is not None]
            if rehashed:
                conn.execute(update(vault_content)
                             .where(vault_content.c.record_id == bindparam("rid"))
                             .values(subject_hash=bindparam("hash")), rehashed)
            # Fingerprints claimed before 0068 are MACs under the old key, which is
            # destroyed below: they go (0062). Later ones are under each receipt's own key.
            conn.execute(update(receipts).where(
                receipts.c.tenant == tenant,
                func.length(receipts.c.fingerprint) == RECEIPT_FINGERPRINT_BYTES_0062)
                .values(fingerprint=None))
        legacy = len(rows) - len(rehashed)
        if not legacy:
            self.keks.retire_subject_keys(tenant)
        return legacy


def _secure_delete(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA secure_delete=ON")
    cursor.close()


def _check_tenant(tenant: str) -> None:
    check_tenant_name(tenant)


def check_subject(subject: Any) -> str:
    """A data-subject id: 1 to 256 characters of text."""
    if not isinstance(subject, str) or not 1 <= len(subject) <= MAX_SUBJECT_CHARS:
        raise InvalidInputError("subject", f"must be 1 to {MAX_SUBJECT_CHARS} characters")
    try:
        subject.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError("subject", "must be valid Unicode text") from exc
    return subject


def _vault_row(row: Any) -> VaultRow:
    return VaultRow(row.record_id, row.tenant, bytes(row.leaf_hash), row.created_at,
                    row.expires_at, row.subject_hash, row.kek_id, row.erased_at,
                    row.erasure_record_id)


def _holds(conn: Connection, tenant: str | None, active: bool) -> list[Hold]:
    statement = select(legal_holds).order_by(legal_holds.c.created_at)
    if tenant is not None:
        statement = statement.where(legal_holds.c.tenant == tenant)
    if active:
        statement = statement.where(legal_holds.c.released_at.is_(None))
    return [Hold(r.hold_id, r.tenant, r.record_id, r.reason, r.created_at, r.released_at)
            for r in conn.execute(statement)]


def _tenant_known(conn: Connection, tenant: str) -> bool:
    for table in (retention_policies, vault_content, records):
        if conn.execute(select(table.c.tenant).where(table.c.tenant == tenant)
                        .limit(1)).first() is not None:
            return True
    return False


def _appended(ledger: Appender, leaves: list[Leaf]) -> list[Any]:
    """The receipts of ``leaves`` appended together; the first leaf's own error, if one
    was refused (the others may be logged: running the erasure again logs it anew)."""
    outcomes = ledger.append_many(leaves)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return outcomes
