"""The in-memory twin of the SQL drivers (decision 0042).

``MemoryLog`` plays every role the SQL ledger plays (``Appender``, ``LogReader``,
``CheckpointSealer``, ``IdentityStore``, and ``EvidenceLog`` with its anchors and
cosignatures) over plain Python structures under one lock, for
tests of the floors above and for the shared contract test that holds all drivers to the
same behaviour. "Durable" here means held by this object: an append's answer comes only
after its leaf, its tree nodes and its row are all in place, never before.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ledger import merkle, tiles
from ledger.checkpoint import Checkpoint, NoteSigner
from ledger.errors import BackendUnavailableError, DuplicateRecordError, LeafTooLargeError
from ledger.leaves.body_codec import unpack_body
from ledger.leaves.envelope import Leaf
from ledger.leaves.environment import ENVIRONMENT_COLUMNS
from ledger.leaves.mirror import environment_row
from ledger.store.anchors import MemoryAnchorStore
from ledger.store.cosignatures import MemoryCosignatures
from ledger.store.log_api import (
    LogLeaf,
    LogMeta,
    Receipt,
    RecordRow,
    StoredCheckpoint,
    TileNotFoundError,
    TreeProofs,
    parse_timestamp,
)
from ledger.store.rows import check_publishable, row_columns
from ledger.tiles import TileRef

# Columns a RecordRow names itself; the rest of a row are its ``columns``.
_OWN = frozenset({"leaf_index", "record_id", "created_at", "tenant", "canonical", "body",
                  "environment_index"})


class MemoryLog(TreeProofs):
    """A log held in memory: appends, tree, checkpoints, identity and leaf rows."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._compact = merkle.CompactRange()
        self._nodes: dict[merkle.Node, bytes] = {}
        self._rows: list[dict[str, Any]] = []
        self._by_id: dict[str, int] = {}
        self._environments: dict[int, dict[str, Any]] = {}
        self._checkpoints: list[StoredCheckpoint] = []  # by size, ascending
        self._meta: LogMeta | None = None
        self._closed = False
        self.anchors = MemoryAnchorStore(log_size=lambda: self.tree_head()[0])
        self.cosignatures = MemoryCosignatures()
        self.tiles = _MemoryTiles(self)

    # --- lifecycle (the SQL ledger's, so either fits a ``with``) -------------------------

    def start(self) -> MemoryLog:
        return self

    def close(self, timeout_s: float | None = 60.0) -> None:
        with self._lock:
            self._closed = True

    def __enter__(self) -> MemoryLog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- Appender ---------------------------------------------------------------------

    @property
    def writer_alive(self) -> bool:
        return True  # no writer thread to die

    def submit(self, leaf: LogLeaf) -> Future[Receipt]:
        future: Future[Receipt] = Future()
        (outcome,) = self._append_all([leaf])
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
        return future

    def append(self, leaf: LogLeaf, timeout: float | None = 60.0) -> Receipt:
        return self.submit(leaf).result(timeout)

    async def append_async(self, leaf: LogLeaf) -> Receipt:
        return self.append(leaf)

    def append_many(self, leaves: Sequence[LogLeaf], timeout: float | None = 60.0
                    ) -> list[Receipt | BaseException]:
        return list(self._append_all(leaves))

    async def append_many_async(self, leaves: Sequence[LogLeaf]
                                ) -> list[Receipt | BaseException]:
        return list(self._append_all(leaves))

    def _append_all(self, leaves: Sequence[LogLeaf]) -> list[Receipt | BaseException]:
        with self._lock:
            if self._closed:
                raise BackendUnavailableError("ledger is closed")
            return [self._append_one(leaf) for leaf in leaves]

    def _append_one(self, leaf: LogLeaf) -> Receipt | BaseException:
        try:  # as the SQL writer: refused before it has an index
            check_publishable(leaf)
        except LeafTooLargeError as exc:
            return exc
        earlier = self._by_id.get(leaf.record_id)
        if earlier is not None:  # a retried append answers with its first receipt
            if self._rows[earlier]["canonical"] != leaf.canonical:
                return DuplicateRecordError(f"record id {leaf.record_id} is already used "
                                            "by another record")
            return Receipt(leaf.record_id, earlier, leaf.leaf_hash)
        index = self._compact.size
        self._nodes.update(self._compact.append(leaf.leaf_hash))
        columns = row_columns(leaf)
        columns["leaf_index"] = index
        columns["created_at"] = parse_timestamp(columns["created_at"])
        self._rows.append(columns)
        self._by_id[leaf.record_id] = index
        if isinstance(leaf, Leaf) and (environment := environment_row(leaf)) is not None:
            self._environments[index] = environment
        return Receipt(leaf.record_id, index, leaf.leaf_hash)

    # --- LogReader: the tree ----------------------------------------------------------

    def tree_head(self) -> tuple[int, bytes]:
        with self._lock:
            return self._compact.size, self._compact.root()

    def read_leaves(self, start: int, end: int) -> dict[int, bytes]:
        with self._lock:
            return {index: self._nodes[(0, index)]
                    for index in range(max(start, 0), min(end, self._compact.size))
                    if (0, index) in self._nodes}

    def next_leaf_from(self, index: int) -> int | None:
        with self._lock:
            return max(index, 0) if index < self._compact.size else None

    def next_row_from(self, index: int) -> int | None:
        with self._lock:
            return max(index, 0) if index < len(self._rows) else None

    def read_nodes(self, keys: Sequence[merkle.Node]) -> dict[merkle.Node, bytes]:
        with self._lock:
            return {key: self._nodes[key] for key in keys if key in self._nodes}

    # --- LogReader: checkpoints, CheckpointSealer -------------------------------------

    def seal_checkpoint(self, signer: NoteSigner, origin: str, sealed_by: str | None = None,
                        lock_wait_s: float | None = None) -> StoredCheckpoint | None:
        with self._lock:
            size, root = self._compact.size, self._compact.root()
            if self._checkpoints and size <= self._checkpoints[-1].size:
                return None
            note = signer.sign_checkpoint(Checkpoint(origin, size, root))
            sealed = StoredCheckpoint(size, root, note, datetime.now(UTC).replace(tzinfo=None),
                                      sealed_by)
            self._checkpoints.append(sealed)
            return sealed

    def latest_checkpoint(self) -> StoredCheckpoint | None:
        with self._lock:
            return self._checkpoints[-1] if self._checkpoints else None

    def checkpoint(self, size: int) -> StoredCheckpoint | None:
        with self._lock:
            return next((c for c in self._checkpoints if c.size == size), None)

    def iter_checkpoints(self) -> Iterator[StoredCheckpoint]:
        with self._lock:
            stored = list(self._checkpoints)
        yield from stored

    def checkpoints_after(self, size: int) -> tuple[int, datetime | None, int]:
        with self._lock:
            later = [c for c in self._checkpoints if c.size > size]
        return (len(later), min((c.sealed_at for c in later), default=None),
                later[-1].size if later else size)

    # --- LogReader: leaves ------------------------------------------------------------

    def record_at(self, leaf_index: int) -> RecordRow | None:
        with self._lock:
            if not 0 <= leaf_index < len(self._rows):
                return None
            return self._row(leaf_index)

    def get_record(self, record_id: str) -> RecordRow | None:
        with self._lock:
            index = self._by_id.get(record_id)
            return None if index is None else self._row(index)

    def iter_records(self, start: int = 0, end: int | None = None,
                     batch: int = 5000) -> Iterator[RecordRow]:
        with self._lock:
            stop = len(self._rows) if end is None else min(end, len(self._rows))
            rows = [self._row(i) for i in range(max(0, start), stop)]
        yield from rows

    def _row(self, index: int) -> RecordRow:
        """Row ``index`` as the SQL mirror answers it: a v2 record's environment columns
        come from the environment it names; its covering checkpoint from the sizes."""
        stored = self._rows[index]
        named = stored["environment_index"]
        environment = self._environments.get(named, {}) if named is not None else {}
        columns = {name: value for name, value in stored.items() if name not in _OWN}
        for name in ENVIRONMENT_COLUMNS:
            if columns.get(name) is None:
                columns[name] = environment.get(name)
        sizes = [c.size for c in self._checkpoints]
        at = bisect.bisect_right(sizes, index)
        anchored = list(self.anchors.iter_anchors())  # the first one larger covers it
        covering = bisect.bisect_right([a.size for a in anchored], index)
        return RecordRow(
            leaf_index=index, record_id=stored["record_id"], created_at=stored["created_at"],
            tenant=stored["tenant"], columns=columns, canonical=stored["canonical"],
            checkpoint_size=sizes[at] if at < len(sizes) else None,
            anchor_ref=anchored[covering].ref if covering < len(anchored) else None,
            stored_body=stored["body"], environment_index=stored["environment_index"])

    # --- IdentityStore ----------------------------------------------------------------

    def log_meta(self) -> LogMeta | None:
        with self._lock:
            return self._meta

    def create_log_meta(self, origin: str, verifier_key: str) -> LogMeta:
        with self._lock:
            if self._meta is None:
                self._meta = LogMeta(origin, verifier_key,
                                     datetime.now(UTC).replace(tzinfo=None))
            return self._meta


