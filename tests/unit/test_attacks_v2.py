"""Named attacks on v2 leaves through verify and audit: a record may
only name an environment leaf of its own engine, appended before it; bytes that are
not Unicode fail check 1 instead of crashing."""

from __future__ import annotations

import copy
import json
from datetime import datetime
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit_cli.windows import leaf_filter
from ledger import body_bundles, merkle
from ledger.audit import MirrorRow, audit_range, naive_utc
from ledger.canonical import parse_strict
from ledger.checkpoint import Checkpoint, NoteSigner
from ledger.errors import CanonicalFormError
from ledger.leaves.commitments import row_commitments
from ledger.leaves.envelope import Leaf, envelope_bytes, tenant_tag
from ledger.leaves.environment import build_environment, environment_columns
from ledger.leaves.record_v2 import RECORD_KIND, EnvironmentRef, build_record_v2, row_data
from ledger.verify import Evidence, LeafEvidence, TrustPolicy, Verdict, verify_record
from tests.vectors.make_leaf_vectors import INPUTS, ORIGIN

SIGNER = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())


def _record(environment: Leaf, env_index: int, **change: Any) -> Leaf:
    rec = {**INPUTS["record"], **change}
    salts = {name: bytes.fromhex(rec[name]) for name in
             ("input_salt", "output_salt", "user_salt")}
    return build_record_v2(
        origin=ORIGIN, tenant=rec["tenant"], engine=rec["engine"],
        environment=EnvironmentRef(env_index, environment.leaf_hash),
        commitments=row_commitments(**salts, prompt=rec["prompt"],
                                    input_ids=rec["input_ids"], output=rec["output"],
                                    output_ids=rec["output_ids"]),
        data=row_data(input_token_count=5, output_token_count=2, truncated=False,
                      finish_reason="stop", rows=2, padded_length=7, padding_side="left",
                      padding_count=2, generation=rec["generation"]),
        batch=rec["batch"], timings_ms=rec["timings_ms"], gpu_sample=None,
        record_id=rec["record_id"], created_at=rec["created_at"])


def _verify(leaves: list[Leaf], record_index: int, env_index: int) -> Verdict:
    tree = merkle.MemoryTree()
    for leaf in leaves:
        tree.append(leaf.leaf_hash)
    note = SIGNER.sign(Checkpoint(ORIGIN, tree.size, tree.root(tree.size)).body())
    record, environment = leaves[record_index], leaves[env_index]
    evidence = Evidence(
        record_id=record.record_id, canonical=record.envelope, leaf_index=record_index,
        inclusion_proof=tree.inclusion_proof(record_index, tree.size),
        checkpoint_note=note, anchored_note=note,
        anchor_ref=f"local:{tree.size}", log_leaf_hash=record.leaf_hash, body=record.body,
        environment=LeafEvidence(env_index, environment.envelope, environment.body,
                                 tree.inclusion_proof(env_index, tree.size)))
    return verify_record(evidence, SIGNER.verifier(), ORIGIN,
                         policy=TrustPolicy(accept_self_anchored=True))


def _environment(**change: Any) -> Leaf:
    return build_environment(**{**copy.deepcopy(INPUTS["environment"]), **change})


def test_honest_record_after_its_environment_passes_checks_1_and_2() -> None:
    environment = _environment()
    verdict = _verify([environment, _record(environment, 0)], 1, 0)
    passed = {check.number for check in verdict.checks if check.passed}
    assert {1, 2, 3, 4} <= passed, verdict.to_dict()


def test_record_naming_an_environment_appended_after_it_fails_check_1() -> None:
    # The operator ran the record first and declared an environment afterwards.
    environment = _environment(created_at="2026-12-02T01:02:03.456Z")
    verdict = _verify([_record(environment, 1), environment], 0, 1)
    failed = verdict.failed
    assert failed is not None and failed.number == 1, verdict.to_dict()
    assert "appended after" in failed.reason


def test_record_naming_an_environment_of_another_engine_fails_check_1() -> None:
    # engine-1's record claims engine-0's (say, audited) hardware and software.
    environment = _environment(engine="engine-0")
    verdict = _verify([environment, _record(environment, 0, engine="engine-1")], 1, 0)
    failed = verdict.failed
    assert failed is not None and failed.number == 1, verdict.to_dict()
    assert "engine-1" in failed.reason and "engine-0" in failed.reason


def _audit(leaves: list[Leaf]) -> list[tuple[str, int]]:
    rows = [MirrorRow(i, leaf.record_id, naive_utc(leaf.created_at), leaf.envelope,
                      body=leaf.body) for i, leaf in enumerate(leaves)]
    tree = merkle.MemoryTree()
    for leaf in leaves:
        tree.append(leaf.leaf_hash)
    checkpoint = SIGNER.verifier().open_checkpoint(
        SIGNER.sign(Checkpoint(ORIGIN, tree.size, tree.root(tree.size)).body()), ORIGIN)
    environments = {i: environment_columns(leaf.content) for i, leaf in enumerate(leaves)
                    if leaf.kind == "environment/v1"}
    report = audit_range(rows, checkpoint, datetime(2026, 1, 1), datetime(2027, 1, 1),
                         log_size=len(rows), environments=environments)
    return [(finding.kind, finding.leaf_index) for finding in report.findings]


