"""The quick ways a proved window reads its tiles (decision 0056) still catch what the
plain ways caught: over kept-alive HTTP connections (a static host on loopback, a host
that closes each connection after one answer), with leaves hashed and their times read
in the fetching threads, a leaf altered or dropped in a bundle and a tampered hash tile
still fail the window and are named."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import tiles
from ledger.checkpoint import Checkpoint, NoteSigner
from ledger.client.tiles import HttpTiles, TiledLog
from ledger.errors import MalformedProofError, RootMismatchError
from ledger.publish.directory import DirectorySink
from ledger.publish.publisher import publish
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger
from ledger.window import check_window, read_leaves
from tests.records import make_record
from tests.tiny_log import build_log

ORIGIN = "window-reading.test/log"
BASE = datetime(2026, 11, 3, 8, 0, 0)
COUNT = 700  # two full bundles and a partial one
SINCE, UNTIL = BASE + timedelta(seconds=30 * 100), BASE + timedelta(seconds=30 * 600)

STATIC_HOST = """
import sys
from aiohttp import web
app = web.Application()
app.router.add_static("/", sys.argv[1])
web.run_app(app, host="127.0.0.1", port=int(sys.argv[2]), print=None, access_log=None)
"""


def _when(i: int) -> datetime:
    return BASE + timedelta(seconds=30 * i)


def _v1(i: int) -> bytes:
    return make_record(i, tenant="bank-b" if i % 2 else "bank-a", padding=20,
                       created_at=_when(i).strftime("%Y-%m-%dT%H:%M:%S.000Z")).canonical


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Checkpoint]:
    folder = tmp_path_factory.mktemp("reading")
    url = f"sqlite:///{folder / 'log.db'}"
    upgrade(url)
    signer = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    [note] = build_log(url, COUNT, signer, ORIGIN, leaf=_v1, created_at=_when)
    ledger = SqlLedger(url)
    publish(ledger.tiles, note, DirectorySink(folder / "tlog"))
    ledger.engine.dispose()
    return folder / "tlog", Checkpoint.peek(note)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def static_host(folder: Path, log: Path) -> Iterator[str]:
    """A static file host (a child process, its output to ``log``) serving ``folder``."""
    port = _free_port()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", STATIC_HOST, str(folder), str(port)],
                                stdout=out, stderr=subprocess.STDOUT)
        try:
            prefix = f"http://127.0.0.1:{port}/"
            while True:  # until it answers
                assert proc.poll() is None, log.read_text()
                try:
                    urllib.request.urlopen(prefix + "checkpoint", timeout=5).close()
                    break
                except OSError:
                    time.sleep(0.05)
            yield prefix
        finally:
            proc.terminate()
            proc.wait(30)


def _copy(published: tuple[Path, Checkpoint], tmp_path: Path) -> Path:
    folder = tmp_path / "tlog"
    shutil.copytree(published[0], folder)
    for path in folder.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return folder


def _alter_leaf(folder: Path, leaf: int) -> None:
    """Change one byte of ``leaf`` in its full bundle, keeping every length."""
    ref = tiles.TileRef(0, leaf // tiles.TILE_WIDTH, entries=True)
    path = folder / ref.path
    entries = tiles.decode_bundle(path.read_bytes(), tiles.TILE_WIDTH)
    entry = entries[leaf % tiles.TILE_WIDTH]
    assert b'"bank-a"' in entry or b'"bank-b"' in entry
    entries[leaf % tiles.TILE_WIDTH] = entry.replace(b'"bank-a"', b'"bank-c"').replace(
        b'"bank-b"', b'"bank-c"')
    path.write_bytes(tiles.encode_bundle(entries))


def _prove(prefix: str, checkpoint: Checkpoint) -> tuple[int, int, list[int]]:
    log = TiledLog(HttpTiles(prefix), checkpoint)
    answer, _ = log.prove_window(SINCE, UNTIL, lambda index, entry: b'"bank-a"' in entry)
    return answer.start, answer.end, answer.matched


def test_kept_alive_reads_prove_the_same_window_as_urllib(
        published: tuple[Path, Checkpoint], tmp_path: Path) -> None:
    folder, checkpoint = published
    with static_host(folder, tmp_path / "host.log") as prefix:
        kept = HttpTiles(prefix)
        plain = HttpTiles(prefix)
        plain._kept_alive = False  # every file through urllib, as before
        read = []
        for source in (kept, plain):
            log = TiledLog(source, checkpoint)
            answer, entries = log.prove_window(SINCE, UNTIL,
                                               lambda index, entry: b'"bank-a"' in entry)
            assert (answer.start, answer.end) == (89, 611)
            assert answer.matched == list(range(100, 600, 2))
            read.append(entries)
        on_disk = DirectorySink(folder)
        refs = [tiles.tile_for(0, n, COUNT, entries=True) for n in range(3)]
        assert read[0] == read[1] == [e for ref in refs if ref for e in tiles.decode_bundle(
            on_disk.get(ref.path) or b"", ref.width)][89:611]
        assert kept.received == plain.received > 0
        assert kept.get("tile/entries/999") is None  # a 404 is still "not there"


def test_an_altered_leaf_fails_the_window_through_kept_alive_reads(
        published: tuple[Path, Checkpoint], tmp_path: Path) -> None:
    folder = _copy(published, tmp_path)
    _alter_leaf(folder, 300)
    with static_host(folder, tmp_path / "host.log") as prefix, \
            pytest.raises(RootMismatchError):
        _prove(prefix, published[1])


def test_an_altered_time_is_caught_by_the_root_before_it_is_read(
        published: tuple[Path, Checkpoint], tmp_path: Path) -> None:
    """A leaf whose time no longer reads (read aside in the fetching thread) fails the
    root check first, as it did when every time was read after the root check."""
    folder = _copy(published, tmp_path)
    ref = tiles.TileRef(0, 1, entries=True)
    entries = tiles.decode_bundle((folder / ref.path).read_bytes(), tiles.TILE_WIDTH)
    entries[44] = entries[44].replace(b'"created_at":"2026', b'"created_at":"X026')
    (folder / ref.path).write_bytes(tiles.encode_bundle(entries))
    with static_host(folder, tmp_path / "host.log") as prefix, \
            pytest.raises(RootMismatchError):
        _prove(prefix, published[1])


def test_a_dropped_leaf_and_a_tampered_tile_fail_through_kept_alive_reads(
        published: tuple[Path, Checkpoint], tmp_path: Path) -> None:
    folder = _copy(published, tmp_path)
    ref = tiles.TileRef(0, 1, entries=True)
    original = (folder / ref.path).read_bytes()
    entries = tiles.decode_bundle(original, tiles.TILE_WIDTH)
    (folder / ref.path).write_bytes(tiles.encode_bundle(entries[:100] + entries[101:]))
    with static_host(folder, tmp_path / "host.log") as prefix:
        with pytest.raises(MalformedProofError, match="holds 255 entries, expected 256"):
            _prove(prefix, published[1])
        (folder / ref.path).write_bytes(original)
        # A hash tile the window needs from outside its range: its first hash changed.
        tile = folder / tiles.TileRef(0, 0).path
        data = bytearray(tile.read_bytes())
        data[0] ^= 1
        tile.write_bytes(bytes(data))
        with pytest.raises(RootMismatchError):
            _prove(prefix, published[1])


@contextmanager
def one_answer_per_connection(folder: Path) -> Iterator[tuple[str, list[int]]]:
    """An HTTP/1.1 host that answers one request per connection and then closes it
    without saying so (no ``Connection: close``): a kept connection is found dead on
    the next request. Yields the prefix and the count of connections accepted."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[int] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(1)
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    request += chunk
                if not request:
                    continue
                path = request.split(b" ", 2)[1].decode().lstrip("/")
                target = folder / path
                if target.is_file():
                    body = target.read_bytes()
                    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n"
                else:
                    body = b""
                    head = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
                conn.sendall(head.encode() + body)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/", accepted
    finally:
        server.close()
        thread.join(30)


