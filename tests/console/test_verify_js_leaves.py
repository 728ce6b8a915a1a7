"""The console's verify.js opens v2 leaves by the command-line verifier's rules: one table
of leaves, each put to both verifiers' check 1 (with the environment leaf and, for a
streamed record, the stream start leaf it names), each refused by both with the same
check named (or accepted by both). The page runs in node (its WebCrypto) on a real child
process."""

from __future__ import annotations

import base64
import copy
import json
import re
import subprocess
from pathlib import Path
from typing import Any

from ledger import merkle
from ledger.canonical import canonical_bytes
from ledger.errors import CanonicalFormError, LeafBindingError
from ledger.leaves.commitments import commit, row_commitments
from ledger.leaves.envelope import Leaf, envelope_members, tenant_tag
from ledger.leaves.environment import build_environment
from ledger.leaves.kinds import open_leaf
from ledger.leaves.record_v2 import EnvironmentRef, build_record_v2, row_data
from ledger.leaves.stream_start import build_stream_start_v2
from ledger.verify import Evidence, LeafEvidence, Verdict, _check_leaf_v2
from tests.vectors.make_leaf_vectors import INPUTS

ROOT = Path(__file__).resolve().parents[2]
VERIFY_JS = ROOT / "inference_wrapper/server/console/static/verify.js"
HARNESS = Path(__file__).with_name("verify_leaf_node.mjs")
VECTORS = ROOT / "tests/vectors"
ORIGIN = "review.example/log"
START_INDEX = 3  # the leaf index of the case's leaf in every case below
START_BEFORE = 2  # where a streamed record's stream start is, when the case has one
SALT = b"1" * 32
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
        commitments={"input": commit(SALT, "input", b"my PIN is 7236")},
        generation={"max_new_tokens": 4}, route="/v1/completions",
        record_id="0192f0c0-0000-7000-8000-000000000003",
        created_at="2026-12-02T01:00:00.000Z")


def _streamed(tenant: str = "acme", prompt: bytes = b"my PIN is 7236") -> Leaf:
    """A streamed record naming ``_start()``'s leaf."""
    return build_record_v2(
        origin=ORIGIN, tenant=tenant, engine="engine-0",
        environment=EnvironmentRef(0, ENV.leaf_hash),
        commitments=row_commitments(input_salt=SALT, output_salt=SALT,
                                    prompt=prompt.decode(), input_ids=[1, 2],
                                    output="ok", output_ids=[3]),
        data=row_data(input_token_count=2, output_token_count=1, truncated=False,
                      finish_reason="stop", rows=1, padded_length=2, padding_side="left",
                      padding_count=0, generation={"max_new_tokens": 4}),
        batch={"id": "c" * 32, "size": 1, "row": 0}, timings_ms={"forward": 3.0},
        stream_start_record_id=_start().record_id,
        record_id="0192f0c0-0000-7000-8000-000000000004",
        created_at="2026-12-02T01:00:01.000Z")


def _forged(body: bytes, kind: str = "audit-stream-start/v2",
            created_at: str = "2026-12-02T01:00:00.000Z") -> tuple[bytes, bytes]:
    """A correct envelope around ``body``, as a malicious log writer would make it."""
    return canonical_bytes(envelope_members(kind, created_at, tenant_tag(ORIGIN, "acme"),
                                            body)), body


def _edited(**members: Any) -> dict[str, Any]:
    content = json.loads(_start().body)
    content.update(members)
    return content


def _case(envelope: bytes, body: bytes, env_index: int = 0,
          start: tuple[Leaf, int] | None = None) -> dict[str, Any]:
    evidence: dict[str, Any] = {
        "leaf_index": START_INDEX, "body_base64": _b64(body),
        "environment": {"leaf_index": env_index, "envelope_base64": _b64(ENV.envelope),
                        "body_base64": _b64(ENV.body)}}
    if start is not None:
        evidence["stream_start"] = {"leaf_index": start[1],
                                    "envelope_base64": _b64(start[0].envelope),
                                    "body_base64": _b64(start[0].body)}
    return {"origin": ORIGIN, "envelope_base64": _b64(envelope), "evidence": evidence}


def _month_13() -> tuple[bytes, bytes]:
    time = "2026-13-45T99:99:99.999Z"
    return _forged(canonical_bytes(_edited(created_at=time)), created_at=time)


def _other_digits() -> tuple[bytes, bytes]:
    time = ARABIC_INDIC_YEAR + "-12-02T01:00:00.000Z"
    return _forged(canonical_bytes(_edited(created_at=time)), created_at=time)


