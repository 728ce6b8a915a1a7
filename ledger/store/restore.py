"""Rebuild a log database from its published tiles, or leave it untouched.

Every leaf of the published checkpoint is read from the entry bundles (a v2 leaf with its
body, published beside them: ``ledger.body_bundles``), hashed into a fresh tree and
written with its mirror row (and a v2 environment's ``environments`` row), all in one
transaction that commits only if the rebuilt root is the checkpoint's and the tree
also hashes to every other trusted checkpoint given (a witnessed or anchored note kept
elsewhere). A restore that cannot prove this names the checkpoint it lacks, and the
database stays as empty as it was: a service cannot start on a half-restored or
unproven log.
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

from sqlalchemy import Connection, Engine, event, insert, text

from ledger import body_bundles, merkle, tiles
from ledger.audit import open_row
from ledger.checkpoint import Checkpoint, NoteVerifier, SignedNote
from ledger.cosignature import WitnessKey, valid_cosigners
from ledger.errors import InvalidInputError, LedgerError, RootMismatchError, VerificationError
from ledger.leaves.batch_layouts import BatchLayouts
from ledger.leaves.body_codec import pack_body
from ledger.leaves.envelope import TIMESTAMP, Leaf
from ledger.leaves.mirror import environment_row, leaf_columns
from ledger.record import mirror_columns
from ledger.store.log_api import parse_timestamp
from ledger.store.rows import RECORD_INSERT_COLUMNS
from ledger.store.schema import checkpoints, cosignatures, environments, log_meta, records

BUNDLES_AHEAD = 16  # bundles fetched ahead of the one being written
CHUNK_LEAVES = 8192  # leaves per mirror-row job and per insert statement
BULK_CACHE_KIB = 256 * 1024  # SQLite's page cache while a file is built aside


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
        compact = _write_leaves(conn, read, checkpoint.size, wanted, roots, progress, origin)
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


def bulk_load_aside(engine: Engine) -> None:
    """Settings for a new SQLite file that a restore builds aside (``audit-ledger
    restore``): written in one transaction, then proven, closed and moved into place, or
    removed, so its rollback journal can live in memory (a write-ahead log would hold
    every page once more, then copy each into the file at close), and a large page
    cache keeps the index builds off the disk. The service that opens the file later
    sets its own journal mode (WAL). Never for a database in use."""

    @event.listens_for(engine, "connect")
    def _bulk_pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=MEMORY")
        cursor.execute(f"PRAGMA cache_size=-{BULK_CACHE_KIB}")
        cursor.close()


def _check_empty(engine: Engine) -> None:
    with engine.connect() as conn:
        size = conn.execute(text("SELECT size FROM tree_state WHERE id = 1")).scalar()
        meta = conn.execute(text("SELECT count(*) FROM log_meta")).scalar()
    if size or meta:
        raise InvalidInputError("--db", "restore writes only into an empty log database")


Bundle = tuple[list[bytes], list[bytes | None]]  # leaves, and each v2 leaf's body


def _bundles(read: Callable[[str], bytes | None], size: int) -> Iterator[Bundle]:
    """Every entry bundle of a tree of ``size`` with the bodies of its v2 leaves, in
    order, fetched ahead in threads."""
    refs = [tiles.tile_for(0, n, size, entries=True)
            for n in range((size + tiles.TILE_WIDTH - 1) // tiles.TILE_WIDTH)]

    def fetch(ref: tiles.TileRef | None) -> Bundle:
        assert ref is not None
        data = read(ref.path)
        if data is None:
            raise RestoreError(f"{ref.path} is not published: the tiles cannot prove the "
                               f"checkpoint of size {size}")
        entries = tiles.decode_bundle(data, ref.width)
        bodies: list[bytes | None] = [None] * len(entries)
        for tag, positions in body_bundles.tags_of(entries).items():
            path = body_bundles.body_path(tag, ref)
            found = read(path)
            if found is None:
                raise RestoreError(f"{path} is not published: the bodies of leaves "
                                   f"{ref.first + positions[0]}.. cannot be restored")
            try:
                for index, body in body_bundles.attach(entries, positions, found,
                                                       ref.first).items():
                    bodies[index - ref.first] = body
            except VerificationError as exc:
                raise RestoreError(f"{path}: {exc}") from exc
        return entries, bodies

    with ThreadPoolExecutor(8) as pool:
        for start in range(0, len(refs), BUNDLES_AHEAD):
            yield from pool.map(fetch, refs[start:start + BUNDLES_AHEAD])


def _write_leaves(conn: Connection, read: Callable[[str], bytes | None], size: int,
                  wanted: set[int], roots: dict[int, bytes],
                  progress: Callable[[int, int], None] | None, origin: str
                  ) -> merkle.CompactRange:
    """Hash every leaf into the tree here while worker processes turn chunks of leaves
    into mirror rows (parsing records is most of a restore's work)."""
    mark = "%s" if conn.dialect.name == "postgresql" else "?"
    node_sql = f"INSERT INTO tree_nodes (level, idx, hash) VALUES ({mark}, {mark}, {mark})"
    columns = RECORD_INSERT_COLUMNS
    record_sql = (f"INSERT INTO records ({', '.join(columns)}) "
                  f"VALUES ({', '.join([mark] * len(columns))})")
    compact = merkle.CompactRange()
    sqlite = conn.dialect.name == "sqlite"
    pending: deque[tuple[list[bytes], Future[Rows]]] = deque()
    # One core stays with this process (hashing and inserting); the others parse. Worker
    # processes pay for themselves only with two or more cores to spare for them: on two
    # cores one worker cost a fifth more CPU for no shorter restore (decision 0065).
    workers = min(8, (os.cpu_count() or 1) - 1)
    with (ProcessPoolExecutor(workers, mp_context=get_context("fork")) if workers >= 2
          else _InlineExecutor()) as pool:
        # The workers are forked now, before the fetching threads start: a child copies
        # no lock that one of them holds.
        pool.submit(int).result()

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
                record_rows, environment_rows = rows.result()
                conn.exec_driver_sql(record_sql, record_rows)
                if environment_rows:  # rare: an engine started or changed
                    conn.execute(environments.insert().values(environment_rows))
                if progress is not None:
                    progress(compact.size, size)

        chunk: list[bytes] = []
        chunk_bodies: list[bytes | None] = []
        queued = 0
        for bundle, bodies in _bundles(read, size):
            chunk.extend(bundle)
            chunk_bodies.extend(bodies)
            if len(chunk) >= CHUNK_LEAVES:
                pending.append((chunk, pool.submit(_mirror_rows, queued, chunk, chunk_bodies,
                                                   sqlite, origin)))
                queued += len(chunk)
                chunk, chunk_bodies = [], []
                drain(2 * workers)
        if chunk:
            pending.append((chunk, pool.submit(_mirror_rows, queued, chunk, chunk_bodies,
                                               sqlite, origin)))
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


Rows = tuple[list[tuple[object, ...]], list[dict[str, Any]]]  # records, environments


def _mirror_rows(start: int, entries: list[bytes], bodies: list[bytes | None], sqlite: bool,
                 origin: str) -> Rows:
    records_out: list[tuple[object, ...]] = []
    environment_rows: list[dict[str, Any]] = []
    # A batch's v2 records are proven by its layout once one of them passed every rule
    # (decision 0053): no re-encoding; any other leaf takes the full path (decision 0060).
    layouts = BatchLayouts()
    for offset, (entry, body) in enumerate(zip(entries, bodies, strict=True)):
        index = start + offset
        try:
            opened = open_row(entry, body, origin, layouts=layouts)
        except LedgerError as exc:
            raise RestoreError(f"leaf {index} is not a record this restore can mirror: "
                               f"{exc}") from exc
        if isinstance(opened, Leaf):  # v2: the body beside its envelope (decision 0026)
            columns = {**leaf_columns(opened), "canonical": entry,
                       "body": pack_body(opened.body)}
            environment = environment_row(opened)
            if environment is not None:
                environment_rows.append({"leaf_index": index, **environment})
        else:  # v1: the leaf is its record, no body, no environment leaf
            columns = {**mirror_columns(opened), "canonical": entry, "body": None,
                       "environment_index": None}
        columns["created_at"] = _stored_time(columns["created_at"], sqlite)
        columns["leaf_index"] = index
        records_out.append(tuple(columns[c] for c in RECORD_INSERT_COLUMNS))
    return records_out, environment_rows


def _stored_time(stamp: str, sqlite: bool) -> object:
    """The mirror's ``created_at`` as the writer stores it (SQLite: SQLAlchemy's text)."""
    if not sqlite:
        return parse_timestamp(stamp)
    if TIMESTAMP.match(stamp):  # the log's own form: rewritten, not parsed (1M times)
        return f"{stamp[:10]} {stamp[11:23]}000"
    return parse_timestamp(stamp).strftime("%Y-%m-%d %H:%M:%S.%f")


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
