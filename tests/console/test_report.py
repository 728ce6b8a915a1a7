"""`audit-ledger report`: the evidence pack over a time range, from a real SQLite ledger."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from html import unescape
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import update

from audit_cli.main import main
from ledger.anchor.local import LocalAnchor
from ledger.checkpoint import NoteSigner
from ledger.store.migrate import upgrade
from ledger.store.schema import records
from ledger.store.sql import SqlLedger
from tests.console.conftest import synthetic

ORIGIN = "audit-ledger.test/log"
RANGE = ["--from", "2026-11-30T09:00:00", "--to", "2026-11-30T10:00:00"]


@pytest.fixture()
def ledger_db(tmp_path: Path) -> tuple[str, str]:
    """Seven records over two drivers and two tenants, sealed, anchored locally."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url)
    signer = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    with SqlLedger(url) as ledger:
        for i in range(7):
            ledger.append(synthetic(i))
        sealed = ledger.seal_checkpoint(signer, ORIGIN)
        assert sealed is not None
        LocalAnchor(ledger, signer.verifier(), ORIGIN).anchor(sealed.note)
    return url, signer.verifier().encode()


def report(url: str, key: str, out: Path, *extra: str) -> int:
    return main(["report", "--db", url, "--log-key", key, "--out", str(out), *extra])


def test_complete_pack_has_scope_checkpoints_counts_and_timeline(
        ledger_db: tuple[str, str], tmp_path: Path) -> None:
    url, key = ledger_db
    out = tmp_path / "pack"
    # The checkpoint was sealed now, not in the records' hour: the range reaches it.
    assert report(url, key, out, "--from", "2026-11-30T09:00:00", "--to", "2100-01-01") == 0
    html = (out / "report.html").read_text()
    assert 'id="audit-verdict">COMPLETE: 7 records in range' in html
    assert '<p id="record-count">7 records in scope.</p>' in html
    assert "<td>bank-a</td><td>4</td>" in html and "<td>bank-b</td><td>3</td>" in html
    assert "<td>NVIDIA H200</td><td>7</td>" in html
    assert re.search(r"<td>7</td><td>[0-9a-f]{64}</td><td>[^<]+</td><td>valid</td>", html)
    assert "<td>local</td><td>local:7</td>" in html
    assert ("<td>driver</td><td>550.54.15</td><td>4</td><td>560.35.03</td><td>3</td>"
            in html)
    assert key in html
    assert "<title>forward p99</title>" in html  # latency from the records' own timings
    assert "<title>seal to anchor</title>" in html  # the checkpoint sealed and anchored
    for obligation in ("EU AI Act Art. 12", "EU AI Act Art. 19", "SR 11-7", "SEC 17a-4(f)"):
        assert f"<td>{obligation}" in html
    assert main(["verify", "--bundle", str(out / "bundle.json"), "--log-key", key,
                 "--no-state", "--accept-self-anchored"]) == 0
    digest, name = (out / "report.html.sha256").read_text().split()
    assert name == "report.html"
    assert digest == "sha256:" + hashlib.sha256((out / "report.html").read_bytes()).hexdigest()


def test_tenant_scope_counts_only_that_tenant(ledger_db: tuple[str, str],
                                              tmp_path: Path) -> None:
    url, key = ledger_db
    assert report(url, key, tmp_path / "pack", *RANGE, "--tenant", "bank-b") == 0
    html = (tmp_path / "pack" / "report.html").read_text()
    assert '<p id="record-count">3 records in scope.</p>' in html
    assert "<td>bank-a</td>" not in html


def test_edited_mirror_row_makes_the_pack_say_not_complete(ledger_db: tuple[str, str],
                                                           tmp_path: Path) -> None:
    url, key = ledger_db
    with SqlLedger(url) as ledger, ledger.engine.begin() as conn:
        conn.execute(update(records).where(records.c.leaf_index == 2)
                     .values(driver_version="999.0"))
    assert report(url, key, tmp_path / "pack", *RANGE) == 1
    html = (tmp_path / "pack" / "report.html").read_text()
    assert 'class="bad" id="audit-verdict">NOT COMPLETE' in html
    assert "<td>column_mismatch</td><td>2</td>" in html
    # The obligations table states what was found: never that no record is missing.
    table = obligation_rows(html)
    assert table["EU AI Act Art. 12 (record-keeping)"][2] == "NOT shown"
    assert "NOT COMPLETE" in table["EU AI Act Art. 12 (record-keeping)"][3]
    assert table["SEC 17a-4(f) (electronic records)"][2] == "NOT shown"
    assert "found all" not in html and "no record is missing" not in html