class _MemoryTiles:
    """The twin's tree and leaves as tiles (``TileReads``)."""

    def __init__(self, log: MemoryLog) -> None:
        self._log = log

    def hash_tile(self, ref: TileRef) -> bytes:
        level = ref.level * tiles.TILE_HEIGHT
        with self._log._lock:
            found = [self._log._nodes.get((level, i)) for i in range(ref.first,
                                                                     ref.first + ref.width)]
        if None in found:
            raise TileNotFoundError(ref.path)
        return b"".join(node for node in found if node is not None)

    def entries(self, start: int, end: int) -> list[bytes]:
        return [entry for entry, _ in self.leaves(start, end)]

    def leaves(self, start: int, end: int) -> list[tuple[bytes, bytes | None]]:
        with self._log._lock:
            if not 0 <= start <= end <= len(self._log._rows):
                raise TileNotFoundError(f"leaves [{start}, {end})")
            rows = self._log._rows[start:end]
        return [(row["canonical"], None if row["body"] is None else unpack_body(row["body"]))
                for row in rows]


if TYPE_CHECKING:  # mypy holds the twin to every role's Protocol
    from ledger.store.identity import IdentityStore
    from ledger.store.log_api import Appender, CheckpointSealer, EvidenceLog, PublishableLog

    def _plays_every_role(log: MemoryLog) -> tuple[Appender, EvidenceLog, PublishableLog,
                                                    CheckpointSealer, IdentityStore]:
        return log, log, log, log, log
