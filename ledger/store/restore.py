"""Rebuild a log database from its published tiles, or leave it untouched.

Every leaf of the published checkpoint is read from the entry bundles, hashed into a
fresh tree and written with its mirror row, all in one transaction that commits only if
the rebuilt root is the checkpoint's and the tree also hashes to every other trusted
checkpoint given (a witnessed or anchored note kept elsewhere). A restore that cannot
prove this names the checkpoint it lacks, and the database stays as empty as it was: a
service cannot start on a half-restored or unproven log.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from multiprocessing import get_context
from typing import Any

from sqlalchemy import Connection, Engine, insert, text

from ledger import merkle, tiles
from ledger.audit import open_record
from ledger.checkpoint import Checkpoint, NoteVerifier, SignedNote
from ledger.cosignature import WitnessKey, valid_cosigners
from ledger.errors import InvalidInputError, LedgerError, RootMismatchError, VerificationError
from ledger.record import mirror_columns
from ledger.store.log_api import parse_timestamp
from ledger.store.rows import RECORD_INSERT_COLUMNS
from ledger.store.schema import checkpoints, cosignatures, log_meta, records

BUNDLES_AHEAD = 16  # bundles fetched ahead of the one being written
CHUNK_LEAVES = 8192  # leaves per mirror-row job and per insert statement


class RestoreError(VerificationError):
    """The published tiles do not prove a log this restore may commit."""


@dataclass(frozen=True)
class Restored:
    size: int
    root: bytes
    proven_against: tuple[int, ...]  # sizes of the trusted checkpoints the tree matches


def restore(engine: Engine, read: Callable[[str], bytes | None], verifier: NoteVerifier,
            origin: str, *, witnesses: Sequence[WitnessKey] = (), quorum: int | None = None,
            trusted_notes: Sequence[bytes] = (),
            progress: Callable[[int, int], None] | None = None) -> Restored:
    """Rebuild the (migrated, empty) log at ``engine`` from the tiles ``read`` serves.

    The published checkpoint must be signed by ``verifier`` and cosigned by ``quorum`` of
    ``witnesses`` (unless none are given and ``trusted_notes`` vouch for the log instead);
    the tree must hash to each of ``trusted_notes`` too."""
    note = read(tiles.CHECKPOINT_PATH)
    if note is None:
        raise RestoreError("no checkpoint is published there")
    checkpoint = verifier.open_checkpoint(note, origin)
    trusted = [verifier.open_checkpoint(n, origin) for n in trusted_notes]
    cosigned = valid_cosigners(note, witnesses) if witnesses else {}
    if witnesses and len(cosigned) < (quorum or len(witnesses)):
        raise RestoreError(f"the published checkpoint of size {checkpoint.size} carries "
                           f"{len(cosigned)} valid cosignatures of the "
                           f"{quorum or len(witnesses)} needed")
    if not witnesses and not trusted:
        raise RestoreError("nothing vouches for the published checkpoint: give witnesses "
                           "or a trusted (anchored or witnessed) checkpoint")
    for other in trusted:
        if other.size > checkpoint.size:
            raise RestoreError(f"cannot prove consistency with the trusted checkpoint of "
                               f"size {other.size}: the published tiles end at "
                               f"{checkpoint.size}")
    _check_empty(engine)
    wanted = {c.size for c in trusted}
    roots: dict[int, bytes] = {}
    with engine.begin() as conn:
        # Indexes are built once after the bulk load, not row by row during it.
        for index in records.indexes:
            index.drop(conn)
        compact = _write_leaves(conn, read, checkpoint.size, wanted, roots, progress)
        for index in records.indexes:
            index.create(conn)
        root = compact.root()
        if root != checkpoint.root:
            raise RootMismatchError(expected=checkpoint.root, calculated=root)
        for other in trusted:
            got = roots.get(other.size, root if other.size == checkpoint.size else None)
            if got != other.root:
                raise RestoreError(f"the published tiles are not consistent with the trusted "
                                   f"checkpoint of size {other.size}")
        _write_head(conn, checkpoint, note, verifier, origin, cosigned)
    return Restored(checkpoint.size, root, tuple(sorted(wanted)))


def _check_empty(engine: Engine) -> None:
    with engine.connect() as conn:
        size = conn.execute(text("SELECT size FROM tree_state WHERE id = 1")).scalar()
        meta = conn.execute(text("SELECT count(*) FROM log_meta")).scalar()
    if size or meta:
        raise InvalidInputError("--db", "restore writes only into an empty log database")


def _bundles(read: Callable[[str], bytes | None], size: int) -> Iterator[list[bytes]]:
    """Every entry bundle of a tree of ``size``, in order, fetched ahead in threads."""
    refs = [tiles.tile_for(0, n, size, entries=True)
            for n in range((size + tiles.TILE_WIDTH - 1) // tiles.TILE_WIDTH)]

    def fetch(ref: tiles.TileRef | None) -> list[bytes]:
        assert ref is not None
        data = read(ref.path)
        if data is None:
            raise RestoreError(f"{ref.path} is not published: the tiles cannot prove the "
                               f"checkpoint of size {size}")
        return tiles.decode_bundle(data, ref.width)

    with ThreadPoolExecutor(8) as pool:
        for start in range(0, len(refs), BUNDLES_AHEAD):
            yield from pool.map(fetch, refs[start:start + BUNDLES_AHEAD])


def _write_leaves(conn: Connection, read: Callable[[str], bytes | None], size: int,
                  wanted: set[int], roots: dict[int, bytes],
                  progress: Callable[[int, int], None] | None) -> merkle.CompactRange:
    """Hash every leaf into the tree here while worker processes turn chunks of leaves
    into mirror rows (parsing records is most of a restore's work)."""
    mark = "%s" if conn.dialect.name == "postgresql" else "?"
    node_sql = f"INSERT INTO tree_nodes (level, idx, hash) VALUES ({mark}, {mark}, {mark})"
    columns = RECORD_INSERT_COLUMNS
    record_sql = (f"INSERT INTO records ({', '.join(columns)}) "
                  f"VALUES ({', '.join([mark] * len(columns))})")
    compact = merkle.CompactRange()
    sqlite = conn.dialect.name == "sqlite"
    pending: deque[tuple[list[bytes], Future[list[tuple[object, ...]]]]] = deque()
    # Worker processes pay for themselves only with cores to spare for them.
    workers = min(8, (os.cpu_count() or 1) - 1)
    with (ProcessPoolExecutor(workers, mp_context=get_context("fork")) if workers >= 2
          else _InlineExecutor()) as pool:

        def drain(keep: int) -> None:
            while len(pending) > keep:
                entries, rows = pending.popleft()
                nodes: list[tuple[int, int, bytes]] = []
                for entry in entries:
                    nodes.extend((lv, ix, h) for (lv, ix), h
                                 in compact.append(merkle.hash_leaf(entry)))
                    if compact.size in wanted:
                        roots[compact.size] = compact.root()
                conn.exec_driver_sql(node_sql, nodes)
                conn.exec_driver_sql(record_sql, rows.result())
                if progress is not None:
                    progress(compact.size, size)

        chunk: list[bytes] = []
        queued = 0
        for bundle in _bundles(read, size):
            chunk.extend(bundle)
            if len(chunk) >= CHUNK_LEAVES:
                pending.append((chunk, pool.submit(_mirror_rows, queued, chunk, sqlite)))
                queued += len(chunk)
                chunk = []
                drain(2 * workers)
        if chunk:
            pending.append((chunk, pool.submit(_mirror_rows, queued, chunk, sqlite)))
        drain(0)
    conn.exec_driver_sql(f"UPDATE tree_state SET size = {mark}, root = {mark} WHERE id = 1",
                         (compact.size, compact.root()))
    return compact


class _InlineExecutor(ThreadPoolExecutor):
    """Runs each job at submit time, in this thread (one or two cores)."""

    def __init__(self) -> None:
        super().__init__(1)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        done: Future[Any] = Future()
        done.set_result(fn(*args, **kwargs))
        return done


def _mirror_rows(start: int, entries: list[bytes], sqlite: bool
                 ) -> list[tuple[object, ...]]:
    return [_mirror_row(start + i, entry, sqlite) for i, entry in enumerate(entries)]


def _mirror_row(index: int, entry: bytes, sqlite: bool) -> tuple[object, ...]:
    try:
        columns = mirror_columns(open_record(entry))
    except LedgerError as exc:
        raise RestoreError(f"leaf {index} is not a record this restore can mirror: "
                           f"{exc}") from exc
    created = parse_timestamp(columns["created_at"])
    columns["created_at"] = created.strftime("%Y-%m-%d %H:%M:%S.%f") if sqlite else created
    columns["leaf_index"], columns["canonical"] = index, entry
    # A v1 leaf is its record: no body beside it, no environment leaf (decision 0026).
    columns.setdefault("body", None)
    columns.setdefault("environment_index", None)
    return tuple(columns[c] for c in RECORD_INSERT_COLUMNS)


def _write_head(conn: Connection, checkpoint: Checkpoint, note: bytes,
                verifier: NoteVerifier, origin: str, cosigned: dict[str, int]) -> None:
    """The checkpoint as the log signed it, its cosignature lines apart (as the service
    stores them), and the log's identity."""
    parsed = SignedNote.parse(note)
    own = tuple(s for s in parsed.signatures if s[0] == verifier.name
                and s[1] == verifier.key_hash)
    now = datetime.now(UTC).replace(tzinfo=None)
    conn.execute(insert(checkpoints).values(
        size=checkpoint.size, root=checkpoint.root,
        note=SignedNote(parsed.body, own).serialize(), sealed_at=now, sealed_by="restore"))
    lines = {name: SignedNote(parsed.body, ((name, khash, sig),)).serialize()
             .split(b"\n\n", 1)[1].decode().rstrip("\n")
             for name, khash, sig in parsed.signatures if name in cosigned}
    for name, timestamp in cosigned.items():
        conn.execute(insert(cosignatures).values(checkpoint_size=checkpoint.size,
                                                 witness=name, line=lines[name],
                                                 timestamp=timestamp))
    conn.execute(insert(log_meta).values(id=1, origin=origin, verifier_key=verifier.encode(),
                                         created_at=now))
