"""The receipts store: answers to requests sent with an ``Idempotency-Key``.

One row per (tenant, key). A request claims its key (state ``pending``) before it
generates; when its record commits, the whole answer, salts included, is stored (state
``done``) whether or not the caller is still listening. A retry with the same key and
body gets that answer; a different body is refused. Rows expire after a TTL and are
purged; this table is never part of the log or the mirror.

Each claim carries an owner token. Completing and releasing are compare-and-set on it: a
request whose stale claim was taken over by another one finds, when it finishes late,
that it no longer owns the key, and changes nothing.

With a key store (``keks``) a stored answer is encrypted under a fresh key wrapped by
the tenant's current KEK, and names its records in the clear (``record_ids``). An
erasure replaces the answers naming erased records with a 410 problem and destroys the
KEK, so no copy of the old answer (a WAL frame, a backup) opens again; an answer stored
while an erasure runs is ordered by the tenant lock and stored as that 410 if its record
was erased meanwhile.

The ``fingerprint`` column holds no digest of the request: only an HMAC of it under a key
of the receipt's own, wrapped by the tenant's KEK (decision 0068; 0062 keyed it by the
subject key), so neither a database reader nor, once the record is erased, a holder of
an old backup and the key store can test guesses of the prompt against it. An erasure
sets it to NULL, and a receipt without one answers its stored answer (the 410) whatever
the body: no oracle remains.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography.exceptions import InvalidTag
from sqlalchemy import Connection, Engine, delete, insert, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError

from ledger.errors import LedgerError
from ledger.store.schema import receipts, vault_content
from ledger.store.tenant_lock import lock_tenant
from ledger.vault_crypto import (
    RECEIPT_FINGERPRINT_2,
    KeyEncryptionKeys,
    new_receipt_key,
    open_receipt,
    open_receipt_key,
    receipt_fingerprint,
    receipt_fingerprint_under,
    seal_receipt,
    seal_receipt_under,
)
from ledger.vault_errors import KeyUnavailableError

RECORD_ID_KEYS = ("record_id", "stream_start_record_id", "x-audit-record-id")
# Without a key store (tests, tools) there is no secret: nothing in the table is
# protected then (answers are stored in the clear too). The service always has one.
NO_KEY_STORE_KEY = b""


@dataclass(frozen=True)
class StoredReceipt:
    fingerprint: bytes | None  # the request's MAC; None once erased (or from before 0014)
    state: str  # "pending" or "done"
    response: dict[str, Any] | None
    created_at: datetime
    owner: str | None = None
    kek_id: str | None = None  # the receipt's own key, wrapped (decision 0068)
    wrapped_key: bytes | None = None


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def record_ids_in(response: Any) -> list[str]:
    """Every record id an answer names (its body, headers or stored problem)."""
    found: dict[str, None] = {}

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for name, item in value.items():
                if isinstance(item, str) and str(name).lower() in RECORD_ID_KEYS:
                    found[item] = None
                else:
                    walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(response)
    return list(found)


def erased_answer(record_id: str, erased_at: datetime | None,
                  erasure_record_id: str | None) -> dict[str, Any]:
    """The stored answer of a key whose record was erased: a 410 that still names the
    record (the key stays bound to it; a retry never generates a second one)."""
    when = erased_at.isoformat(timespec="milliseconds") + "Z" if erased_at else "-"
    return {"problem": {
        "status": 410, "title": "Gone", "record_id": record_id, "headers": {},
        "code": "content_erased", "stream_start_record_id": None,
        "detail": f"the answer of record {record_id} was erased at {when} under erasure "
                  f"record {erasure_record_id}"}}


def is_erased_answer(answer: dict[str, Any] | None) -> bool:
    """Whether a stored answer is an erasure's 410 (``erased_answer``)."""
    problem = answer.get("problem") if isinstance(answer, dict) else None
    return isinstance(problem, dict) and problem.get("code") == "content_erased"


def _keyed_by_receipt(fingerprint: bytes) -> bool:
    """A fingerprint under its receipt's own key (0068): 0x02 and a 32-byte MAC. One of
    0062's bare 32-byte MACs may start with 0x02 too; its length tells them apart."""
    return len(fingerprint) == 33 and fingerprint[:1] == RECEIPT_FINGERPRINT_2


def names_any(record_ids: Iterable[str]) -> Any:
    """Receipts whose ``record_ids`` (comma-joined) name one of these records."""
    from sqlalchemy import or_

    clauses = []
    for record_id in record_ids:
        clauses.append(("," + receipts.c.record_ids + ",").contains(f",{record_id},",
                                                                  autoescape=True))
        # Answers stored before migration 0011 are plaintext JSON.
        clauses.append(receipts.c.response.contains(record_id, autoescape=True))
    return or_(*clauses)


