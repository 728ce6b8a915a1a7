"""The log as C2SP tlog-tiles, read back by a reader written from the spec alone
(tests/tlog_spec_reader.py): checkpoint, hash tiles and entry bundles agree with the
log's own proofs, full and partial tiles, around tile boundaries."""

from __future__ import annotations

import hashlib
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger.checkpoint import Checkpoint, NoteSigner
from ledger.publish.directory import DirectorySink
from ledger.publish.publisher import publish
from ledger.publish.s3 import S3Sink
from ledger.publish.sink import ImmutableTileError
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger
from tests.s3_server import s3_client, s3_server
from tests.tiles_service import tiles_service
from tests.tiny_log import build_log, tiny_leaf
from tests.tlog_spec_reader import SpecReader, open_checkpoint

ORIGIN = "tiles.test/log"
SIZES = (255, 256, 257, 65_536, 65_537)


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SqlLedger, NoteSigner,
                                                                     list[bytes]]]:
    url = f"sqlite:///{tmp_path_factory.mktemp('tiles') / 'log.db'}"
    upgrade(url)
    signer = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    notes = build_log(url, SIZES[-1], signer, ORIGIN, SIZES)
    ledger = SqlLedger(url)
    yield ledger, signer, notes
    ledger.engine.dispose()


