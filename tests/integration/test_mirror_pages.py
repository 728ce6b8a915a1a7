"""The mirror's pages for the console: parts of names, time order both ways, previous
pages, totals and pick-lists, on SQLite and PostgreSQL (v1 rows and v2 rows whose names
are their environment's)."""

from __future__ import annotations

import base64

import pytest

from ledger.errors import InvalidInputError
from ledger.leaves.commitments import row_commitments
from ledger.leaves.environment import build_environment
from ledger.leaves.record_v2 import EnvironmentRef, build_record_v2, row_data
from ledger.record import AuditRecord, build_record
from ledger.store.mirror import SqlMirror
from ledger.store.sql import SqlLedger, make_engine
from tests.integration.conftest import ORIGIN

# (model name, driver, minute): log order is not time order (minutes 5, 1, 3, ...).
V1 = [("Llama-3 8B", "550.54.15", 5), ("llama_guard", "550.54.150", 1),
      ("llamaXguard", "560.35.03", 3), ("mistral 100%", "\u202e51.45.055", 2),
      ("Mistral 10", "550.54.15", 4)]


def v1(i: int, name: str, driver: str, minute: int, tenant: str) -> AuditRecord:
    return build_record(
        tenant=tenant, model={"name": name, "digest": f"sha256:{i:064x}", "pinned": True},
        hardware={"accelerator": "cuda", "accelerator_model": "NVIDIA H200",
                  "driver_version": driver},
        software={"torch": {"version": "2.6.0", "git_version": "c" * 40},
                  "service": {"git_revision": "d" * 40, "dirty": False}},
        data={"input_commitment": f"sha256:{i:064x}",
              "output_commitment": f"sha256:{i + 1:064x}"},
        timings_ms={"forward": 1.0}, created_at=f"2026-11-30T09:{minute:02d}:00.000Z")


@pytest.fixture()
def mirror(ledger_url: str) -> SqlMirror:
    with SqlLedger(ledger_url).start() as ledger:
        for i, (name, driver, minute) in enumerate(V1):
            ledger.append(v1(i, name, driver, minute, "bank-a" if i != 2 else "bank-b"))
        environment = build_environment(
            engine="engine-0", model={"name": "Qwen2 tiny", "digest": "sha256:" + "cd" * 32,
                                      "pinned": True},
            hardware={"accelerator": "cuda", "accelerator_model": "NVIDIA H100",
                      "driver_version": "570.86.10"},
            software={"torch": {"version": "2.6.0", "git_version": "e" * 40},
                      "service": {"git_revision": "f" * 40, "dirty": False}},
            tokenization_contract={"tokenizer_digest": "sha256:" + "01" * 32},
            generation_config_digest="sha256:" + "02" * 32)
        at = ledger.append(environment).leaf_index
        for row in range(2):
            ledger.append(build_record_v2(
                origin=ORIGIN, tenant="bank-c", engine="engine-0",
                environment=EnvironmentRef(at, environment.leaf_hash),
                commitments=row_commitments(input_salt=b"s" * 32, output_salt=b"s" * 32,
                                            prompt=f"p{row}", input_ids=[1], output="ok",
                                            output_ids=[2]),
                data=row_data(input_token_count=1, output_token_count=1, truncated=False,
                              finish_reason="stop", rows=2, padded_length=1,
                              padding_side="left", padding_count=0,
                              generation={"max_new_tokens": 4, "temperature": 0.0}),
                batch={"id": "c" * 32, "size": 2, "row": row}, timings_ms={"forward": 2.0}))
    return SqlMirror(make_engine(ledger_url))


def names(mirror: SqlMirror, **kwargs: object) -> list[str]:
    found = mirror.page(limit=100, **kwargs)  # type: ignore[arg-type]
    return [str(r.columns["model_name"]) for r in found.rows]


def test_a_part_of_a_name_matches_in_any_case_and_wildcards_are_literal(
        mirror: SqlMirror) -> None:
    assert names(mirror, contains={"model_name": "LLAMA"}) == [
        "Llama-3 8B", "llama_guard", "llamaXguard"]
    # "_" and "%" are characters: "llama_g" is not "llamaXg", "100%" is not "10".
    assert names(mirror, contains={"model_name": "llama_g"}) == ["llama_guard"]
    assert names(mirror, contains={"model_name": "100%"}) == ["mistral 100%"]
    assert names(mirror, contains={"model_name": "%"}) == ["mistral 100%"]
    # A v2 record's names are its environment's.
    assert names(mirror, contains={"model_name": "qwen", "accelerator_model": "h100"}) == [
        "Qwen2 tiny", "Qwen2 tiny"]
    # Parts and exact filters together; the count agrees with the pages.
    found = mirror.page(limit=100, contains={"driver_version": "550.54.15"},
                        filters={"tenant": "bank-a"}).rows
    assert [r.columns["driver_version"] for r in found] == ["550.54.15", "550.54.150",
                                                            "550.54.15"]
    assert mirror.count(contains={"driver_version": "550.54.15"},
                        filters={"tenant": "bank-a"}) == 3
    assert mirror.count(filters={"driver_version": "570.86.10"}) == 2  # through environments