def test_a_kept_connection_the_host_closed_is_opened_again(
        published: tuple[Path, Checkpoint]) -> None:
    folder, checkpoint = published
    with one_answer_per_connection(folder) as (prefix, accepted):
        source = HttpTiles(prefix)
        first = source.get("tile/entries/000")
        again = source.get("tile/entries/000")  # the kept connection is dead: a new one
        assert first == again == (folder / "tile/entries/000").read_bytes()
        assert source.get("tile/entries/999") is None
        assert len(accepted) == 3
        start, end, matched = _prove(prefix, checkpoint)
        assert (start, end, matched) == (89, 611, list(range(100, 600, 2)))


def test_check_window_refuses_hashes_read_for_other_leaves(
        published: tuple[Path, Checkpoint]) -> None:
    folder, checkpoint = published
    log = TiledLog(DirectorySink(folder), checkpoint)
    start, end = log.window_range(SINCE, UNTIL)
    entries = log.entries(start, end)
    read = read_leaves(entries[1:])
    with pytest.raises(ValueError, match="not one per entry"):
        check_window(checkpoint, SINCE, UNTIL, start, entries, log.nodes.node, read=read)
    read = read_leaves(entries[1:] + entries[:1])  # same count, other order
    with pytest.raises(RootMismatchError):
        check_window(checkpoint, SINCE, UNTIL, start, entries, log.nodes.node, read=read)
