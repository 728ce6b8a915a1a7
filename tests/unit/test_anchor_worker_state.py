"""The anchoring worker keeps what ``run_once`` read as its state: after anchoring, the
loop does not query the state again, so what routes and metrics show must already be
right (``current()`` reads no database)."""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger.anchor.local import LocalAnchor
from ledger.anchor.worker import AnchorWorker
from ledger.checkpoint import NoteSigner
from ledger.store.memory import MemoryLog
from tests.records import make_record

ORIGIN = "twin.example/log"


def test_the_state_after_anchoring_comes_from_what_run_once_read() -> None:
    log = MemoryLog()
    signer = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    for index in range(3):
        log.append(make_record(index))
    log.seal_checkpoint(signer, ORIGIN)
    worker = AnchorWorker(log, LocalAnchor(log, signer.verifier(), ORIGIN))
    assert worker.status().backlog == 1
    assert worker.run_once()
    shown = worker.current()  # no query: what run_once left
    assert (shown.anchored_size, shown.newest_size, shown.backlog, shown.lag_s) == (3, 3, 0, 0)
    log.append(make_record(3))
    log.seal_checkpoint(signer, ORIGIN)
    assert worker.status().backlog == 1  # a new checkpoint is pending until anchored
    assert worker.run_once()
    assert (worker.current().anchored_size, worker.current().backlog) == (4, 0)
    assert not worker.run_once()  # nothing new: the state read says so too
    assert (worker.current().anchored_size, worker.current().backlog) == (4, 0)
    read = worker.status()  # the database agrees with what was kept
    assert (read.anchored_size, read.newest_size, read.backlog) == (4, 4, 0)
