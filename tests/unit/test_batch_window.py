"""How long a batch waits to fill: while requests keep coming, within a cap."""

from __future__ import annotations

import pytest

from inference_wrapper.batcher import FILL_WINDOWS, fill_deadline


def test_a_lone_request_waits_one_window() -> None:
    assert fill_deadline(10.0, 10.0, 0.005) == pytest.approx(10.005)


def test_each_arrival_extends_the_window_from_itself() -> None:
    assert fill_deadline(10.0, 10.004, 0.005) == pytest.approx(10.009)


def test_the_wait_is_capped_however_long_requests_keep_coming() -> None:
    assert fill_deadline(10.0, 10.5, 0.005) == pytest.approx(10.0 + 0.005 * FILL_WINDOWS)
