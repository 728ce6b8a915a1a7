"""The plots and the report: one plot per phase, human units, time ticks, and control
and bidi characters from the records spelled out (issue 26)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit_cli.main import main
from inference_wrapper.server.console_plots import (
    Point,
    fingerprint_changes,
    human,
    phase_charts_svg,
    time_ticks,
    timeline_svg,
)
from ledger.checkpoint import NoteSigner
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger
from tests.records import make_record

RLO = "\u202e"
BIDI_DRIVER = f"{RLO}51.45.055"  # displays as 550.54.15
START = datetime(2026, 11, 30, 9, 0)


def test_values_read_in_human_units() -> None:
    assert human(1390, "ms") == "1.39 s"
    assert human(0.2, "ms") == "200 µs"
    assert human(95, "s") == "1.58 min"
    assert human(2.5, "ms") == "2.5 ms"
    assert human(0, "ms") == "0 ms"
    assert human(1234, "") == "1,234"
    assert human(3.25, "") == "3.25"


def test_time_ticks_fall_on_round_utc_times() -> None:
    assert time_ticks(START, START + timedelta(minutes=6)) == [
        START + timedelta(minutes=m) for m in range(7)]
    late = datetime(2026, 11, 30, 9, 3, 20)
    assert time_ticks(late, datetime(2026, 11, 30, 11, 10)) == [
        datetime(2026, 11, 30, 9, 30), datetime(2026, 11, 30, 10, 0),
        datetime(2026, 11, 30, 10, 30), datetime(2026, 11, 30, 11, 0)]
    assert len(time_ticks(START, START + timedelta(days=3))) <= 7


def points() -> list[Point]:
    out = []
    for i in range(6):
        columns = {"driver_version": "550.54.15" if i < 3 else BIDI_DRIVER}
        out.append(Point(START + timedelta(minutes=i), columns,
                         {"queue": 1390.0 + i, "forward": 2.5, f"x{RLO}y": 1.0}, 4))
    return out


def test_one_plot_per_phase_with_human_units_and_ticks() -> None:
    svg = phase_charts_svg(points(), title="p50 and p99 per minute")
    phases = re.findall(r'<div class="phase" data-phase="([^"]+)">', svg)
    assert phases == ["forward", "queue", "x&lt;U+202E&gt;y", "total"]
    assert svg.count("<svg ") == 4
    queue = svg[svg.index('data-phase="queue"'):svg.index('data-phase="x')]
    assert re.findall(r"<polyline[^>]*><title>([^<]+)</title>", queue) == [
        "queue p50", "queue p99"]
    assert ">1.4 s</text>" in queue  # the axis' peak, in seconds
    assert not re.search(r"\de[+-]\d", svg)  # no "1.39e+03"
    ticks = re.findall(r'<text class="tick-label"[^>]*>([^<]+)</text>', queue)
    assert ticks == ["09:00", "09:01", "09:02", "09:03", "09:04", "09:05"]
    assert RLO not in svg


def test_the_timeline_spells_a_bidi_override() -> None:
    found = points()
    svg = timeline_svg(found, fingerprint_changes(found))
    assert "&lt;U+202E&gt;51.45.055" in svg and RLO not in svg


def test_the_report_spells_a_bidi_override_everywhere(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url)
    signer = NoteSigner("audit-ledger.test/log", Ed25519PrivateKey.generate())
    with SqlLedger(url) as ledger:
        for i in range(4):
            ledger.append(make_record(i, driver="550.54.15" if i < 2 else BIDI_DRIVER,
                                      created_at=f"2026-11-30T09:{i:02d}:00.000Z"))
        ledger.seal_checkpoint(signer, "audit-ledger.test/log")
    out = tmp_path / "pack"
    assert main(["report", "--db", url, "--log-key", signer.verifier().encode(), "--out",
                 str(out), "--from", "2026-11-30T09:00:00", "--to", "2100-01-01"]) == 0
    html = (out / "report.html").read_text()
    assert RLO not in html
    assert "<td>&lt;U+202E&gt;51.45.055</td><td>2</td>" in html  # the count per driver
    assert ("<td>driver</td><td>550.54.15</td><td>2</td><td>&lt;U+202E&gt;51.45.055</td>"
            in html)  # the change table
    assert "-&gt; &lt;U+202E&gt;51.45.055" in html  # the timeline's mark