def obligation_rows(html: str) -> dict[str, list[str]]:
    table = re.search(r'<table id="obligations">(.*?)</table>', html, re.S)
    assert table is not None
    rows = [re.findall(r"<td>(.*?)</td>", row, re.S)
            for row in re.findall(r"<tr>(.*?)</tr>", table.group(1), re.S)]
    return {row[0]: row for row in rows if row}


def test_a_complete_pack_says_so_row_by_row_with_an_erasure_row(
        ledger_db: tuple[str, str], tmp_path: Path) -> None:
    url, key = ledger_db
    assert report(url, key, tmp_path / "pack", "--from", "2026-11-30T09:00:00",
                  "--to", "2100-01-01") == 0
    table = obligation_rows((tmp_path / "pack" / "report.html").read_text())
    assert table["EU AI Act Art. 12 (record-keeping)"][2] == "shown"
    assert "found all 7 records" in table["EU AI Act Art. 12 (record-keeping)"][3]
    assert table["EU AI Act Art. 19 (keeping the logs)"][2] == "shown"
    assert table["GDPR Art. 17 (right to erasure)"][2] == "none in range"


def test_another_pinned_key_writes_no_pack_and_fails(ledger_db: tuple[str, str],
                                                     tmp_path: Path) -> None:
    url, _ = ledger_db
    other = NoteSigner(ORIGIN, Ed25519PrivateKey.generate()).verifier().encode()
    assert report(url, other, tmp_path / "pack", *RANGE) == 1
    assert not (tmp_path / "pack").exists()


def test_range_that_ends_before_it_starts_is_a_usage_error(ledger_db: tuple[str, str],
                                                            tmp_path: Path) -> None:
    url, key = ledger_db
    assert report(url, key, tmp_path / "pack", "--from", "2026-11-30T10:00:00",
                  "--to", "2026-11-30T09:00:00") == 2


