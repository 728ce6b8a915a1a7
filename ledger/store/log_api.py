"""The log by role (decisions 0042, 0048): ``Appender`` adds leaves, ``LogReader`` reads
the tree, its checkpoints and its leaves, ``CheckpointSealer`` signs a new tree head;
``AnchorStore`` and ``CosignatureStore`` keep what anchors and witnesses said of it, and
``TileReads`` reads it as tiles; a log hands them out as ``anchors``, ``cosignatures`` and
``tiles`` (``AnchoredLog``, ``CosignedLog``, ``PublishableLog``).

Callers that only need a role take that Protocol, so the SQL drivers
(``ledger.store.sql.SqlLedger``, SQLite and PostgreSQL) and the in-memory twin
(``ledger.store.memory.MemoryLog``) are interchangeable to them. This module holds only
the Protocols and the values they hand out: it imports no database library.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

from ledger import merkle
from ledger.checkpoint import NoteSigner
from ledger.errors import InvalidInputError, LedgerError
from ledger.leaves.body_codec import unpack_body
from ledger.leaves.envelope import Leaf
from ledger.record import AuditRecord
from ledger.tiles import TileRef

# What the log appends: a v1 record (its bytes are the leaf) or a v2 leaf (decision 0026).
LogLeaf = AuditRecord | Leaf


@dataclass(frozen=True)
class Receipt:
    """What an acknowledged append returns: enough to ask for a proof later."""

    record_id: str
    leaf_index: int
    leaf_hash: bytes


@dataclass(frozen=True)
class StoredCheckpoint:
    size: int
    root: bytes
    note: bytes
    sealed_at: datetime
    sealed_by: str | None = None  # the replica that sealed it; not part of the signed note


@dataclass(frozen=True)
class AnchoredCheckpoint:
    size: int
    note: bytes
    kind: str  # "local" or "fabric"
    ref: str  # "local:<size>" or "fabric:<channel>:<txid>:<block>"
    anchored_at: datetime


@dataclass(frozen=True)
class StoredCosignature:
    """A witness's cosignature line for one checkpoint, as stored (no trailing newline)."""

    checkpoint_size: int
    witness: str
    line: str


@dataclass(frozen=True)
class LogMeta:
    """The log's identity, fixed when it was created."""

    origin: str
    verifier_key: str  # the signed-note verifier key (name = origin) of its signing key
    created_at: datetime


# A BIGINT's smallest. A whole-log scan starting here reads with no lower bound at all:
# a row a tampering put at a negative index, or at a real below any BIGINT (SQLite keeps
# -1e19 or -inf), is read and reported, never skipped.
MIN_LEAF_INDEX = -(2**63)


@dataclass(frozen=True)
class RecordRow:
    leaf_index: int
    record_id: str
    created_at: datetime
    tenant: str
    columns: dict[str, Any]
    canonical: bytes  # a v1 record's bytes, or a v2 leaf's envelope
    checkpoint_size: int | None  # the first checkpoint covering it (derived, not stored)
    anchor_ref: str | None  # the first anchor covering it (derived, not stored)
    stored_body: bytes | None = None  # a v2 leaf's body as stored (None for v1)
    environment_index: int | None = None  # the environment leaf of a v2 record

    @property
    def body(self) -> bytes | None:
        """A v2 leaf's body (None for v1). Stored bytes that do not unpack are handed on as
        they are: they then fail the envelope's digest (verify check 1, audit, fsck)."""
        if self.stored_body is None:
            return None
        try:
            return unpack_body(self.stored_body)
        except LedgerError:
            return self.stored_body

    @property
    def leaf_body(self) -> bytes:
        """The record as readers parse it: a v1 record's bytes, a v2 leaf's body."""
        body = self.body
        return self.canonical if body is None else body


@dataclass(frozen=True)
class ScannedRows:
    """Consecutive mirror rows as the driver returned them, for whole-log scans (``log
    fsck``, ``audit``) that prove most rows from a few raw values. Each row is the tuple
    (leaf_index, record_id, created_at as stored, tenant, canonical, body as stored,
    environment_index, then every column named in ``typed`` as stored); ``record_row``
    makes any of them the ``RecordRow`` that ``iter_records`` would give, and
    ``stored_time`` a stored created_at the datetime that row would hold."""

    rows: Sequence[tuple[Any, ...]]
    typed: tuple[str, ...]
    record_row: Callable[[tuple[Any, ...]], RecordRow]
    stored_time: Callable[[Any], datetime]