def check_tree(fetch: Callable[[str], bytes], ledger: SqlLedger, signer: NoteSigner,
               previous: int) -> int:
    """Everything a monitor checks, from the tiles only; returns the checkpoint's size."""
    origin, size, root = open_checkpoint(fetch("checkpoint"), signer.name, signer.public_key)
    assert origin == ORIGIN
    reader = SpecReader(fetch, size)
    assert reader.mth(0, size) == root
    for n in range((size + 255) // 256):  # every entry bundle hashes to its level-0 tile
        leaves = [hashlib.sha256(b"\x00" + e).digest() for e in reader.entries(n)]
        assert leaves == reader.tile(0, n)
        assert reader.entries(n)[0] == tiny_leaf(n * 256)
    for index in {0, 255, 256, size // 2, size - 2, size - 1} - {-1}:
        if 0 <= index < size:
            assert reader.path(index, 0, size) == ledger.inclusion_proof(index, size)
    if 0 < previous < size:
        assert reader.subproof(previous, 0, size, True) == \
            ledger.consistency_proof(previous, size)
    return size


def test_directory_publisher_read_from_the_spec(log: Any, tmp_path: Path) -> None:
    ledger, signer, notes = log
    sink = DirectorySink(tmp_path / "tlog")
    previous = 0
    for note, expected in zip(notes, SIZES, strict=True):
        report = publish(ledger.tiles, note, sink)
        assert report.size == expected and report.previous_size == previous
        previous = check_tree(lambda p: (tmp_path / "tlog" / p).read_bytes(), ledger, signer,
                              previous)
        assert previous == expected
    # Published full tiles never change: a different log published over it is refused.
    assert (tmp_path / "tlog/tile/0/000").stat().st_mode & 0o222 == 0
    with pytest.raises(ImmutableTileError, match="tile/0/000"):
        sink.put_immutable("tile/0/000", b"\x00" * 8192)
    assert publish(ledger.tiles, notes[-1], sink).files == 0  # idempotent


@pytest.fixture(scope="module")
def served(log: Any) -> Iterator[tuple[str, dict[str, str]]]:
    with tiles_service(log[0]) as service:
        yield service


def _get(url: str, token: str) -> tuple[int, bytes, Any]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read(), answer.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers


def test_service_serves_tiles_read_from_the_spec(log: Any, served: Any) -> None:
    ledger, signer, _ = log
    base, tokens = served

    def fetch(path: str) -> bytes:
        status, body, _ = _get(base + path, tokens["auditor"])
        assert status == 200, (path, status, body[:200])
        return body

    assert check_tree(fetch, ledger, signer, 65_536) == 65_537
    status, _, headers = _get(base + "checkpoint", tokens["auditor"])
    assert headers["Content-Type"] == "text/plain; charset=utf-8"
    # Partial tiles of every checkpointed size are served (here 257's), full ones immutable.
    for size in (255, 257):
        reader = SpecReader(fetch, size)
        assert reader.mth(0, size) == Checkpoint.peek(ledger.checkpoint(size).note).root
    status, _, headers = _get(base + "tile/0/000", tokens["auditor"])
    assert "immutable" in headers["Cache-Control"]


def test_service_refuses_what_a_reader_may_not_have(served: Any) -> None:
    base, tokens = served
    # A tenant's key reads hash tiles, not bundles of whole v1 records of every tenant.
    assert _get(base + "tile/0/000", tokens["client"])[0] == 200
    status, body, _ = _get(base + "tile/entries/000", tokens["client"])
    assert status == 403 and b"all-tenant" in body
    assert _get(base + "tile/entries/000", "nope")[0] == 401
    for path in ("tile/0/256", "tile/0/x001/000", "tile/0/0000", "tile/00/000",
                 "tile/0/000.p/256", "tile/entries/x001/000", "tile/3/000"):
        assert _get(base + path, tokens["auditor"])[0] == 404, path


def test_s3_publisher_object_lock(log: Any, tmp_path: Path) -> None:
    ledger, signer, notes = log
    with s3_server(tmp_path) as endpoint:
        client = s3_client(endpoint)
        client.create_bucket(Bucket="audit-tiles", ObjectLockEnabledForBucket=True)
        sink = S3Sink("audit-tiles", "prod/", retention_days=30, client=client)
        publish(ledger.tiles, notes[1], sink)  # 256: one full tile
        publish(ledger.tiles, notes[2], sink)  # 257: partial tiles beside it

        def fetch(path: str) -> bytes:
            data = sink.get(path)
            assert data is not None, path
            return data

        assert check_tree(fetch, ledger, signer, 256) == 257
        head = client.head_object(Bucket="audit-tiles", Key="prod/tile/0/000")
        assert head["ObjectLockMode"] == "COMPLIANCE"
        assert head["ObjectLockRetainUntilDate"] > datetime.now(UTC) + timedelta(days=29)
        with pytest.raises(ImmutableTileError, match="tile/0/000"):
            sink.put_immutable("tile/0/000", b"\x00" * 8192)
        with pytest.raises(ClientError, match="PreconditionFailed"):
            client.put_object(Bucket="audit-tiles", Key="prod/tile/0/000", Body=b"x",
                              IfNoneMatch="*")
        with pytest.raises(ClientError, match="AccessDenied"):
            client.delete_object(Bucket="audit-tiles", Key="prod/tile/0/000",
                                 VersionId=head["VersionId"])
        assert fetch("tile/0/000") == b"".join(ledger.leaf_hash(i) for i in range(256))


def test_log_publish_command_and_the_service_worker(ledger_url: str, signer: NoteSigner,
                                                    tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import time

    from audit_cli.main import main
    from ledger.publish.worker import PublishWorker
    from tests.integration.conftest import ORIGIN as LOG_ORIGIN
    from tests.records import make_record

    with SqlLedger(ledger_url) as ledger:
        for i in range(3):
            ledger.append(make_record(i))
        ledger.seal_checkpoint(signer, LOG_ORIGIN)
        capsys.readouterr()
        assert main(["log", "--json", "--db", ledger_url, "--log-key",
                     signer.verifier().encode(), "publish", "--to", str(tmp_path / "a")]) == 0
        assert '"published_size": 3' in capsys.readouterr().out
        assert (tmp_path / "a/tile/entries/000.p/3").read_bytes()[2:].startswith(b"{")
        # The service's worker publishes each new seal when woken.
        worker = PublishWorker(ledger, DirectorySink(tmp_path / "b"), interval_s=3600).start()
        try:
            ledger.append(make_record(3))
            ledger.seal_checkpoint(signer, LOG_ORIGIN)
            worker.wake()
            deadline = time.monotonic() + 60
            while worker.published != 4 and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            worker.stop()
        assert worker.published == 4 and worker.last_error is None
        assert Checkpoint.peek((tmp_path / "b/checkpoint").read_bytes()).size == 4