def test_time_order_both_ways_with_next_and_previous_pages(mirror: SqlMirror) -> None:
    minutes = {name: minute for name, _, minute in V1}
    oldest_first = sorted(minutes, key=minutes.__getitem__)
    pages, cursor = [], None
    while True:
        found = mirror.page(limit=2, order="time", cursor=cursor,
                            contains={"accelerator_model": "h200"})
        pages.append(found)
        if found.next_cursor is None:
            break
        cursor = found.next_cursor
    assert [str(r.columns["model_name"]) for p in pages for r in p.rows] == oldest_first
    assert pages[0].previous_cursor is None
    # Previous from the last page gives exactly the page before it, and so on back.
    back = mirror.page(limit=2, order="time", cursor=pages[-1].previous_cursor,
                       contains={"accelerator_model": "h200"})
    assert [r.record_id for r in back.rows] == [r.record_id for r in pages[-2].rows]
    first = mirror.page(limit=2, order="time", cursor=back.previous_cursor,
                        contains={"accelerator_model": "h200"})
    assert [r.record_id for r in first.rows] == [r.record_id for r in pages[0].rows]
    assert first.previous_cursor is None and first.next_cursor is not None
    newest = mirror.page(limit=10, order="-time", contains={"accelerator_model": "h200"})
    assert [str(r.columns["model_name"]) for r in newest.rows] == oldest_first[::-1]
    # A cursor names its order: one from another order is refused, naming the field.
    with pytest.raises(InvalidInputError) as refused:
        mirror.page(limit=2, order="-time", cursor=pages[0].next_cursor)
    assert refused.value.field == "cursor"


def test_log_order_keeps_the_apis_cursor_and_pages_back(mirror: SqlMirror) -> None:
    rows, cursor = mirror.query(limit=3)
    assert cursor is not None
    assert cursor == str(rows[-1].leaf_index)  # the pattern the API document states
    # A cursor in the base64 spelling this service issued before still reads the same.
    legacy = base64.urlsafe_b64encode(f"after:{rows[-1].leaf_index}".encode()).decode()
    assert mirror.query(limit=3, cursor=legacy.rstrip("="))[0] == mirror.query(
        limit=3, cursor=cursor)[0]
    second = mirror.page(limit=3, cursor=cursor)
    assert second.previous_cursor is not None
    again = mirror.page(limit=3, cursor=second.previous_cursor)
    assert [r.leaf_index for r in again.rows] == [r.leaf_index for r in rows]


@pytest.mark.parametrize("forged", [
    base64.urlsafe_b64encode(b"after:time:99999999999999999999:1").decode(),
    base64.urlsafe_b64encode(b"before:nope:1:1").decode(), "%%%",
    # digits of other scripts: str.isdigit() took them, then int() raised (a 500)
    base64.urlsafe_b64encode("after:time:\u00b2:1".encode()).decode(),
    base64.urlsafe_b64encode("after:time:1:\u0661\u0662".encode()).decode()])
def test_a_forged_cursor_is_refused_naming_the_field(mirror: SqlMirror, forged: str) -> None:
    with pytest.raises(InvalidInputError) as refused:
        mirror.page(limit=2, order="time", cursor=forged)
    assert refused.value.field == "cursor"


def test_pick_lists_hold_only_the_tenants_own_values(mirror: SqlMirror) -> None:
    bank_a = mirror.known_values("bank-a")
    assert bank_a["model_name"] == ["Llama-3 8B", "Mistral 10", "llama_guard",
                                    "mistral 100%"]
    assert "560.35.03" not in bank_a["driver_version"]  # bank-b's driver
    assert mirror.known_values("bank-c")["accelerator_model"] == ["NVIDIA H100"]
    every = mirror.known_values()
    assert every["driver_version"] == sorted(
        {"550.54.15", "550.54.150", "560.35.03", "\u202e51.45.055", "570.86.10"})
    assert "" not in every["model_name"]  # the environment leaf is no tenant's record
