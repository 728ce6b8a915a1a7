"""How long a batch waits to fill: while requests keep coming, within a cap."""

from __future__ import annotations

import pytest

from inference_wrapper.audit.batcher import FILL_WINDOWS, fill_deadline


def test_a_lone_request_waits_one_window() -> None:
    assert fill_deadline(10.0, 10.0, 0.005) == pytest.approx(10.005)


def test_each_arrival_extends_the_window_from_itself() -> None:
    assert fill_deadline(10.0, 10.004, 0.005) == pytest.approx(10.009)


def test_the_wait_is_capped_however_long_requests_keep_coming() -> None:
    assert fill_deadline(10.0, 10.5, 0.005) == pytest.approx(10.0 + 0.005 * FILL_WINDOWS)


def test_a_batcher_shortens_the_gil_switch_interval_until_it_has_drained() -> None:
    """Decision 25: lowered while batching (never raised), the process's own value back
    after the drain; ``None`` leaves it alone. Decision 55: only with a model on a thread
    of this process; engine processes leave it alone."""
    import asyncio
    import sys
    import types

    from inference_wrapper.audit.batcher import GIL_SWITCH_INTERVAL_S, Batcher
    from inference_wrapper.engine.inprocess import InProcessEngine

    # Never asked to generate here: only its kind matters, so no model is loaded.
    in_process = InProcessEngine.__new__(InProcessEngine)
    elsewhere = types.SimpleNamespace(engine_id="engine-0")  # an engine process's client

    async def run(interval: float | None, engine: object = in_process) -> float:
        generator = types.SimpleNamespace(engines=[engine])  # no batch ever runs here
        batcher = Batcher(generator, object(), gil_switch_interval_s=interval)  # type: ignore[arg-type]
        batcher.start()
        during = sys.getswitchinterval()
        await batcher.drain(timeout_s=5.0)
        return during

    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        assert asyncio.run(run(GIL_SWITCH_INTERVAL_S)) == pytest.approx(GIL_SWITCH_INTERVAL_S)
        assert sys.getswitchinterval() == pytest.approx(0.005)
        assert asyncio.run(run(None)) == pytest.approx(0.005)
        assert asyncio.run(run(GIL_SWITCH_INTERVAL_S, elsewhere)) == pytest.approx(0.005)
        sys.setswitchinterval(0.0001)  # already lower: never raised
        assert asyncio.run(run(GIL_SWITCH_INTERVAL_S)) == pytest.approx(0.0001)
    finally:
        sys.setswitchinterval(before)