@runtime_checkable
class RowScanner(Protocol):
    """A log that hands out its mirror rows raw (the SQL drivers)."""

    def scan_records(self, start: int = 0, end: int | None = None,
                     batch: int = 5000) -> Iterator[ScannedRows]:
        """The rows ``start <= leaf_index < end`` in index order, ``batch`` at a time."""


def scanned(rows: Iterable[RecordRow], batch: int = 5000) -> Iterator[ScannedRows]:
    """``ScannedRows`` of rows already read (a log without ``scan_records``)."""
    chunk: list[RecordRow] = []
    for row in [*rows, None]:
        if row is not None:
            chunk.append(row)
        if chunk and (row is None or len(chunk) >= batch):
            typed = tuple(chunk[0].columns)
            by_index = {r.leaf_index: r for r in chunk}
            yield ScannedRows(
                [(r.leaf_index, r.record_id, r.created_at, r.tenant, r.canonical,
                  r.stored_body, r.environment_index,
                  *(r.columns.get(name) for name in typed)) for r in chunk],
                typed, lambda raw, rows=by_index: rows[raw[0]], _same_time)  # type: ignore[misc]
            chunk = []


def _same_time(value: Any) -> datetime:
    return value  # type: ignore[no-any-return]


def parse_timestamp(text: str) -> datetime:
    """RFC 3339 text to a naive UTC datetime (the mirror stores UTC without a zone)."""
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    return moment


class TreeProofs(ABC):
    """Root, leaf hash and proofs from a driver's ``tree_head`` and ``read_nodes``: the same
    for every driver, so written once here."""

    @abstractmethod
    def tree_head(self) -> tuple[int, bytes]: ...

    @abstractmethod
    def read_nodes(self, keys: Sequence[merkle.Node]) -> dict[merkle.Node, bytes]: ...

    def root(self, size: int) -> bytes:
        self._check_size(size)
        return merkle.tree_root(size, self.read_nodes)

    def leaf_hash(self, index: int) -> bytes:
        found = self.read_nodes([(0, index)])
        if (0, index) not in found:
            raise InvalidInputError("leaf_index", f"no leaf {index} in the log")
        return found[(0, index)]

    def inclusion_proof(self, index: int, size: int) -> list[bytes]:
        self._check_size(size)
        if not 0 <= index < size:
            raise InvalidInputError("leaf_index", f"{index} is not below tree size {size}")
        return merkle.inclusion_proof(index, size, self.read_nodes)

    def consistency_proof(self, size1: int, size2: int) -> list[bytes]:
        self._check_size(size2)
        if not 0 <= size1 <= size2:
            raise InvalidInputError("from", f"{size1} must be between 0 and {size2}")
        return merkle.consistency_proof(size1, size2, self.read_nodes)

    def _check_size(self, size: int) -> None:
        current, _ = self.tree_head()
        if not 0 <= size <= current:
            raise InvalidInputError("tree_size", f"{size} is beyond the log's size {current}")


class Appender(Protocol):
    """Adds leaves. Every answer (a future, a receipt) comes only once the leaf is
    durable: committed on the driver's storage, or held by the twin."""

    @property
    def writer_alive(self) -> bool:
        """False once the writer has died (appends then fail at once)."""

    def submit(self, leaf: LogLeaf) -> Future[Receipt]:
        """Queue an append; the future resolves once it is durable."""

    def append(self, leaf: LogLeaf, timeout: float | None = 60.0) -> Receipt:
        """Append and wait for durability (at most ``timeout`` seconds)."""

    async def append_async(self, leaf: LogLeaf) -> Receipt:
        """Append from asyncio; returns once durable."""

    def append_many(self, leaves: Sequence[LogLeaf], timeout: float | None = 60.0
                    ) -> list[Receipt | BaseException]:
        """Append leaves together and wait (at most ``timeout`` seconds in all): the SQL
        drivers commit them in one transaction, so a crash logs all or none of them;
        each outcome as ``append_many_async``'s."""

    async def append_many_async(self, leaves: Sequence[LogLeaf]
                                ) -> list[Receipt | BaseException]:
        """Append a batch together; each outcome is that leaf's receipt or its own error
        (one clashing record id does not fail the others)."""


