"""Read a log through its tiles (a service, a directory or a bucket) and prove a window.

Only the checkpoint, the hash tiles and the entry bundles are read; nothing the log
serves is trusted until ``ledger.window.check_window`` has rebuilt the signed root from
the leaves read and the tiles around them.
"""

from __future__ import annotations

import http.client
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import Protocol

from ledger import body_bundles, merkle, tiles
from ledger.checkpoint import Checkpoint
from ledger.client import safe_http
from ledger.errors import BackendUnavailableError, MalformedProofError
from ledger.tiles import TileNodes, TileRef
from ledger.window import (
    MAX_LAG,
    ReadLeaves,
    WindowAnswer,
    WindowError,
    after_window,
    before_window,
    check_window,
    entry_time,
    read_leaves,
)

FETCH_THREADS = 8
# The largest file of the spec: a full bundle of 256 entries of 65,535 bytes each.
MAX_FILE_BYTES = tiles.TILE_WIDTH * (2 + tiles.MAX_ENTRY_BYTES)


class RefusedError(BackendUnavailableError):
    """The source answered but will not give this caller the file (HTTP 401 or 403: a
    tenant's key asking for another tenant's bodies)."""


class TileSource(Protocol):
    def get(self, path: str) -> bytes | None:
        """A file under the log's prefix, or None when there is none."""


class HttpTiles:
    """Tiles from a URL prefix (the service's ``/tlog/`` or any static host).

    Each thread keeps one connection to the prefix's host open and sends its GETs
    there one after another (a window reads thousands of bundles: a new connection and
    urllib's handler chain per file cost the client and the host more than the bytes).
    Answers are capped as before. A redirect, a proxy configured for the scheme, user
    details in the prefix, or a new connection that fails leave the file to
    ``safe_http`` (a redirect followed on the prefix's origin only, so the bearer key
    never leaves it), which answers or fails exactly as before."""

    def __init__(self, prefix: str, api_key: str | None = None, timeout_s: float = 30.0) -> None:
        self.prefix = prefix.rstrip("/") + "/"
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout_s = timeout_s
        self.received = 0  # bytes received, for the caller's accounting
        parts = urllib.parse.urlsplit(self.prefix)
        self._scheme, self._netloc, self._base = parts.scheme.lower(), parts.netloc, parts.path
        proxied = self._scheme in urllib.request.getproxies() and not \
            urllib.request.proxy_bypass(parts.hostname or "")
        self._kept_alive = (self._scheme in ("http", "https") and not proxied
                            and "@" not in parts.netloc and not parts.query
                            and not parts.fragment)
        self._local = threading.local()

    def get(self, path: str) -> bytes | None:
        answer = self._get_kept_alive(path) if self._kept_alive else None
        if answer is not None:
            status, data = answer
            if status == 404:
                return None
            if status in (401, 403):
                raise RefusedError(f"{path}: HTTP {status}")
            if not 200 <= status < 300:
                raise BackendUnavailableError(f"{path}: HTTP {status}")
            self.received += len(data)
            return data
        return self._get_by_urllib(path)

    def _get_kept_alive(self, path: str) -> tuple[int, bytes] | None:
        """(status, body) over this thread's open connection, or None for the caller to
        ask through urllib: a redirect, or a new connection that failed (urllib then
        fails as it always did, or succeeds)."""
        target = self._base + path
        for fresh in (False, True):
            kept: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
            reused = kept is not None and not fresh
            if kept is not None and reused:
                conn = kept
            else:
                if kept is not None:
                    kept.close()
                factory = (http.client.HTTPSConnection if self._scheme == "https"
                           else http.client.HTTPConnection)
                conn = factory(self._netloc, timeout=self.timeout_s)
                self._local.conn = conn
            try:
                conn.request("GET", target, headers=self.headers)
                response = conn.getresponse()
                if 300 <= response.status < 400:  # followed (same origin only) by urllib
                    self._drop(conn)
                    return None
                data = safe_http.read_capped(response, MAX_FILE_BYTES)
            except TimeoutError as exc:  # not retried: a host that hangs fails once
                self._drop(conn)
                raise BackendUnavailableError(f"{self.prefix}: {exc}") from exc
            except (OSError, http.client.HTTPException):
                self._drop(conn)
                if reused:  # a kept connection the host closed meanwhile: a new one
                    continue
                return None
            except BaseException:  # an answer over the cap: the connection is mid-answer
                self._drop(conn)
                raise
            if response.will_close:
                self._drop(conn)
            return response.status, data
        return None

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        self._local.conn = None

    def _get_by_urllib(self, path: str) -> bytes | None:
        try:  # redirects stay on the prefix's origin (the key never leaves it), capped
            data = safe_http.get(self.prefix + path, self.headers, self.timeout_s,
                                 MAX_FILE_BYTES)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            if exc.code in (401, 403):
                raise RefusedError(f"{path}: HTTP {exc.code}") from exc
            raise BackendUnavailableError(f"{path}: HTTP {exc.code}") from exc
        except OSError as exc:
            raise BackendUnavailableError(f"{self.prefix}: {exc}") from exc
        self.received += len(data)
        return data