def page_images(pdf: Path, folder: Path) -> list[Path]:
    """Each page of the PDF as a greyscale image (pdftoppm, poppler-utils)."""
    pdftoppm = shutil.which("pdftoppm")
    assert pdftoppm, "poppler-utils is missing: run `make setup`"
    prefix = folder / (pdf.stem + "-page")
    subprocess.run([pdftoppm, "-r", "40", "-gray", str(pdf), str(prefix)], check=True,
                   timeout=300, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return sorted(folder.glob(prefix.name + "*.pgm"))


def read_pgm(page: Path) -> tuple[int, int, bytes]:
    data = page.read_bytes()
    # Binary PGM: "P5", width, height, max value, one whitespace, then one byte a pixel.
    fields = data.split(maxsplit=4)
    assert fields[0] == b"P5"
    width, height = int(fields[1]), int(fields[2])
    return width, height, data[len(data) - width * height:]


def ink_at_the_edges(pages: list[Path]) -> list[str]:
    """The pages with ink in the outer strips of the side margins, where nothing is laid
    out: text or a table that runs off the page puts ink there."""
    found = []
    for page in pages:
        width, height, pixels = read_pgm(page)
        strip = max(2, width // 60)  # about 3.5 mm of the 14 mm side margins
        if any(pixels[y * width + x] < 128 for y in range(height)
               for x in (*range(strip), *range(width - strip, width))):
            found.append(page.name)
    return found


def cells_cut_off(html: str, pdf: Path) -> list[str]:
    """The table cells of ``html`` whose text is not whole in the PDF's text: Chromium
    clips what runs past the page's content box (no ink reaches the edge), so a table
    that overflows loses text. Whitespace is ignored (a wrapped cell breaks lines)."""
    pdftotext = shutil.which("pdftotext")
    assert pdftotext, "poppler-utils is missing: run `make setup`"
    printed = subprocess.run([pdftotext, "-raw", str(pdf), "-"], check=True,
                             capture_output=True, text=True, timeout=300).stdout
    whole = re.sub(r"\s+", "", printed)
    cells = (re.sub(r"\s+", "", unescape(re.sub(r"<[^>]+>", "", cell)))
             for cell in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", html, re.S))
    return [cell for cell in cells if cell not in whole]


def test_the_overflow_check_fails_on_a_table_that_overflows_and_passes_the_real_layout(
        ledger_db: tuple[str, str], tmp_path: Path) -> None:
    """The PDF check must be able to fail: the real report with one wide table (an
    unbroken 600-character digest) printed twice, with the layout's wrapping rules and
    without them. Without them the table runs off the page (Chromium cuts it at the
    margin) and the check names the cut cell; with them every cell is whole."""
    from audit_cli.cmd_report import _table, print_pdf

    url, key = ledger_db
    out = tmp_path / "pack"
    assert report(url, key, out, *RANGE) == 0
    wide = _table(("what", "value"), [("model digest", "sha256:" + "ab" * 300)], "")
    html = (out / "report.html").read_text().replace("</body>", wide + "</body>")
    wrapping = ("table { width: 100%; table-layout: fixed; } "
                "th, td { overflow-wrap: anywhere; word-break: break-word; } ")
    assert wrapping in html
    cut = {}
    for name, text in (("real", html), ("unwrapped", html.replace(wrapping, ""))):
        (tmp_path / f"{name}.html").write_text(text)
        print_pdf(tmp_path / f"{name}.html", tmp_path / f"{name}.pdf")
        cut[name] = cells_cut_off(text, tmp_path / f"{name}.pdf")
    assert cut["unwrapped"] == ["sha256:" + "ab" * 300]  # the overflow is caught
    assert cut["real"] == []


@pytest.mark.parametrize(("paper", "points"), [("A4", (595, 842)), ("Letter", (612, 792))])
def test_the_report_prints_to_a_pdf_whose_pages_render(
        ledger_db: tuple[str, str], tmp_path: Path, paper: str,
        points: tuple[int, int]) -> None:
    """--pdf prints with the system Chromium; pdftoppm (poppler-utils) turns each page
    into a greyscale image: every page carries ink, none in the outer margin strips;
    every table cell is whole in the PDF's text (Chromium cuts a table that runs off the
    page: the test below shows this check failing on one), and each page is numbered."""
    url, key = ledger_db
    out = tmp_path / "pack"
    assert report(url, key, out, *RANGE, "--pdf", "--paper", paper) == 0
    pdf = (out / "report.pdf").read_bytes()
    assert pdf.startswith(b"%PDF-")
    sizes = {tuple(round(float(v)) for v in m.groups())
             for m in re.finditer(rb"/MediaBox \[0 0 ([\d.]+) ([\d.]+)\]", pdf)}
    assert sizes == {points}
    pages = page_images(out / "report.pdf", tmp_path)
    assert len(pages) >= 2  # scope to obligations does not fit on one page
    for page in pages:
        width, height, pixels = read_pgm(page)
        dark = sum(1 for value in pixels if value < 128)
        assert dark > width * height // 1000, f"{page.name} looks blank"
    assert ink_at_the_edges(pages) == [], "text or a table runs off the page"
    assert cells_cut_off((out / "report.html").read_text(), out / "report.pdf") == []
    pdftotext = shutil.which("pdftotext")
    assert pdftotext, "poppler-utils is missing: run `make setup`"
    text = subprocess.run([pdftotext, "-layout", str(out / "report.pdf"), "-"], check=True,
                          capture_output=True, text=True, timeout=300).stdout
    for number in range(1, len(pages) + 1):
        assert f"page {number} of {len(pages)}" in text


BLOCK_SERVING_STACK = """
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("aiohttp", "torch", "transformers", "prometheus_client",
                                  "opentelemetry", "grpc"):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Absent())
from audit_cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_report_runs_on_the_auditor_install_without_the_serving_stack(
        ledger_db: tuple[str, str], tmp_path: Path) -> None:
    """The base install has no aiohttp (nor the model stack): `report` must not need it."""
    url, key = ledger_db
    out = tmp_path / "pack"
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", BLOCK_SERVING_STACK, "report", "--db", url,
                           "--log-key", key, "--out", str(out), *RANGE, "--no-log"],
                          cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout
    assert (out / "report.html").is_file()