class LogReader(Protocol):
    """Reads the committed tree (RFC 9162 hashes and proofs), its checkpoints and its
    leaves. Sizes beyond the committed tree are refused (``InvalidInputError``)."""

    def tree_head(self) -> tuple[int, bytes]:
        """The committed tree size and root (not necessarily sealed in a checkpoint)."""

    def read_nodes(self, keys: Sequence[merkle.Node]) -> dict[merkle.Node, bytes]:
        """Perfect-subtree hashes by (level, index); absent keys are left out."""

    def root(self, size: int) -> bytes: ...

    def leaf_hash(self, index: int) -> bytes: ...

    def inclusion_proof(self, index: int, size: int) -> list[bytes]: ...

    def consistency_proof(self, size1: int, size2: int) -> list[bytes]: ...

    def latest_checkpoint(self) -> StoredCheckpoint | None: ...

    def checkpoint(self, size: int) -> StoredCheckpoint | None: ...

    def iter_checkpoints(self) -> Iterator[StoredCheckpoint]:
        """Every checkpoint, smallest first."""

    def record_at(self, leaf_index: int) -> RecordRow | None: ...

    def get_record(self, record_id: str) -> RecordRow | None: ...

    def iter_records(self, start: int = 0, end: int | None = None,
                     batch: int = 5000) -> Iterator[RecordRow]:
        """The leaves ``start <= leaf_index < end``, in index order."""


class CheckpointSealer(Protocol):
    """Signs the current tree head (the integrator's one write)."""

    def seal_checkpoint(self, signer: NoteSigner, origin: str, sealed_by: str | None = None,
                        lock_wait_s: float | None = None) -> StoredCheckpoint | None:
        """A checkpoint of the current head if the tree grew since the last; else None.
        ``SequencerBusyError`` when ``lock_wait_s`` ran out behind another writer."""


class AnchorStore(Protocol):
    """The anchors recorded for the log's checkpoints. Which anchor covers a leaf follows
    from the anchor sizes (the first anchor larger than its index, decision 0029)."""

    def latest(self) -> AnchoredCheckpoint | None:
        """The newest anchored checkpoint, whatever anchor wrote it."""

    def get(self, size: int) -> AnchoredCheckpoint | None:
        """The anchor recorded for exactly ``size``, if any."""

    def iter_anchors(self) -> Iterator[AnchoredCheckpoint]:
        """Every recorded anchor, smallest size first."""

    def record(self, size: int, note: bytes, kind: str, ref: str) -> AnchoredCheckpoint:
        """Store the anchor of checkpoint ``size``. Idempotent: recording a size already
        stored returns what is stored and changes nothing."""

    def unreferenced_below(self, size: int) -> int:
        """How many leaves below ``size`` no stored anchor covers yet (for checks)."""


class CosignatureStore(Protocol):
    """Witnesses' cosignature lines, each verified against the witness's pinned key
    before it is stored (``ledger.witness.client``)."""

    def store(self, size: int, witness: str, line: str, timestamp: int) -> bool:
        """Keep ``witness``'s line for checkpoint ``size``; False if it had one."""

    def lines(self, size: int) -> list[str]:
        """The stored lines for checkpoint ``size`` (each ending in a newline), by
        witness name."""

    def cosigners(self, size: int) -> set[str]:
        """The witnesses that cosigned checkpoint ``size``."""

    def latest_size(self, witness: str) -> int | None:
        """The largest checkpoint ``witness`` cosigned (its state, as this log saw it)."""

    def iter_cosignatures(self) -> Iterator[StoredCosignature]:
        """Every stored line, by checkpoint size then witness name."""


class TileNotFoundError(LookupError):
    """The tile is not part of the tree the latest checkpoint signs (or not yet stored)."""


class TileReads(Protocol):
    """The log's stored tree as tiles (``ledger.tiles``): hash tiles and leaves, each
    ``TileNotFoundError`` when not all of it is stored."""

    def hash_tile(self, ref: TileRef) -> bytes:
        """The tile's ``ref.width`` hashes, concatenated."""

    def entries(self, start: int, end: int) -> list[bytes]:
        """The exact bytes of leaves ``start <= index < end``, in index order."""

    def leaves(self, start: int, end: int) -> list[tuple[bytes, bytes | None]]:
        """Leaves ``start <= index < end`` as (exact bytes, a v2 leaf's body or None)."""


class AnchoredLog(LogReader, Protocol):
    """A log reader with the anchors recorded for its checkpoints."""

    @property
    def anchors(self) -> AnchorStore: ...


class CosignedLog(LogReader, Protocol):
    """A log reader with its witnesses' cosignatures."""

    @property
    def cosignatures(self) -> CosignatureStore: ...


class PublishableLog(CosignedLog, Protocol):
    """A cosigned log that is read (and published) as tiles."""

    @property
    def tiles(self) -> TileReads: ...


class EvidenceLog(AnchoredLog, CosignedLog, Protocol):
    """Everything a bundle or a verifier's evidence is read from: the tree, its leaves,
    checkpoints, cosignatures and anchors."""