_GOOD = _start()
_RECORD = _streamed()
_SPACED = _GOOD.body.replace(b'"tenant":"acme"', b'"tenant": "acme"')
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
    # Decision 0050: the body must be the canonical bytes the envelope commits to.
    "I body with whitespace": (
        _forged(_SPACED), 0, CanonicalFormError, "body: must be the canonical bytes "
        "committed to: bytes are JSON but not in RFC 8785 canonical form",
        "body: not in RFC 8785 canonical form"),
    "a good streamed record and its start": (
        (_RECORD.envelope, _RECORD.body), 0, None, "", ""),
    "J streamed record with no start leaf": (
        (_RECORD.envelope, _RECORD.body), 0, LeafBindingError,
        "stream start: LeafBindingError: the record names stream start "
        "0192f0c0-0000-7000-8000-000000000003 and the source gave no such leaf",
        "stream start: the record names stream start 0192f0c0-0000-7000-8000-000000000003 "
        "and the server gave no such leaf"),
    "K start of another tenant": (
        (_streamed(tenant="globex").envelope, _streamed(tenant="globex").body), 0,
        LeafBindingError, "which is tenant 'acme''s, not 'globex''s",
        'which is tenant "acme"\'s, not "globex"\'s'),
    "L start of another prompt": (
        (_streamed(prompt=b"my PIN is 0000").envelope,
         _streamed(prompt=b"my PIN is 0000").body), 0, LeafBindingError,
        "whose input commitment is not the record's",
        "whose input commitment is not the record's"),
    "M start appended after the record": (
        (_RECORD.envelope, _RECORD.body), 0, LeafBindingError,
        "appended at leaf 5, after the record at leaf 3",
        "appended at leaf 5, after the record at leaf 3"),
    "N another leaf as the start": (
        (_RECORD.envelope, _RECORD.body), 0, LeafBindingError,
        "the source gave leaf 2 (0192f0c0-0000-7000-8000-000000000004) as the stream start",
        "the server gave leaf 2 (0192f0c0-0000-7000-8000-000000000004) as the stream start"),
}
# The stream start leaf each streamed case's source gives, and its index (none: none given).
STARTS: dict[str, tuple[Leaf, int]] = {
    "a good streamed record and its start": (_GOOD, START_BEFORE),
    "K start of another tenant": (_GOOD, START_BEFORE),
    "L start of another prompt": (_GOOD, START_BEFORE),
    "M start appended after the record": (_GOOD, 5),
    "N another leaf as the start": (_RECORD, START_BEFORE),
}


def _python(envelope: bytes, body: bytes, env_index: int,
            start: tuple[Leaf, int] | None) -> str | None:
    """The command-line verifier's check 1 on the case: None when it passes, else its
    reason (which names the error's type)."""
    asked = re.search(rb'"record_id":"([^"]+)"', body)
    evidence = Evidence(
        record_id=asked.group(1).decode() if asked else "", canonical=envelope,
        leaf_index=START_INDEX, inclusion_proof=(), checkpoint_note=b"", body=body,
        environment=LeafEvidence(env_index, ENV.envelope, ENV.body, ()),
        stream_start=None if start is None
        else LeafEvidence(start[1], start[0].envelope, start[0].body, ()))
    verdict = Verdict(evidence.record_id)
    opened = _check_leaf_v2(verdict, evidence, merkle.hash_leaf(envelope), ORIGIN)
    check, = verdict.checks
    assert (opened is not None) == bool(check.passed)
    return None if check.passed else check.reason


def _in_node(cases: list[dict[str, Any]]) -> list[dict[str, str]]:
    done = subprocess.run(["node", str(HARNESS), str(VERIFY_JS)], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    results: list[dict[str, str]] = json.loads(done.stdout)
    assert len(results) == len(cases)
    return results


def test_both_verifiers_refuse_each_forged_leaf_by_the_same_check() -> None:
    names = list(CASES)
    results = _in_node([_case(*CASES[n][0], env_index=CASES[n][1], start=STARTS.get(n))
                        for n in names])
    for name, result in zip(names, results, strict=True):
        (envelope, body), env_index, error, python_text, js_text = CASES[name]
        reason = _python(envelope, body, env_index, STARTS.get(name))
        if error is None:
            assert reason is None and result == {"ok": True}, (name, reason, result)
            continue
        assert reason is not None and f"{error.__name__}: " in reason, (name, reason)
        assert python_text in reason, (name, reason)
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
