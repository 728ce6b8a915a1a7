"""The anchor store on SQLite and PostgreSQL: the anchor row and the mirror's references
are written in one transaction; every row still without a reference is covered; the
integrator's seal wakes the anchoring worker (no polling gap)."""

from __future__ import annotations

import threading
from typing import Any

from ledger.anchor.local import LocalAnchor
from ledger.anchor.worker import AnchorWorker
from ledger.checkpoint import NoteSigner
from ledger.store.anchors import MemoryAnchorStore, SqlAnchorStore
from ledger.store.integrator import Integrator
from ledger.store.sql import SqlLedger
from tests.integration.conftest import ORIGIN
from tests.records import make_record


def _grow(ledger: SqlLedger, start: int, count: int) -> None:
    for i in range(start, start + count):
        ledger.append(make_record(i))


def test_record_covers_every_unreferenced_row_below_the_size(ledger_url: str,
                                                             signer: NoteSigner) -> None:
    with SqlLedger(ledger_url) as ledger:
        _grow(ledger, 0, 6)
        store = SqlAnchorStore(ledger.engine)
        first = store.record(2, b"note-2", "fabric", "fabric:c:tx2:1")
        assert first.size == 2 and store.unreferenced_below(6) == 4
        # Size 4 is never recorded (its commit status was lost): size 6 covers rows 2..5.
        store.record(6, b"note-6", "fabric", "fabric:c:tx6:3")
        refs = [ledger.record_at(i).anchor_ref for i in range(6)]  # type: ignore[union-attr]
        assert refs == ["fabric:c:tx2:1"] * 2 + ["fabric:c:tx6:3"] * 4
        # Recording a size again changes nothing and answers what is stored.
        again = store.record(6, b"other", "fabric", "fabric:c:other:9")
        assert again.ref == "fabric:c:tx6:3" and store.latest() == again


def test_a_seal_wakes_the_worker(ledger_url: str, signer: NoteSigner) -> None:
    """The worker's interval is an hour: only the integrator's wake-up can anchor."""
    with SqlLedger(ledger_url) as ledger:
        anchor = LocalAnchor(ledger, signer.verifier(), ORIGIN)
        anchored = threading.Event()
        original = anchor.anchor

        def anchor_and_tell(note: bytes) -> Any:
            result = original(note)
            anchored.set()
            return result

        anchor.anchor = anchor_and_tell  # type: ignore[method-assign]
        worker = AnchorWorker(ledger, anchor, interval_s=3600)
        first_run = threading.Event()
        run_once = worker.run_once

        def run_and_tell() -> bool:
            result = run_once()
            first_run.set()
            return result

        worker.run_once = run_and_tell  # type: ignore[method-assign]
        integrator = Integrator(ledger, signer, ORIGIN, interval_s=3600)
        integrator.subscribe(worker.wake)
        worker.start()
        try:
            # The worker's start-up run is over (nothing to anchor); it now sleeps for
            # an hour unless woken.
            assert first_run.wait(timeout=120)
            _grow(ledger, 0, 3)
            integrator.seal_now()
            assert anchored.wait(timeout=120), "the seal did not wake the worker"
            assert worker.status().backlog == 0 and worker.status().anchored_size == 3
        finally:
            worker.stop()
            integrator.lease.release()


def test_memory_twin_behaves_like_the_sql_store() -> None:
    store = MemoryAnchorStore(rows=5)
    assert store.unreferenced_below(5) == 5
    store.record(2, b"n2", "local", "local:2")
    assert store.unreferenced_below(5) == 3 and store.unreferenced_below(2) == 0
    store.record(5, b"n5", "local", "local:5")
    assert store.record(5, b"x", "local", "local:x").ref == "local:5"
    latest = store.latest()
    assert latest is not None and latest.size == 5 and store.unreferenced_below(5) == 0