def open_tiles(location: str, api_key: str | None = None) -> TileSource:
    """``http(s)://...`` (a tiles prefix), ``s3://bucket/prefix`` or a directory."""
    if location.startswith(("http://", "https://")):
        return HttpTiles(location, api_key)
    if location.startswith("s3://"):
        from ledger.publish.s3 import S3Sink

        return S3Sink.from_url(location)
    from ledger.publish.directory import DirectorySink

    return DirectorySink(Path(location))


class TiledLog:
    """One checkpoint's tree, read through a tile source (each file fetched once)."""

    def __init__(self, source: TileSource, checkpoint: Checkpoint, note: bytes = b"") -> None:
        self.source, self.checkpoint, self.note = source, checkpoint, note
        self.size = checkpoint.size
        self.nodes = TileNodes(self.size, self.read)
        self._bundles: dict[int, list[bytes]] = {}
        self._bodies: dict[tuple[int, str | None], dict[int, bytes]] = {}
        self._tags: dict[int, dict[str | None, list[int]]] = {}
        self._proved: dict[int, bytes] = {}
        self._read: dict[int, ReadLeaves] = {}

    def read(self, ref: TileRef) -> bytes:
        data = self.source.get(ref.path)
        if data is None and ref.partial:  # a partial tile may be gone once the full one is
            full = self.source.get(ref.full().path)
            if full is not None and ref.entries:
                return tiles.encode_bundle(tiles.decode_bundle(full, tiles.TILE_WIDTH)
                                           [:ref.width])
            if full is not None:
                return full[:ref.width * 32]
        if data is None:
            raise BackendUnavailableError(f"{ref.path} is not served")
        return data

    def bundle(self, n: int) -> list[bytes]:
        if n not in self._bundles:
            ref = tiles.tile_for(0, n, self.size, entries=True)
            if ref is None:
                raise MalformedProofError(f"bundle {n} is beyond a tree of size {self.size}")
            self._bundles[n] = tiles.decode_bundle(self.read(ref), ref.width)
        return self._bundles[n]

    def tags(self, n: int) -> dict[str | None, list[int]]:
        """Entry bundle ``n``'s v2 leaves by tenant tag (positions in it), read once."""
        if n not in self._tags:
            self._tags[n] = body_bundles.tags_of(self.bundle(n))
        return self._tags[n]

    def bodies(self, n: int, tag: str | None) -> dict[int, bytes]:
        """The bodies of ``tag``'s v2 leaves in entry bundle ``n``, by leaf index, each
        checked against its envelope (``ledger.body_bundles``)."""
        key = (n, tag)
        if key not in self._bodies:
            ref = tiles.tile_for(0, n, self.size, entries=True)
            if ref is None:
                raise MalformedProofError(f"bundle {n} is beyond a tree of size {self.size}")
            entries = self.bundle(n)
            positions = self.tags(n).get(tag, [])
            if not positions:
                self._bodies[key] = {}
                return self._bodies[key]
            data = self.source.get(body_bundles.body_path(tag, ref))
            if data is None and ref.partial:  # the full file holds these bodies first
                full = self.source.get(body_bundles.body_path(tag, ref.full()))
                if full is not None:
                    data = tiles.encode_bundle(
                        body_bundles.decode_bodies(full)[:len(positions)])
            if data is None:
                raise BackendUnavailableError(f"{body_bundles.body_path(tag, ref)} is not "
                                              "served")
            self._bodies[key] = body_bundles.attach(entries, positions, data, ref.first)
        return self._bodies[key]

    def body(self, index: int, entry: bytes) -> bytes:
        """The published body of v2 leaf ``index`` (``entry``: its envelope, already read
        and checked against the root)."""
        found = self.bodies(index // tiles.TILE_WIDTH, body_bundles.envelope_tag(entry))
        if index not in found:
            raise MalformedProofError(f"leaf {index} has no published body")
        return found[index]

    def prefetch_bodies(self, start: int, end: int, tags: set[str | None] | None) -> None:
        """Fetch, in parallel, the body files of ``tags`` (None: every tag) for leaves
        ``[start, end)``, whose entry bundles were read already."""
        wanted: list[tuple[int, str | None]] = []
        for n in range(start // tiles.TILE_WIDTH, (end - 1) // tiles.TILE_WIDTH + 1):
            present = self.tags(n)
            wanted.extend((n, tag) for tag in present if tags is None or tag in tags)
        with ThreadPoolExecutor(FETCH_THREADS) as pool:
            for _ in pool.map(lambda key: self.bodies(*key), wanted):
                pass

    def proved_leaf(self, index: int) -> bytes:
        """Leaf ``index``'s exact bytes, proved to sit there in the checkpoint's tree."""
        if index not in self._proved:
            if not 0 <= index < self.size:
                raise MalformedProofError(f"leaf {index} is beyond a tree of size "
                                          f"{self.size}")
            entry = self.entries(index, index + 1)[0]
            tiles.check_leaves(self.size, self.checkpoint.root, index, index + 1,
                               [merkle.hash_leaf(entry)], self.nodes.node)
            self._proved[index] = entry
        return self._proved[index]

    def entries(self, start: int, end: int) -> list[bytes]:
        """Leaves ``[start, end)``, their bundles fetched in parallel, each hashed and
        its times read in the thread that fetched it (``leaves_read``), while the other
        threads wait on the network."""
        first, last = start // tiles.TILE_WIDTH, (end - 1) // tiles.TILE_WIDTH
        wanted = [n for n in range(first, last + 1) if n not in self._read]
        with ThreadPoolExecutor(FETCH_THREADS) as pool:
            for _ in pool.map(self._fetch_and_read, wanted):
                pass
        out: list[bytes] = []
        for n in range(first, last + 1):
            out.extend(self._bundles[n])
        offset = first * tiles.TILE_WIDTH
        return out[start - offset:end - offset]

    def _fetch_and_read(self, n: int) -> None:
        self._read[n] = read_leaves(self.bundle(n))

    def leaves_read(self, start: int, end: int) -> ReadLeaves:
        """The hashes and times of leaves ``[start, end)`` (``entries`` read them)."""
        first, last = start // tiles.TILE_WIDTH, (end - 1) // tiles.TILE_WIDTH
        for n in range(first, last + 1):
            if n not in self._read:
                self._fetch_and_read(n)
        return ReadLeaves.join([self._read[n] for n in range(first, last + 1)],
                               start - first * tiles.TILE_WIDTH, end - start)

    def window_range(self, since: datetime, until: datetime,
                     lag: timedelta = MAX_LAG) -> tuple[int, int]:
        """Leaves ``[k, j + 1)`` that hold the window by the lag rule: ``k`` created before
        ``since - lag`` (or 0), ``j`` at or after ``until + lag``. Found by bisecting on
        bundles; any such pair proves the window, a near one reads less."""
        count = (self.size + tiles.TILE_WIDTH - 1) // tiles.TILE_WIDTH
        if count == 0:
            raise WindowError("the checkpoint is empty: the window is still open")

        def first_time(n: int) -> datetime:
            return entry_time(self.bundle(n)[0])

        def last_time(n: int) -> datetime:
            return entry_time(self.bundle(n)[-1])

        lo_bundle = _last_true(count, lambda n: before_window(first_time(n), since, lag))
        start = 0
        if lo_bundle is not None:
            times = [entry_time(e) for e in self.bundle(lo_bundle)]
            start = lo_bundle * tiles.TILE_WIDTH + max(
                i for i, t in enumerate(times) if before_window(t, since, lag))
        hi_bundle = _first_true(count, lambda n: after_window(last_time(n), until, lag))
        if hi_bundle is None:
            raise WindowError(f"the window is still open: no leaf of the checkpoint of size "
                              f"{self.size} was created at or after {until + lag} "
                              "(until + max lag)")
        times = [entry_time(e) for e in self.bundle(hi_bundle)]
        end = hi_bundle * tiles.TILE_WIDTH + min(
            i for i, t in enumerate(times) if after_window(t, until, lag)) + 1
        return start, max(end, start + 1)

    def prove_window(self, since: datetime, until: datetime,
                     keep: Callable[[int, bytes], bool] = lambda index, entry: True,
                     lag: timedelta = MAX_LAG) -> tuple[WindowAnswer, list[bytes]]:
        start, end = self.window_range(since, until, lag)
        entries = self.entries(start, end)
        return check_window(self.checkpoint, since, until, start, entries, self.nodes.node,
                            keep, lag, read=self.leaves_read(start, end)), entries


def _last_true(count: int, test: Callable[[int], bool]) -> int | None:
    """The last n in [0, count) with test(n), assuming tests are true then false."""
    if not test(0):
        return None
    lo, hi = 0, count - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if test(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _first_true(count: int, test: Callable[[int], bool]) -> int | None:
    """The first n in [0, count) with test(n), assuming tests are false then true."""
    if not test(count - 1):
        return None
    lo, hi = 0, count - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if test(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo
