"""The verifier's state file: compare-and-swap under a lock, never moved backwards."""

from __future__ import annotations

import threading
from pathlib import Path

from ledger.checkpoint import Checkpoint
from ledger.client.state import compare_and_swap, default_state_path, load_seen, save_seen
from tests.simulator import SimLog


def test_stale_expected_state_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    log = SimLog().append(8)
    path = tmp_path / "state.note"
    save_seen(path, log.note(5))
    assert not compare_and_swap(path, log.note(3), log.note(8))
    assert load_seen(path) == log.note(5)
    assert compare_and_swap(path, log.note(5), log.note(8))
    assert load_seen(path) == log.note(8)


def test_a_smaller_checkpoint_never_replaces_the_state(tmp_path: Path) -> None:
    log = SimLog().append(8)
    path = tmp_path / "state.note"
    assert compare_and_swap(path, None, log.note(8))
    assert compare_and_swap(path, log.note(8), log.note(4))  # nothing to do, not an error
    assert load_seen(path) == log.note(8)


def test_concurrent_verifiers_leave_the_largest_checkpoint(tmp_path: Path) -> None:
    log = SimLog().append(16)
    path = tmp_path / "state.note"
    barrier = threading.Barrier(8)
    sizes = [3, 16, 5, 9, 1, 12, 7, 15]

    def verifier(size: int) -> None:
        barrier.wait()
        while True:  # the CLI's loop: read, (verify), swap; on a lost race read again
            seen = load_seen(path)
            if compare_and_swap(path, seen, log.note(size)):
                return

    threads = [threading.Thread(target=verifier, args=(s,)) for s in sizes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    stored = load_seen(path)
    assert stored is not None and Checkpoint.peek(stored).size == 16


def test_one_state_file_per_origin_of_the_same_key(tmp_path: Path) -> None:
    verifier = SimLog().signer.verifier()
    first = default_state_path(verifier, "example.com/log-a", home=tmp_path)
    second = default_state_path(verifier, "example.com/log-b", home=tmp_path)
    assert first != second and first.parent == second.parent == tmp_path / "verifier"