class ReceiptStore:
    def __init__(self, engine: Engine, ttl_s: float = 24 * 3600.0,
                 keks: KeyEncryptionKeys | None = None) -> None:
        self.engine = engine
        self.ttl = timedelta(seconds=ttl_s)
        self.keks = keks

    def claim(self, tenant: str, key: str, fingerprint: bytes, stale_after_s: float,
              owner: str) -> StoredReceipt | None:
        """Claim ``key`` for a new request as ``owner``: None if claimed, else the row that
        holds it.

        An expired row, or a ``pending`` one older than ``stale_after_s`` (its process
        died before answering), is taken over: it then belongs to ``owner``.
        """
        now = _now()
        values = {"state": "pending", "response": None, "response_ct": None,
                  "record_ids": None, "fingerprint": None, "kek_id": None,
                  "wrapped_key": None, "created_at": now, "expires_at": now + self.ttl,
                  "owner": owner}
        try:
            with self.engine.begin() as conn:
                # The row first (on SQLite its write lock), then the key: wrapped under
                # the KEK current once no erasure or rotation can run, so none destroys
                # it before this commits (decision 0068).
                lock_tenant(conn, tenant, exclusive=False)
                conn.execute(insert(receipts).values(tenant=tenant, idempotency_key=key,
                                                     **values))
                self._keyed(conn, tenant, key, fingerprint)
            return None
        except IntegrityError:
            pass
        stale = now - timedelta(seconds=stale_after_s)
        with self.engine.begin() as conn:
            lock_tenant(conn, tenant, exclusive=False)
            taken = conn.execute(
                update(receipts)
                .where(receipts.c.tenant == tenant, receipts.c.idempotency_key == key)
                .where((receipts.c.expires_at < now)
                       | ((receipts.c.state == "pending") & (receipts.c.created_at < stale)))
                .values(**values)
            ).rowcount
            if taken:
                self._keyed(conn, tenant, key, fingerprint)
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
        return StoredReceipt(None if row.fingerprint is None else bytes(row.fingerprint),
                             row.state, self._answer(row), row.created_at, row.owner,
                             None if row.kek_id is None else str(row.kek_id),
                             None if row.wrapped_key is None else bytes(row.wrapped_key))

    def _subject_keys(self, tenant: str) -> list[bytes]:
        return [NO_KEY_STORE_KEY] if self.keks is None else self.keks.subject_keys(tenant)

    def _keyed(self, conn: Connection, tenant: str, key: str, fingerprint: bytes) -> None:
        """Store the claim's fingerprint and key (``_mark``) in ``conn``'s transaction."""
        conn.execute(update(receipts).where(receipts.c.tenant == tenant,
                                            receipts.c.idempotency_key == key)
                     .values(**self._mark(tenant, key, fingerprint)))

    def _mark(self, tenant: str, key: str, fingerprint: bytes) -> dict[str, Any]:
        """A claim's stored fingerprint and key: a MAC under a fresh key of its own,
        wrapped by the tenant's current KEK, so that an erasure of its record, which
        destroys that KEK, leaves nothing to test a guessed body against, not even with
        the key store (decision 0068). Without a key store, the empty key's MAC (0062)."""
        if self.keks is None:
            return {"fingerprint": receipt_fingerprint(NO_KEY_STORE_KEY, tenant, key,
                                                       fingerprint),
                    "kek_id": None, "wrapped_key": None}
        kek_id, wrapped, receipt_key = new_receipt_key(self.keks, tenant, key)
        return {"fingerprint": receipt_fingerprint_under(receipt_key, tenant, key,
                                                         fingerprint),
                "kek_id": kek_id, "wrapped_key": wrapped}

    def _receipt_key(self, tenant: str, key: str, kek_id: Any, wrapped: Any) -> bytes | None:
        """The receipt's own key; None when there is none or it no longer opens (its
        KEK was destroyed by an erasure)."""
        if self.keks is None or kek_id is None or wrapped is None:
            return None
        try:
            return open_receipt_key(self.keks, tenant, key, str(kek_id), bytes(wrapped))
        except (InvalidTag, KeyUnavailableError):
            return None

    def same_request(self, tenant: str, key: str, held: StoredReceipt,
                     fingerprint: bytes) -> bool:
        """Whether a retry's ``fingerprint`` is the one ``held`` was claimed with.

        A row without one matches any body only if its answer is an erasure's 410 (no
        body is told apart from another there). Any other (a subject-key rotation or
        migration 0014 removed its fingerprint) matches none: replaying it to another
        body would hand one request's answer to a different request."""
        if held.fingerprint is None:
            return is_erased_answer(held.response)
        if _keyed_by_receipt(held.fingerprint):
            receipt_key = self._receipt_key(tenant, key, held.kek_id, held.wrapped_key)
            if receipt_key is None:
                # Re-wrapped since it was read (an erasure of another record under its
                # KEK): read once more before calling the bodies different.
                fresh = self.get(tenant, key)
                if fresh is None or fresh.fingerprint != held.fingerprint:
                    return False
                receipt_key = self._receipt_key(tenant, key, fresh.kek_id,
                                                fresh.wrapped_key)
            return receipt_key is not None and hmac.compare_digest(
                held.fingerprint, receipt_fingerprint_under(receipt_key, tenant, key,
                                                            fingerprint))
        # Claimed before 0068: every subject key the tenant still has (a claim may
        # predate a rotation).
        return any(hmac.compare_digest(held.fingerprint, receipt_fingerprint(
            subject_key, tenant, key, fingerprint)) for subject_key in
            self._subject_keys(tenant))

    def _answer(self, row: Any) -> dict[str, Any] | None:
        if row.response_ct is not None and self.keks is not None:
            try:
                if row.kek_id is None or row.wrapped_key is None:  # its key was unopenable
                    raise KeyUnavailableError(row.tenant, "-", "the answer's key is gone")
                plain = open_receipt(self.keks, row.tenant, row.idempotency_key,
                                     str(row.kek_id), bytes(row.wrapped_key),
                                     bytes(row.response_ct))
            except (InvalidTag, LedgerError):
                # Its KEK was destroyed by an erasure that raced the read of this row.
                ids = (row.record_ids or "").split(",")
                return erased_answer(ids[0] if ids[0] else "-", None, None)
            answer: dict[str, Any] = json.loads(plain)
            return answer
        return json.loads(row.response) if row.response else None

    def complete(self, tenant: str, key: str, owner: str, response: dict[str, Any]) -> bool:
        """Store the answer of a key ``owner`` still holds pending (its record is
        committed). False, and nothing changed, if the claim is no longer ``owner``'s."""
        record_ids = record_ids_in(response)
        with self.engine.begin() as conn:
            lock_tenant(conn, tenant, exclusive=False)
            # On SQLite this first write takes the write lock: no erasure runs until the
            # answer is stored, and the check below sees every erasure committed before.
            mine = conn.execute(update(receipts).where(
                receipts.c.tenant == tenant, receipts.c.idempotency_key == key,
                receipts.c.owner == owner, receipts.c.state == "pending")
                .values(record_ids=",".join(record_ids) or None)).rowcount
            if not mine:
                return False
            claimed = conn.execute(select(receipts.c.kek_id, receipts.c.wrapped_key,
                                          receipts.c.fingerprint).where(
                receipts.c.tenant == tenant, receipts.c.idempotency_key == key)).one()
            answer = self._erased(conn, tenant, record_ids) or response
            conn.execute(update(receipts).where(
                receipts.c.tenant == tenant, receipts.c.idempotency_key == key)
                .values(state="done", **self._sealed(tenant, key, answer, claimed)))
        if answer is not response and claimed.kek_id is not None and self.keks is not None:
            # Its record was erased while it ran: the erasure re-wrapped its key under a
            # KEK that lives on, so a backup taken since could still test its body. Mark
            # that KEK doomed: the tenant's next erasure or rotation destroys it.
            self.keks.replace(tenant, [str(claimed.kek_id)])
        return True

    def _erased(self, conn: Connection, tenant: str,
                record_ids: list[str]) -> dict[str, Any] | None:
        if not record_ids:
            return None
        try:
            with conn.begin_nested():  # a broken vault must not lose the answer
                row = conn.execute(select(vault_content.c.record_id,
                                          vault_content.c.erased_at,
                                          vault_content.c.erasure_record_id)
                                   .where(vault_content.c.tenant == tenant,
                                          vault_content.c.record_id.in_(record_ids),
                                          vault_content.c.erased_at.is_not(None))).first()
        except DBAPIError:
            return None  # the vault is unreadable: it cannot have erased anything now
        return erased_answer(row.record_id, row.erased_at, row.erasure_record_id) if row \
            else None

    def _sealed(self, tenant: str, key: str, answer: dict[str, Any], claimed: Any
                ) -> dict[str, Any]:
        """The stored answer: sealed with the receipt's own key (``claimed``: its row's
        kek_id, wrapped_key and fingerprint), or a fresh one for a claim made before
        0068. An erasure's 410 is kept in the clear, with no fingerprint and no key: it
        answers any body alike (0062)."""
        plain = json.dumps(answer)
        if is_erased_answer(answer):
            return {"response": plain, "response_ct": None, "kek_id": None,
                    "wrapped_key": None, "fingerprint": None}
        if self.keks is None:
            return {"response": plain, "response_ct": None, "kek_id": None,
                    "wrapped_key": None}
        stored = claimed.fingerprint
        receipt_key = self._receipt_key(tenant, key, claimed.kek_id, claimed.wrapped_key)
        if stored is not None and _keyed_by_receipt(bytes(stored)) and receipt_key is not None:
            return {"response": None, "kek_id": str(claimed.kek_id),
                    "wrapped_key": bytes(claimed.wrapped_key),
                    "response_ct": seal_receipt_under(receipt_key, tenant, key,
                                                      plain.encode())}
        kek_id, wrapped, ciphertext = seal_receipt(self.keks, tenant, key, plain.encode())
        return {"response": None, "response_ct": ciphertext, "kek_id": kek_id,
                "wrapped_key": wrapped}

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
