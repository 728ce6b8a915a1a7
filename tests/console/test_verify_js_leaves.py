"""The console's verify.js opens v2 leaves by the command-line verifier's rules: one table
of leaves, each put to both verifiers, each refused by both with the same check named
(or accepted by both). The page runs in node (its WebCrypto) on a real child process."""

from __future__ import annotations

import base64
import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ledger.canonical import canonical_bytes
from ledger.errors import CanonicalFormError, LeafBindingError
from ledger.leaves.commitments import commit
from ledger.leaves.envelope import Leaf, envelope_members, tenant_tag
from ledger.leaves.environment import build_environment
from ledger.leaves.kinds import NAMES_ENVIRONMENT, open_leaf
from ledger.leaves.record_v2 import EnvironmentRef
from ledger.leaves.stream_start import build_stream_start_v2
from ledger.verify import LeafEvidence, _check_environment
from tests.vectors.make_leaf_vectors import INPUTS

ROOT = Path(__file__).resolve().parents[2]
VERIFY_JS = ROOT / "inference_wrapper/server/console/static/verify.js"
HARNESS = Path(__file__).with_name("verify_leaf_node.mjs")
VECTORS = ROOT / "tests/vectors"
ORIGIN = "review.example/log"
START_INDEX = 3  # the stream start's own leaf index in every case below
ARABIC_INDIC_YEAR = "\u0662\u0660\u0662\u0666"  # 2026 in Arabic-Indic digits


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _environment(engine: str = "engine-0") -> Leaf:
    return build_environment(**{**copy.deepcopy(INPUTS["environment"]), "engine": engine})


ENV = _environment()


def _start(env_index: int = 0, engine: str = "engine-0") -> Leaf:
    return build_stream_start_v2(
        origin=ORIGIN, tenant="acme", engine=engine,
        environment=EnvironmentRef(env_index, ENV.leaf_hash),
        commitments={"input": commit(b"1" * 32, "input", b"my PIN is 7236")},
        generation={"max_new_tokens": 4}, route="/v1/completions",
        record_id="0192f0c0-0000-7000-8000-000000000003",
        created_at="2026-12-02T01:00:00.000Z")


def _forged(body: bytes, kind: str = "audit-stream-start/v2",
            created_at: str = "2026-12-02T01:00:00.000Z") -> tuple[bytes, bytes]:
    """A correct envelope around ``body``, as a malicious log writer would make it."""
    return canonical_bytes(envelope_members(kind, created_at, tenant_tag(ORIGIN, "acme"),
                                            body)), body


def _edited(**members: Any) -> dict[str, Any]:
    content = json.loads(_start().body)
    content.update(members)
    return content


def _case(envelope: bytes, body: bytes, env_index: int = 0) -> dict[str, Any]:
    return {"origin": ORIGIN, "envelope_base64": _b64(envelope), "evidence": {
        "leaf_index": START_INDEX, "body_base64": _b64(body),
        "environment": {"leaf_index": env_index, "envelope_base64": _b64(ENV.envelope),
                        "body_base64": _b64(ENV.body)}}}


def _month_13() -> tuple[bytes, bytes]:
    time = "2026-13-45T99:99:99.999Z"
    return _forged(canonical_bytes(_edited(created_at=time)), created_at=time)


def _other_digits() -> tuple[bytes, bytes]:
    time = ARABIC_INDIC_YEAR + "-12-02T01:00:00.000Z"
    return _forged(canonical_bytes(_edited(created_at=time)), created_at=time)


_GOOD = _start()
# name: (leaf bytes, the environment's index, Python's error and text, verify.js's text)
CASES: dict[str, tuple[tuple[bytes, bytes], int, type[Exception] | None, str, str]] = {
    "a good stream start": ((_GOOD.envelope, _GOOD.body), 0, None, "", ""),
    "A environment appended after the start": (
        (_start(env_index=5).envelope, _start(env_index=5).body), 5, LeafBindingError,
        "environment leaf 5 was appended after record leaf 3",
        "environment leaf 5 was appended after record leaf 3"),
    "B environment of another engine": (
        (_start(engine="engine-other").envelope, _start(engine="engine-other").body), 0,
        LeafBindingError, "the record ran on engine-other, its environment leaf is "
                          "engine-0's",
        "the record ran on engine-other, its environment leaf is engine-0's"),
    "C duplicate tenant key": (
        _forged(_GOOD.body.replace(b'"tenant":"acme"', b'"tenant":"acme","tenant":"acme"')),
        0, CanonicalFormError, "duplicate key 'tenant'",
        "body: not in RFC 8785 canonical form"),
    "D extra plaintext member": (
        _forged(canonical_bytes(_edited(prompt="my PIN is 7236"))), 0, CanonicalFormError,
        "stream_start: must hold exactly", "audit-stream-start/v2: must hold exactly"),
    "E kind not allowed": (
        _forged(canonical_bytes(_edited(schema="audit-record/v9")), kind="audit-record/v9"),
        0, CanonicalFormError, "kind must be one of", "envelope.kind: must be one of"),
    "F byte order mark": (
        _forged(b"\xef\xbb\xbf" + _GOOD.body), 0, CanonicalFormError,
        "Unexpected UTF-8 BOM", "body: not in RFC 8785 canonical form"),
    "G month 13": (_month_13(), 0, CanonicalFormError, "envelope.created_at",
                   "envelope.created_at: must be RFC 3339 UTC"),
    "H Arabic-Indic digits": (_other_digits(), 0, CanonicalFormError, "envelope.created_at",
                              "envelope.created_at: must be RFC 3339 UTC"),
}


def _python(envelope: bytes, body: bytes, env_index: int) -> None:
    leaf = open_leaf(envelope, body, ORIGIN)
    if leaf.kind in NAMES_ENVIRONMENT:
        _check_environment(leaf, START_INDEX,
                           LeafEvidence(env_index, ENV.envelope, ENV.body, ()), ORIGIN)


def _in_node(cases: list[dict[str, Any]]) -> list[dict[str, str]]:
    done = subprocess.run(["node", str(HARNESS), str(VERIFY_JS)], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    results: list[dict[str, str]] = json.loads(done.stdout)
    assert len(results) == len(cases)
    return results


def test_both_verifiers_refuse_each_forged_leaf_by_the_same_check() -> None:
    names = list(CASES)
    results = _in_node([_case(*CASES[n][0], env_index=CASES[n][1]) for n in names])
    for name, result in zip(names, results, strict=True):
        (envelope, body), env_index, error, python_text, js_text = CASES[name]
        if error is None:
            _python(envelope, body, env_index)
            assert result == {"ok": True}, name
            continue
        with pytest.raises(error) as caught:
            _python(envelope, body, env_index)
        assert python_text in str(caught.value), (name, str(caught.value))
        assert "error" in result and js_text in result["error"], (name, result)


def test_every_vector_leaf_of_every_v2_kind_opens_in_the_page() -> None:
    cases, names = [], []
    for vectors in ("leaves_v2.json", "leaves_v2_kinds.json"):
        data = json.loads((VECTORS / vectors).read_text())
        for name, leaf in data["leaves"].items():
            envelope, body = leaf["envelope"].encode(), leaf["body"].encode()
            open_leaf(envelope, body, data["inputs"]["origin"], strict=True)
            names.append(name)
            cases.append({"origin": data["inputs"]["origin"],
                          "envelope_base64": _b64(envelope), "body_base64": _b64(body)})
    assert sorted(names) == ["access", "environment", "erasure", "record", "report",
                             "stream_start"]
    assert _in_node(cases) == [{"ok": True}] * len(cases)