def test_audit_of_record_naming_one_environment_index_and_another_hash() -> None:
    # Leaf 0 is the engine's declared environment; the record names index 0 but the
    # leaf hash of leaf 1, another environment (the one it really ran under).
    declared = _environment()
    other = _environment(record_id="0192f0c0-0000-7000-8000-0000000000aa",
                         created_at="2026-12-02T01:02:03.500Z",
                         model={"name": "other", "digest": "sha256:" + "99" * 32,
                                "pinned": False})
    mixed = _record(other, 0)
    assert _audit([declared, other, _record(declared, 0)]) == []
    assert _audit([declared, other, mixed]) == [("environment_mismatch", 2)]


def test_audit_of_record_naming_an_environment_of_another_engine() -> None:
    environment = _environment(engine="engine-0")
    record = _record(environment, 0, engine="engine-1")
    assert _audit([environment, record]) == [("environment_mismatch", 1)]


def test_body_with_a_lone_surrogate_tenant_fails_check_1_instead_of_crashing() -> None:
    # A hostile source's body: "tenant":"\ud800" (valid JSON, not valid Unicode).
    environment = _environment()
    honest = _record(environment, 0)
    body = honest.body.replace(b'"tenant":"acme"', b'"tenant":"\\ud800"')
    envelope = envelope_bytes(RECORD_KIND, honest.created_at, honest_tag(), body)
    forged = Leaf(envelope, body, merkle.hash_leaf(envelope), RECORD_KIND,
                  json.loads(body))
    verdict = _verify([environment, forged], 1, 0)
    failed = verdict.failed
    assert failed is not None and failed.number == 1, verdict.to_dict()
    assert "lone surrogate" in failed.reason
    with pytest.raises(CanonicalFormError, match="lone surrogate"):
        parse_strict(b'{"a":"\\ud800"}')
    assert parse_strict(b'{"a":"\\ud83d\\ude00","b":"\\\\ud800"}') == {
        "a": "\U0001f600", "b": "\\ud800"}


def honest_tag() -> str:
    return tenant_tag(ORIGIN, "acme")


def test_window_filter_on_an_envelope_with_a_duplicate_tenant_tag_refuses_it() -> None:
    # An operator's envelope naming acme's tag, then null: a lax parser keeps the last
    # one and acme's completeness check never sees this leaf as acme's.
    honest = _record(_environment(), 0)
    tag = honest_tag().encode()
    forged = honest.envelope.replace(b'"tenant_tag":"' + tag + b'"',
                                     b'"tenant_tag":"' + tag + b'","tenant_tag":null')
    assert forged != honest.envelope
    keep = leaf_filter({"tenant": "acme"}, ORIGIN)
    assert keep(1, honest.envelope)
    with pytest.raises(CanonicalFormError, match="duplicate key 'tenant_tag'"):
        keep(1, forged)


def test_an_envelope_naming_a_tag_inside_another_member_is_refused_not_filed_under_it(
        ) -> None:
    # Decision 0050. The real member is spelled with an escape (tenant\u005ftag, globex's
    # tag) and an extra member's name ends in \"tenant_tag with acme's tag: the bytes end
    # as a canonical envelope does, and hold the literal "tenant_tag" once. A reader of
    # the tail filed this leaf (and its body) under acme; it is no envelope at all.
    honest = _record(_environment(), 0)
    other = tenant_tag(ORIGIN, "globex").encode()
    crafted = honest.envelope.replace(
        b'"tenant_tag":"' + honest_tag().encode() + b'"',
        b'"tenant\\u005ftag":"' + other + b'","x\\"tenant_tag":"' + honest_tag().encode()
        + b'"')
    assert crafted.count(b'"tenant_tag"') == 1 and crafted.endswith(b'"}')
    assert body_bundles.envelope_tag(honest.envelope) == honest_tag()
    with pytest.raises(CanonicalFormError, match="an envelope has exactly"):
        body_bundles.envelope_tag(crafted)
    with pytest.raises(CanonicalFormError, match="an envelope has exactly"):
        body_bundles.tags_of([honest.envelope, crafted])
    keep = leaf_filter({"tenant": "acme"}, ORIGIN)
    with pytest.raises(CanonicalFormError, match="an envelope has exactly"):
        keep(1, crafted)


def test_a_window_bundle_body_that_is_not_its_canonical_bytes_is_refused() -> None:
    # Decision 0050: a window bundle's body, like verify's, must be the very bytes its
    # envelope commits to; one meaning with a space added is another body.
    from ledger.errors import MalformedProofError
    from ledger.window_bundle import check_body

    honest = _record(_environment(), 0)
    spaced = honest.body.replace(b'"tenant":"acme"', b'"tenant": "acme"')
    envelope = envelope_bytes(RECORD_KIND, honest.created_at, honest_tag(), spaced)
    check_body(1, honest.envelope, honest.body, ORIGIN)
    with pytest.raises(MalformedProofError, match="the body of leaf 1 in the window bundle "
                       "does not match its envelope: body: must be the canonical bytes"):
        check_body(1, envelope, spaced, ORIGIN)
