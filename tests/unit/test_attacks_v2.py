"""Named attacks on a v2 record's environment binding (verify's check 1): a record may
only name an environment leaf of its own engine, appended before it."""

from __future__ import annotations

import copy
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import merkle
from ledger.checkpoint import Checkpoint, NoteSigner
from ledger.leaves.commitments import row_commitments
from ledger.leaves.envelope import Leaf
from ledger.leaves.environment import build_environment
from ledger.leaves.record_v2 import EnvironmentRef, build_record_v2, row_data
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
