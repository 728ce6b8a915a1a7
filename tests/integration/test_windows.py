"""Proved windows: a query over [since, until) read through the tiles, checked against
the signed and witnessed checkpoint, filtered locally and declared complete; the offline
window bundle and what dropping a leaf from it does; a tenant's auditor proving its own
window over v2 envelopes without receiving any other tenant's record."""

from __future__ import annotations

import copy
import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit_cli.windows import leaf_filter
from ledger.checkpoint import Checkpoint, NoteSigner
from ledger.client.tiles import HttpTiles, TiledLog
from ledger.cosignature import Cosigner, add_cosignatures
from ledger.errors import BackendUnavailableError
from ledger.publish.directory import DirectorySink
from ledger.publish.publisher import publish
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger
from tests.cli_runs import cli_text
from tests.records import make_record
from tests.tiles_service import tiles_service
from tests.tiny_log import build_log
from tests.vectors.make_leaf_vectors import INPUTS, build

ORIGIN = "windows.test/log"
BASE = datetime(2026, 11, 3, 8, 0, 0)
COUNT = 600
SINCE, UNTIL = BASE + timedelta(seconds=100 * 30), BASE + timedelta(seconds=400 * 30)


def _when(i: int) -> datetime:
    return BASE + timedelta(seconds=30 * i)  # one record every 30 s: the lag is 10 leaves


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _v1(i: int) -> bytes:
    return make_record(i, tenant="bank-b" if i % 2 else "bank-a", padding=20,
                       created_at=_stamp(_when(i))).canonical


@pytest.fixture(autouse=True)
def own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's verifier state files in its own folder."""
    monkeypatch.setenv("AUDIT_LEDGER_HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def keys() -> tuple[NoteSigner, Cosigner]:
    return (NoteSigner(ORIGIN, Ed25519PrivateKey.generate()),
            Cosigner("witness.test", Ed25519PrivateKey.generate()))


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory, keys: Any) -> Path:
    """600 v1 records, checkpoint 600 cosigned by one witness, published as tiles."""
    signer, witness = keys
    folder = tmp_path_factory.mktemp("window")
    url = f"sqlite:///{folder / 'log.db'}"
    upgrade(url)
    [note] = build_log(url, COUNT, signer, ORIGIN, leaf=_v1, created_at=_when)
    body = Checkpoint.peek(note).body()
    note = add_cosignatures(note, [witness.cosign(body, 1_790_000_000)])
    ledger = SqlLedger(url)
    publish(ledger.tiles, note, DirectorySink(folder / "tlog"))
    ledger.engine.dispose()
    return folder / "tlog"


def _trust(keys: Any) -> list[str]:
    signer, witness = keys
    return ["--log-key", signer.verifier().encode(), "--witness", witness.witness_key.encode()]


