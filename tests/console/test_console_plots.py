"""The plots and the report: one plot per phase, human units, time ticks, and control
and bidi characters from the records spelled out (issue 26)."""

from __future__ import annotations

import asyncio
import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

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


# --- v2 records: fingerprints from the environment leaf each one names --------------------

ORIGIN = "audit-ledger.test/log"


def _v2_log(url: str) -> None:
    """3 v1 records, environment A (leaf 3), v2 records 4-7 naming it, environment B
    (leaf 8, model B and driver B), v2 records 9-11 naming B; tenants alternate."""
    from tests.mixed_log import append_all, mixed_leaves

    append_all(url, mixed_leaves(ORIGIN, 12, lambda i: START + timedelta(minutes=i), v1=3,
                                 switch=8))


def _change_row(what: str, before: str, count_before: int, after: str, count_after: int,
                ) -> str:
    return (f"<td>{what}</td><td><code>{before}</code></td><td>{count_before}</td>"
            f"<td><code>{after}</code></td><td>{count_after}</td>")


async def test_an_environment_change_between_v2_records_is_in_the_console_change_table(
        aiohttp_client: Any, tmp_path: Path, tiny_generator: Any) -> None:
    from inference_wrapper.server.app import KEYS, create_app
    from inference_wrapper.server.settings import Settings
    from tests.console.conftest import sign_in
    from tests.mixed_log import DRIVER_A, DRIVER_B, MODEL_A, MODEL_B

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    await asyncio.to_thread(_v2_log, url)  # append_all runs its own event loop
    app = create_app(Settings(database_url=url, log_key_path=tmp_path / "log.key",
                              origin=ORIGIN, max_wait_ms=5.0), tiny_generator)
    client = await aiohttp_client(app)
    assert (await sign_in(client, app[KEYS].create("audit-firm", "auditor")[0])).status == 303
    page = await (await client.get("/console/plots?since=2026-11-30T08:00"
                                   "&until=2026-11-30T10:00")).text()
    # The v2 records 4-7 under environment A, then 9-11 under B.
    assert _change_row("driver", DRIVER_A, 4, DRIVER_B, 3) in page
    assert _change_row("model digest", MODEL_A, 4, MODEL_B, 3) in page
    # The v1 records (driver 550.54.15) before the first environment: a change too.
    assert _change_row("driver", "550.54.15", 3, DRIVER_A, 4) in page


def test_an_environment_change_between_v2_records_is_in_the_report_change_table(
        tmp_path: Path) -> None:
    from tests.mixed_log import DRIVER_A, DRIVER_B, MODEL_A, MODEL_B

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    _v2_log(url)
    signer = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    with SqlLedger(url) as ledger:
        ledger.create_log_meta(ORIGIN, signer.verifier().encode())
        ledger.seal_checkpoint(signer, ORIGIN)
    out = tmp_path / "pack"
    assert main(["report", "--db", url, "--log-key", signer.verifier().encode(), "--out",
                 str(out), "--from", "2026-11-30T08:00:00", "--to", "2026-11-30T10:00:00"]) == 0
    html = (out / "report.html").read_text()
    assert (f"<td>driver</td><td>{DRIVER_A}</td><td>4</td><td>{DRIVER_B}</td><td>3</td>"
            in html)
    assert (f"<td>model digest</td><td>{MODEL_A}</td><td>4</td><td>{MODEL_B}</td><td>3</td>"
            in html)
