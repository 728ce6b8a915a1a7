"""``log fsck`` and ``audit`` over a log of batched v2 records, where most rows are opened
through their batch's layout (``BatchLayouts``): each kind of tampering is found, and
the findings are exactly those of the full path (layouts switched off), on SQLite and
PostgreSQL alike. Tampering is plain SQL, as an operator with database access would.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from ledger.anchor.local import LocalAnchor
from ledger.checkpoint import NoteSigner
from ledger.leaves import commitments
from ledger.leaves.batch_layouts import BatchLayouts
from ledger.leaves.body_codec import pack_body, unpack_body
from ledger.leaves.envelope import Leaf, tenant_tag
from ledger.leaves.environment import build_environment
from ledger.leaves.record_v2 import EnvironmentRef, RowFacts, build_records_v2
from ledger.store.fsck import fsck
from ledger.store.sql import SqlLedger
from tests.cli_runs import cli_json
from tests.integration.conftest import ORIGIN

BATCHES, ROWS = 3, 8
TARGET = 2 + ROWS + 6  # after the two environments: batch 1, row 6 (its layout is made)


@pytest.fixture(autouse=True)
def verifier_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUDIT_LEDGER_HOME", str(tmp_path / "home"))


def _environment(accelerator_model: str) -> Leaf:
    return build_environment(
        engine="engine-0", model={"name": "tiny-llama", "digest": "sha256:" + "cd" * 32,
                                  "pinned": True},
        hardware={"accelerator": "cuda", "accelerator_model": accelerator_model,
                  "driver_version": "560.35.03"},
        software={"torch": {"version": "2.6.0", "git_version": "e" * 40},
                  "service": {"git_revision": "f" * 40, "dirty": False}},
        tokenization_contract={"tokenizer_digest": "sha256:" + "01" * 32},
        generation_config_digest="sha256:" + "02" * 32)


def _facts(row: int, stream_start: str | None = None) -> RowFacts:
    salt = bytes([row]) * 32
    return RowFacts(
        tenant=f"tenant-{row % 2}", commitments=commitments.row_commitments(
            input_salt=salt, output_salt=salt, prompt=f"p{row}", input_ids=[row] * (row + 1),
            output="o", output_ids=[1]),
        input_token_count=row + 1, output_token_count=1, truncated=False,
        finish_reason="length", padding_count=ROWS - row - 1, parse_ms=0.047 + row,
        stream_start_record_id=stream_start)


def _build(url: str, signer: NoteSigner, forged_batch: int | None = None,
           streamed_batch: int | None = None) -> list[Leaf]:
    """Leaf 0: the engine's environment, leaf 1: another one; then BATCHES batches. The
    ``forged_batch`` names leaf 0 with leaf 1's hash; each row of ``streamed_batch``
    names a stream start the log does not hold."""
    declared, other = _environment("NVIDIA H200"), _environment("NVIDIA A100")
    leaves = [declared, other]
    for batch in range(BATCHES):
        named = other if batch == forged_batch else declared
        leaves += build_records_v2(
            origin=ORIGIN, engine="engine-0", environment=EnvironmentRef(0, named.leaf_hash),
            batch_id=f"{batch:032x}", padded_length=ROWS, padding_side="left",
            generation={"max_new_tokens": 24, "temperature": 0},
            timings_ms={"forward": 12.25},
            rows=[_facts(row, f"start-{row}" if batch == streamed_batch else None)
                  for row in range(ROWS)])
    with SqlLedger(url).start() as ledger:
        for leaf in leaves:
            ledger.append(leaf)
        sealed = ledger.seal_checkpoint(signer, ORIGIN)
        assert sealed is not None
        LocalAnchor(ledger, signer.verifier(), ORIGIN).anchor(sealed.note)
    return leaves


def _sql(url: str, statement: str, **values: Any) -> None:
    with SqlLedger(url) as ledger, ledger.engine.begin() as conn:
        conn.execute(text(statement), values)


def shadow_copy(url: str) -> str:
    """An untampered copy of a PostgreSQL log's records in another schema, and a URL
    whose options put that schema first on the search path (for tests that each reader
    sees the tables the others see)."""
    from urllib.parse import quote

    from sqlalchemy import create_engine

    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("CREATE SCHEMA shadow"))
        conn.execute(text("CREATE TABLE shadow.records AS SELECT * FROM public.records"))
    engine.dispose()
    return url + "?options=" + quote("-csearch_path=shadow,public")


def _stored_body(url: str, leaf_index: int) -> bytes:
    with SqlLedger(url) as ledger:
        row = ledger.record_at(leaf_index)
    assert row is not None and row.stored_body is not None
    return unpack_body(row.stored_body)


def _edit_body_byte(url: str) -> None:
    body = _stored_body(url, TARGET)
    at = body.index(b'"output":"hmac-sha256:') + len(b'"output":"hmac-sha256:')
    edited = body[:at] + (b"1" if body[at:at + 1] == b"0" else b"0") + body[at + 1:]
    _sql(url, "UPDATE records SET body = :b WHERE leaf_index = :i", b=pack_body(edited),
         i=TARGET)


def _edit_envelope_byte(url: str) -> None:
    with SqlLedger(url) as ledger:
        row = ledger.record_at(TARGET)
    assert row is not None
    at = row.canonical.index(b"sha256:") + len(b"sha256:")
    edited = row.canonical[:at] + (b"1" if row.canonical[at:at + 1] == b"0" else b"0") \
        + row.canonical[at + 1:]
    _sql(url, "UPDATE records SET canonical = :c WHERE leaf_index = :i", c=edited, i=TARGET)


def _edit_envelope_tag(url: str) -> None:
    """The envelope names another tenant's tag (its body's digest kept)."""
    with SqlLedger(url) as ledger:
        row = ledger.record_at(TARGET)
    assert row is not None
    tag = row.canonical.index(b'"tenant_tag":"sha256:') + len(b'"tenant_tag":"sha256:')
    other = tenant_tag(ORIGIN, "tenant-9").removeprefix("sha256:").encode("ascii")
    edited = row.canonical[:tag] + other + row.canonical[tag + 64:]
    _sql(url, "UPDATE records SET canonical = :c WHERE leaf_index = :i", c=edited, i=TARGET)


TAMPERING: dict[str, tuple[Callable[[str], None], list[str], list[str]]] = {
    # name: (what is done, fsck's finding kinds, audit's finding kinds)
    "a body byte": (_edit_body_byte, ["record_unparseable"], ["record_unparseable"]),
    "an envelope byte": (_edit_envelope_byte, ["record_altered"],
                         ["record_unparseable", "root_mismatch"]),
    "the envelope's tenant tag": (_edit_envelope_tag, ["record_altered"],
                                  ["record_unparseable", "root_mismatch"]),
    "the tenant column": (lambda url: _sql(
        url, "UPDATE records SET tenant = 'tenant-1' WHERE leaf_index = :i", i=TARGET),
        ["column_mismatch"], ["column_mismatch"]),
    "a filter column a v2 row leaves to its environment": (lambda url: _sql(
        url, "UPDATE records SET model_name = 'other' WHERE leaf_index = :i", i=TARGET),
        ["column_mismatch"], ["column_mismatch"]),
    "the environment index column": (lambda url: _sql(
        url, "UPDATE records SET environment_index = 1 WHERE leaf_index = :i", i=TARGET),
        ["column_mismatch"], ["column_mismatch"]),
    "the record id column": (lambda url: _sql(
        url, "UPDATE records SET record_id = 'another-id' WHERE leaf_index = :i", i=TARGET),
        ["column_mismatch"], ["column_mismatch"]),
    "the time column": (lambda url: _sql(
        url, "UPDATE records SET created_at = :t WHERE leaf_index = :i",
        t=datetime(2001, 2, 3, 4, 5, 6), i=TARGET), ["column_mismatch"], ["column_mismatch"]),
    "a stored body that does not inflate": (lambda url: _sql(
        url, "UPDATE records SET body = :b WHERE leaf_index = :i", b=b"\x01\xff\x00",
        i=TARGET), ["record_unparseable"], ["record_unparseable"]),
    "a deleted row": (lambda url: _sql(url, "DELETE FROM records WHERE leaf_index = :i",
                                       i=TARGET), ["record_missing"], ["rows_missing"]),
    "the environments row": (lambda url: _sql(
        url, "UPDATE environments SET accelerator_model = 'NVIDIA A100' WHERE leaf_index = 0"),
        [], ["environment_mismatch"]),
}


def _findings(url: str, signer: NoteSigner, capsys: pytest.CaptureFixture[str]
              ) -> tuple[list[tuple[str, str, str]], list[dict[str, Any]]]:
    with SqlLedger(url) as ledger:
        report = fsck(ledger, signer.verifier())
    _, audited = cli_json(capsys, "audit", "--db", url, "--from", "2000-01-01", "--to",
                          "2100-01-01", "--log-key", signer.verifier().encode(), "--no-state")
    return [(f.kind, f.where, f.detail) for f in report.findings], audited["findings"]


def _full_path_findings(url: str, signer: NoteSigner, capsys: pytest.CaptureFixture[str],
                        monkeypatch: pytest.MonkeyPatch
                        ) -> tuple[list[tuple[str, str, str]], list[dict[str, Any]]]:
    with monkeypatch.context() as patched:
        patched.setattr(BatchLayouts, "read", lambda self, body: None)
        return _findings(url, signer, capsys)


def _count_layout_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    decided = [0]
    read = BatchLayouts.read

    def counted(self: BatchLayouts, body: bytes) -> dict[str, Any] | None:
        content = read(self, body)
        decided[0] += content is not None
        return content
    monkeypatch.setattr(BatchLayouts, "read", counted)
    return decided


def test_a_clean_batched_log_passes_with_most_rows_read_through_layouts(
        ledger_url: str, signer: NoteSigner, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    _build(ledger_url, signer)
    decided = _count_layout_reads(monkeypatch)
    assert _findings(ledger_url, signer, capsys) == ([], [])
    # fsck and audit each: all but the first row of each batch (its layout is made from
    # that row, since the row says its batch has others)
    assert decided[0] == 2 * BATCHES * (ROWS - 1)


@pytest.mark.parametrize("tampering", list(TAMPERING), ids=list(TAMPERING))
def test_tampering_is_found_as_by_the_full_path(
        tampering: str, ledger_url: str, signer: NoteSigner,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _build(ledger_url, signer)
    tamper, fsck_kinds, audit_kinds = TAMPERING[tampering]
    tamper(ledger_url)
    full = _full_path_findings(ledger_url, signer, capsys, monkeypatch)
    decided = _count_layout_reads(monkeypatch)
    found = _findings(ledger_url, signer, capsys)
    assert decided[0] > 0  # the layouts did decide rows here
    assert found == full
    fsck_found, audit_found = found
    assert [kind for kind, _, _ in fsck_found] == fsck_kinds
    assert [f["kind"] for f in audit_found] == audit_kinds
    if fsck_found and tampering != "a deleted row":
        assert fsck_found[0][1].startswith(f"leaf {TARGET} (record ")
    if tampering != "a deleted row" and audit_found[0]["leaf_index"] is not None:
        assert audit_found[0]["leaf_index"] in (TARGET, 0)


def test_a_batch_naming_another_environments_hash_is_found_on_every_row(
        ledger_url: str, signer: NoteSigner, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    leaves = _build(ledger_url, signer, forged_batch=2)
    full = _full_path_findings(ledger_url, signer, capsys, monkeypatch)
    decided = _count_layout_reads(monkeypatch)
    found = _findings(ledger_url, signer, capsys)
    assert decided[0] > 0 and found == full
    forged = range(2 + 2 * ROWS, 2 + 3 * ROWS)
    assert [(kind, where) for kind, where, _ in found[0]] == [
        ("environment_mismatch", f"leaf {i} (record {leaves[i].record_id})") for i in forged]
    assert [(f["kind"], f["leaf_index"]) for f in found[1]] == [
        ("environment_mismatch", i) for i in forged]


def test_streamed_records_naming_starts_the_log_lacks_are_found_on_every_row(
        ledger_url: str, signer: NoteSigner, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    _build(ledger_url, signer, streamed_batch=1)
    full = _full_path_findings(ledger_url, signer, capsys, monkeypatch)
    decided = _count_layout_reads(monkeypatch)
    found = _findings(ledger_url, signer, capsys)
    assert decided[0] > 0 and found == full
    fsck_found, audit_found = found
    assert [kind for kind, _, _ in fsck_found] == ["stream_start_mismatch"] * ROWS
    assert [f["kind"] for f in audit_found] == ["stream_start_mismatch"] * ROWS