def test_proved_query_reads_the_whole_range_and_says_complete(
        published: Path, keys: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli_text(capsys, "query", "--prove", "--tiles", str(published),
                          "--since", SINCE.isoformat(), "--until", UNTIL.isoformat(),
                          "--tenant", "bank-b", *_trust(keys))
    assert code == 0, err
    # Leaf 89 is the last created before since - 5 min, leaf 410 the first at or after
    # until + 5 min; the window holds leaves 100..399, half of them bank-b's.
    assert out.splitlines()[-1] == (
        "complete: every leaf in [89, 411) read and checked, 150 matched (signed checkpoint "
        "of size 600, witnessed by witness.test; 300 leaves in the window)")
    code, out, _ = cli_text(capsys, "query", "--prove", "--json", "--tiles", str(published),
                        "--since", SINCE.isoformat(), "--until", UNTIL.isoformat(),
                        "--tenant", "bank-b", *_trust(keys))
    result = json.loads(out)
    assert {r["leaf_index"] for r in result["records"]} == set(range(101, 400, 2))


def test_a_window_needs_a_witness_quorum_and_a_closing_leaf(
        published: Path, keys: Any, capsys: pytest.CaptureFixture[str]) -> None:
    signer, _ = keys
    other = Cosigner("witness.test", Ed25519PrivateKey.generate())
    code, _, err = cli_text(capsys, "query", "--prove", "--tiles", str(published), "--since",
                        SINCE.isoformat(), "--until", UNTIL.isoformat(), "--log-key",
                        signer.verifier().encode(), "--witness", other.witness_key.encode())
    assert code == 1 and "0 valid cosignatures of the 1 needed" in err
    late = BASE + timedelta(seconds=30 * 595)  # less than 5 min before the last leaf
    code, _, err = cli_text(capsys, "query", "--prove", "--tiles", str(published), "--since",
                        SINCE.isoformat(), "--until", late.isoformat(), *_trust(keys))
    assert code == 1 and "the window is still open" in err


def _drop(bundle: Path, leaf: int, reindex: bool = False) -> None:
    raw = json.loads(bundle.read_text())
    entries = raw["entries"]
    at = leaf - raw["start"]
    del entries[at]
    if reindex:  # hide the gap: shift every later leaf down by one
        for entry in entries[at:]:
            entry["leaf_index"] -= 1
        raw["end"] -= 1
    bundle.write_text(json.dumps(raw))


def test_window_bundle_verifies_offline_and_a_dropped_leaf_is_named(
        published: Path, keys: Any, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    bundle = tmp_path / "window.json"
    code, out, err = cli_text(capsys, "export", "--window", "--bundle", str(bundle), "--tiles",
                          str(published), "--since", SINCE.isoformat(), "--until",
                          UNTIL.isoformat(), *_trust(keys))
    assert code == 0, err
    code, out, err = cli_text(capsys, "verify", "--bundle", str(bundle), "--tenant", "bank-a",
                          "--no-state", *_trust(keys))
    assert code == 0, err
    window, complete = out.splitlines()[:2]
    assert window == f"window proved: [{SINCE.isoformat()}Z, {UNTIL.isoformat()}Z)"
    assert complete.startswith("complete: every leaf in [89, 411) read and checked, 150 matched")
    original = bundle.read_text()
    for leaf, reindex, message in ((250, False, "leaf 250 is missing from the window bundle"),
                                   (410, False, "leaf 410 is missing from the window bundle"),
                                   (250, True, "the bundle lacks tree node")):
        bundle.write_text(original)
        _drop(bundle, leaf, reindex)
        code, out, err = cli_text(capsys, "verify", "--bundle", str(bundle), "--no-state",
                              *_trust(keys))
        assert code == 1 and message in err, (leaf, reindex, err)


# --- a tenant's auditor over v2 envelopes ---------------------------------------------------


def _v2(i: int) -> tuple[bytes, bytes, str]:
    """(envelope, body, record id) of a v2 record of bank-a (even) or bank-b (odd)."""
    inputs = copy.deepcopy(INPUTS)
    inputs["origin"] = ORIGIN
    record = inputs["record"]
    record["tenant"] = "bank-b" if i % 2 else "bank-a"
    record["record_id"] = f"0192f0c0-0000-7000-8000-{i:012d}"
    record["created_at"] = _stamp(_when(i))
    leaf = build(inputs)["record"]
    return leaf["envelope"].encode(), leaf["body"].encode(), record["record_id"]


def test_tenant_auditor_proves_its_window_without_other_tenants_records(
        tmp_path_factory: pytest.TempPathFactory, keys: Any) -> None:
    signer, _ = keys
    leaves = [_v2(i) for i in range(COUNT)]
    url = f"sqlite:///{tmp_path_factory.mktemp('v2') / 'log.db'}"
    upgrade(url)
    build_log(url, COUNT, signer, ORIGIN, leaf=lambda i: leaves[i][0], created_at=_when)
    ledger = SqlLedger(url)
    try:
        with tiles_service(ledger) as (base, tokens):
            source = Recording(base, tokens["client"])  # bank-a's own key, role client
            checkpoint = signer.verifier().open_checkpoint(source.get("checkpoint") or b"")
            log = TiledLog(source, checkpoint)
            answer, _ = log.prove_window(SINCE, UNTIL, leaf_filter({"tenant": "bank-a"},
                                                                   ORIGIN))
    finally:
        ledger.engine.dispose()
    assert answer.summary() == "complete: every leaf in [89, 411) read and checked, " \
                               "150 matched"
    assert answer.matched == list(range(100, 400, 2))
    received = b"".join(source.fetched)
    assert b"tile/entries" not in received and len(received) > 300 * 150
    for _, body, record_id in leaves[1::2]:  # bank-b's records: no byte of any
        assert body not in received and record_id.encode() not in received
    assert b"bank-b" not in received and b"bank-a" not in received


class Recording(HttpTiles):
    """Keeps every byte the server sent."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.fetched: list[bytes] = []
        self.paths: list[str] = []

    def get(self, path: str) -> bytes | None:
        self.paths.append(path)
        data = super().get(path)
        if data is not None:
            self.fetched.append(data)
        return data


def test_the_log_refuses_an_append_that_breaks_the_lag_rule(ledger_url: str) -> None:
    from ledger.errors import InvalidInputError
    from ledger.window import MAX_LAG

    with SqlLedger(ledger_url, max_created_lag=MAX_LAG) as ledger:
        ledger.append(make_record(1, created_at="2026-11-03T08:10:00.000Z"))
        ledger.append(make_record(2, created_at="2026-11-03T08:05:00.000Z"))  # 5 min: kept
        with pytest.raises(InvalidInputError, match="created_at: 2026-11-03T08:04:59.999Z is "
                                                    "more than 0:05:00 before"):
            ledger.append(make_record(3, created_at="2026-11-03T08:04:59.999Z"))
        assert ledger.tree_head()[0] == 2
    with SqlLedger(ledger_url) as ledger:  # history tools and tests may write any order
        ledger.append(make_record(4, created_at="2026-11-01T00:00:00.000Z"))


def test_a_proved_window_holds_the_tiles_against_the_checkpoint_seen_last(
        published: Path, keys: Any, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from ledger import merkle
    from ledger.tiles import TILE_WIDTH, decode_bundle

    signer, _ = keys
    state = tmp_path / "seen.note"
    query = ["query", "--prove", "--tiles", str(published), "--since", SINCE.isoformat(),
             "--until", UNTIL.isoformat(), "--state", str(state), *_trust(keys)]
    # The honest root at 300, from the published leaves themselves.
    first = [entry for n in ("000", "001") for entry in
             decode_bundle((published / "tile/entries" / n).read_bytes(), TILE_WIDTH)]
    root_300 = merkle.root_of(merkle.hash_leaf(e) for e in first[:300])
    state.write_bytes(signer.sign_checkpoint(Checkpoint(ORIGIN, 300, root_300)))
    code, _, err = cli_text(capsys, *query)
    assert code == 0, err
    assert Checkpoint.peek(state.read_bytes()).size == 600  # advanced
    # A checkpoint seen earlier of another tree at 300: the published tiles fork from it.
    state.write_bytes(signer.sign_checkpoint(Checkpoint(ORIGIN, 300, b"\x07" * 32)))
    code, _, err = cli_text(capsys, *query)
    assert code == 1 and "fork: the log's tree at size 300" in err
    # A larger one seen earlier: the published log was rolled back.
    state.write_bytes(signer.sign_checkpoint(Checkpoint(ORIGIN, 700, b"\x07" * 32)))
    code, _, err = cli_text(capsys, *query)
    assert code == 1 and "rollback: this auditor saw the signed checkpoint of size 700" in err


def test_the_filter_skips_only_records_that_cannot_match() -> None:
    keep = leaf_filter({"tenant": "bank-1"}, ORIGIN)
    plain = make_record(1, tenant="bank-1").canonical
    assert keep(0, plain) and not keep(0, make_record(2, tenant="bank-2").canonical)
    # Spelled with an escape (not canonical, but one meaning): still found.
    escaped = plain.replace(b'"bank-1"', b'"bank\\u002d1"')
    assert escaped != plain and keep(0, escaped)
    assert not keep(0, make_record(3, tenant="bank-10").canonical)


# --- v2 filters through the published bodies and environment leaves -------------------------

SWITCH = 250  # the environment changes (model B, driver B) at this leaf


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory, keys: Any) -> tuple[str, Path]:
    """50 v1 records, then v2 leaves of bank-a/bank-b under environment A (leaf 50) and
    B (leaf 250), appended by the writer, sealed, cosigned and published to a folder."""
    return _publish_mixed(tmp_path_factory.mktemp("mixed"), keys, v1=50)


@pytest.fixture(scope="module")
def v2_only(tmp_path_factory: pytest.TempPathFactory, keys: Any) -> tuple[str, Path]:
    """As ``mixed`` with no v1 record: environment A is leaf 0 (a tenant may read every
    entry bundle)."""
    return _publish_mixed(tmp_path_factory.mktemp("v2only"), keys, v1=0)


def _publish_mixed(folder: Path, keys: Any, v1: int) -> tuple[str, Path]:
    from tests.mixed_log import append_all, mixed_leaves, seal_cosigned

    signer, witness = keys
    url = f"sqlite:///{folder / 'log.db'}"
    append_all(url, mixed_leaves(ORIGIN, COUNT, _when, v1=v1, switch=SWITCH))
    with SqlLedger(url) as ledger:
        seal_cosigned(ledger, ORIGIN, signer, witness, COUNT)
        from ledger.publish.worker import publish_latest
        publish_latest(ledger, DirectorySink(folder / "tlog"))
    return url, folder / "tlog"


def test_v2_window_applies_every_filter_through_the_environment_leaves(
        mixed: tuple[str, Path], keys: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.mixed_log import DRIVER_A, MODEL_B

    _, folder = mixed
    query = ["query", "--prove", "--json", "--tiles", str(folder), "--since",
             SINCE.isoformat(), "--until", UNTIL.isoformat(), *_trust(keys)]
    cases = [  # (filters, the leaves that must match)
        (["--model-digest", MODEL_B], set(range(SWITCH + 1, 400))),
        (["--driver-version", DRIVER_A], set(range(100, SWITCH))),
        (["--tenant", "bank-b", "--model-digest", MODEL_B], set(range(SWITCH + 1, 400, 2))),
        (["--accelerator-model", "NVIDIA H200", "--service-revision", "b" * 40],
         set(range(100, 400)) - {SWITCH}),
        (["--tenant", "bank-a", "--driver-version", "no-such-driver"], set()),
    ]
    for filters, expected in cases:
        code, out, err = cli_text(capsys, *query, *filters)
        assert code == 0, (filters, err)
        result = json.loads(out)
        assert (result["start"], result["end"]) == (89, 411)
        assert {r["leaf_index"] for r in result["records"]} == expected, filters


def test_v2_window_refuses_a_body_that_is_not_its_envelopes(
        mixed: tuple[str, Path], keys: Any, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    from ledger import body_bundles, tiles

    _, folder = mixed
    copy_dir = tmp_path / "tlog"
    shutil.copytree(folder, copy_dir)
    entries = tiles.decode_bundle((folder / "tile/entries/001").read_bytes(), 256)
    tag = body_bundles.envelope_tag(entries[0])
    path = copy_dir / body_bundles.body_path(tag, tiles.TileRef(0, 1, entries=True))
    bodies = body_bundles.decode_bodies(path.read_bytes())
    swapped = [bodies[1], bodies[0], *bodies[2:]]  # two bodies of one tenant, swapped
    path.chmod(0o644)
    path.write_bytes(tiles.encode_bundle(swapped))
    code, _, err = cli_text(capsys, "query", "--prove", "--tiles", str(copy_dir),
                            "--since", SINCE.isoformat(), "--until", UNTIL.isoformat(),
                            "--model-digest", "sha256:" + "00" * 32, *_trust(keys))
    assert code == 1 and "the published body of leaf 256 does not hash to its " \
                         "envelope's body digest" in err


def test_tenant_auditor_filters_its_v2_records_by_model_without_other_tenants_bodies(
        v2_only: tuple[str, Path], keys: Any) -> None:
    from ledger.client.proved_window import prove_filtered_window
    from ledger.leaves.envelope import tenant_tag
    from tests.mixed_log import MODEL_B

    url, _ = v2_only
    signer, _ = keys
    ledger = SqlLedger(url)
    try:
        with tiles_service(ledger) as (base, tokens):
            source = Recording(base, tokens["client"])  # bank-a's own key, role client
            checkpoint = signer.verifier().open_checkpoint(source.get("checkpoint") or b"")
            log = TiledLog(source, checkpoint)
            answer, _ = prove_filtered_window(log, SINCE, UNTIL, {
                "tenant": "bank-a", "model_digest": MODEL_B})
            other = tenant_tag(ORIGIN, "bank-b")[len("sha256:"):]
            refused = HttpTiles(base, tokens["client"])
            with pytest.raises(BackendUnavailableError, match="HTTP 403"):
                refused.get(f"bodies/{other}/001")
            auditor = HttpTiles(base, tokens["auditor"])  # all tenants: every body
            assert auditor.get(f"bodies/{other}/001")
    finally:
        ledger.engine.dispose()
    assert answer.summary() == "complete: every leaf in [89, 411) read and checked, " \
                               "74 matched"
    assert answer.matched == list(range(SWITCH + 2, 400, 2))
    received = b"".join(source.fetched)
    assert b"bank-b" not in received and b'"tenant":"bank-a"' in received
    assert all(f"/{other}/" not in path for path in source.paths)


def test_window_filter_without_bodies_names_the_filter() -> None:
    from ledger.errors import InvalidInputError
    from tests.mixed_log import mixed_leaves

    leaves = mixed_leaves(ORIGIN, 3, _when)
    keep = leaf_filter({"tenant": "bank-b", "model_digest": "sha256:" + "00" * 32}, ORIGIN)
    assert not keep(2, leaves[2].canonical)  # bank-a's: excluded by its tag, no body read
    with pytest.raises(InvalidInputError, match="model-digest: v2 leaves are filtered by it "
                                                "through their bodies"):
        keep(1, leaves[1].canonical)


def test_the_tenant_fast_path_still_refuses_a_second_tenant_member() -> None:
    from ledger.errors import CanonicalFormError

    keep = leaf_filter({"tenant": "bank-1"}, ORIGIN)
    plain = make_record(1, tenant="bank-1").canonical
    # Two tenant members: the fast path does not decide; the strict parser refuses it.
    doubled = plain.replace(b'"tenant":"bank-1"', b'"tenant":"bank-2","tenant":"bank-1"')
    with pytest.raises(CanonicalFormError, match="duplicate key 'tenant'"):
        keep(0, doubled)
    # A prefix of the tenant's name is not the tenant.
    assert not keep(0, plain.replace(b'"tenant":"bank-1"', b'"tenant":"bank-1x"'))


def test_a_library_caller_proves_a_filtered_window_from_the_log_tables(
        mixed: tuple[str, Path], keys: Any) -> None:
    """What the console's search calls: the tables as a tile source, same answer as the
    published tiles, the witness policy applied."""
    from ledger.client.proved_window import prove_window_from
    from ledger.store.tile_reads import StoreTiles
    from ledger.window import WindowError
    from ledger.witness.cosignatures import cosigned_note
    from tests.mixed_log import MODEL_B

    url, _ = mixed
    signer, witness = keys
    with SqlLedger(url) as ledger:
        latest = ledger.latest_checkpoint()
        assert latest is not None
        source = StoreTiles(ledger.tiles, cosigned_note(ledger, latest.size, latest.note))
        answer, _, vouched = prove_window_from(
            source, signer.verifier(), SINCE, UNTIL, {"tenant": "bank-b",
                                                      "model_digest": MODEL_B},
            witnesses=[witness.witness_key])
        other = Cosigner("witness.other", Ed25519PrivateKey.generate())
        with pytest.raises(WindowError, match="carries 1 valid cosignatures of the 2 needed"):
            prove_window_from(source, signer.verifier(), SINCE, UNTIL, {},
                              witnesses=[witness.witness_key, other.witness_key])
    assert vouched == "witnessed by witness.test"
    assert answer.summary() == "complete: every leaf in [89, 411) read and checked, " \
                               "75 matched"
    assert answer.matched == list(range(SWITCH + 1, 400, 2))


class _Leaves:
    """A BodyReader over leaves held in memory (their bodies are the writer's own)."""

    def __init__(self, leaves: list[Any]) -> None:
        self.leaves = leaves

    def body(self, index: int, entry: bytes) -> bytes:
        assert entry == self.leaves[index].envelope
        return bytes(self.leaves[index].body)

    def proved_leaf(self, index: int) -> bytes:
        return bytes(self.leaves[index].envelope)


def test_a_proved_window_refuses_an_environment_of_another_engine() -> None:
    from ledger.client.proved_window import LeafFilter
    from ledger.errors import LeafBindingError
    from ledger.leaves.environment import build_environment
    from tests.mixed_log import MODEL_A, record_v2

    def environment(engine: str) -> Any:
        inputs = copy.deepcopy(INPUTS["environment"])
        inputs["model"]["digest"] = MODEL_A
        return build_environment(**{**inputs, "engine": engine})

    # The record ran on engine-0 (as record_v2 writes it) and names leaf 0.
    for engine, outcome in (("engine-0", None), ("engine-other", "engine-other's")):
        env = environment(engine)
        leaves = [env, record_v2(ORIGIN, 1, _when(1), "bank-a", 0, env)]
        keep = LeafFilter({"model_digest": MODEL_A}, ORIGIN, _Leaves(leaves))
        if outcome is None:
            assert keep(1, leaves[1].envelope)
            continue
        with pytest.raises(LeafBindingError, match="leaf 1 ran on engine-0, the environment "
                                                   "leaf 0 it names is engine-other's"):
            keep(1, leaves[1].envelope)


def test_a_record_naming_its_environment_twice_is_refused_not_skipped() -> None:
    """A record is skipped unopened only when its environment is read with one meaning: a
    second environment member (spelled out or escaped) that a quick parser would take
    instead of the first is refused by the strict one, even where it would not match."""
    from ledger.client.proved_window import LeafFilter
    from ledger.errors import CanonicalFormError
    from ledger.leaves.envelope import body_digest
    from tests.mixed_log import MODEL_A, MODEL_B, environment, record_v2

    env_a, env_b = environment(0, _when(0), MODEL_A, "d"), environment(1, _when(1), MODEL_B,
                                                                        "d")
    record = record_v2(ORIGIN, 2, _when(2), "bank-a", 1, env_b)  # names B: matches
    leaves = [env_a, env_b, record]
    keep = LeafFilter({"model_digest": MODEL_B}, ORIGIN, _Leaves(leaves))
    assert keep(2, record.envelope)
    for e, a in ((b"e", b"a"), (b"\\u0065", b"\\u0061")):  # spelled out, then escaped
        second = (b'"' + e + b'nvironment":{"le' + a + b'f_hash":"' + env_a.leaf_hash.hex()
                  .encode() + b'","le' + a + b'f_index":0},"gpu_sample"')  # json.loads's pick
        body = bytes(record.body).replace(b'"gpu_sample"', second)
        # An envelope committing to that body (as a dishonest log could sign one).
        envelope = bytes(record.envelope).replace(body_digest(bytes(record.body)).encode(),
                                                  body_digest(body).encode())
        keep = LeafFilter({"model_digest": MODEL_B}, ORIGIN, _Tampered(leaves, 2, body))
        with pytest.raises(CanonicalFormError, match="duplicate key 'environment'"):
            keep(2, envelope)


class _Tampered(_Leaves):
    """Serves ``body`` as leaf ``index``'s body (the digest check is the reader's, not
    the filter's: here the filter's own reading is under test)."""

    def __init__(self, leaves: list[Any], index: int, body: bytes) -> None:
        super().__init__(leaves)
        self.index, self.tampered = index, body

    def body(self, index: int, entry: bytes) -> bytes:
        return self.tampered if index == self.index else super().body(index, entry)
