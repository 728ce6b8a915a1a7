"""Named attacks against ``ledger.verify``, driven directly through the in-memory
simulator: each must fail the check that names its true cause, with exit code 1 (and the
honest cases must pass with exit 0). The README's attack table points at these rows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger.checkpoint import Checkpoint, NoteSigner
from ledger.error_map import EXIT_CHECK_FAILED, EXIT_OK
from ledger.verify import (
    FABRIC,
    SELF_ANCHORED,
    WITNESSED,
    Disclosure,
    Evidence,
    TrustPolicy,
    Verdict,
    record_missing,
    verify_record,
)
from tests.simulator import ORIGIN, SALT, SimLog, sim_record, witness_keys, witnesses

WITNESSES = witnesses(2)
QUORUM_2 = TrustPolicy(witnesses=witness_keys(WITNESSES))
SELF = TrustPolicy(accept_self_anchored=True)
CRLF_PROMPT = b"Approve the loan?\r\nApplicant: 42\r\n"


@dataclass(frozen=True)
class Case:
    evidence: Evidence
    seen: bytes | None = None
    policy: TrustPolicy = QUORUM_2
    disclosure: Disclosure | None = None


def honest(size: int = 8) -> SimLog:
    return SimLog().append(size)


def _rollback_offline(log: SimLog) -> Case:
    # A bundle (or older database copy) at size 5 after this verifier saw size 8.
    return Case(log.evidence(2, size=5, cosigners=WITNESSES), seen=log.note(8))


def _consistent_liar_smaller(log: SimLog) -> Case:
    # A server that pretends, consistently, to be at size 5: checkpoint, anchor and
    # cosignatures all genuine for size 5; it cannot prove anything about size 8.
    return Case(log.evidence(2, size=5, anchored_size=5, cosigners=WITNESSES),
                seen=log.note(8))


def _fork_offline_same_size(log: SimLog) -> Case:
    fork = log.fork(at=5, extra=3)  # the insider signs another size-8 tree
    return Case(fork.evidence(1, cosigners=WITNESSES), seen=log.note(8))


def _fork_offline_larger(log: SimLog) -> Case:
    fork = log.fork(at=5, extra=5)  # size 10, diverging after 5: no proof can link it
    seen = log.note(8)
    return Case(fork.evidence(1, cosigners=WITNESSES, seen=seen), seen=seen)


def _unproven_extension(log: SimLog) -> Case:
    # A larger checkpoint without the consistency proof from what the verifier saw
    # (a version-1 bundle, or a bundle exported from a later size than the state's).
    evidence = log.evidence(2, cosigners=WITNESSES, seen=log.note(5))
    return Case(replace(evidence, seen_consistency=None), seen=log.note(5))


def _forged_root(log: SimLog) -> Case:
    # The note's root line altered in transit (e.g. in a bundle): signature fails.
    note = log.note(8).decode().split("\n")
    note[2] = Checkpoint(ORIGIN, 8, bytes(32)).body().decode().split("\n")[2]
    return Case(replace(log.evidence(3), checkpoint_note="\n".join(note).encode()))


def _forged_key(log: SimLog) -> Case:
    # An impostor with its own key signs a bogus root that its own proof leads to.
    impostor = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    fake = SimLog(impostor).append(8, tag="fake")
    return Case(fake.evidence(3, cosigners=WITNESSES))


def _quorum_unmet(log: SimLog) -> Case:
    return Case(log.evidence(3, cosigners=WITNESSES[:1]))


def _witness_cosigned_a_fork(log: SimLog) -> Case:
    # The witnesses cosigned the fork's size-8 body, not this one: no cosignature counts.
    fork = log.fork(at=5, extra=3)
    lines = fork.note(8, cosigners=WITNESSES).decode().split("\n\n")[1]
    note = log.note(8) + "\n".join(lines.split("\n")[1:]).encode()
    return Case(log.evidence(3, checkpoint_note=note))


def _self_anchored(log: SimLog) -> Case:
    return Case(log.evidence(3, anchored_size=8), policy=TrustPolicy())


def _no_anchor_at_all(log: SimLog) -> Case:
    return Case(log.evidence(3), policy=TrustPolicy())


def _fabric_anchor_missing(log: SimLog) -> Case:
    return Case(log.evidence(3), policy=TrustPolicy(fabric=True))


def _anchor_on_a_fork(log: SimLog) -> Case:
    fork = log.fork(at=5, extra=3)
    evidence = log.evidence(3, anchored_note=fork.note(8), from_fabric=True)
    return Case(evidence, policy=TrustPolicy(fabric=True))


def _crlf_prompt_normalised(log: SimLog) -> Case:
    index = log.add(sim_record(8, prompt=CRLF_PROMPT))
    return Case(log.evidence(index, cosigners=WITNESSES),
                disclosure=Disclosure(CRLF_PROMPT.replace(b"\r\n", b"\n"), SALT))


def _record_bytes_of_another(log: SimLog) -> Case:
    evidence = log.evidence(3, cosigners=WITNESSES)
    return Case(replace(evidence, canonical=log.records[4].canonical))


def _proof_for_another_leaf(log: SimLog) -> Case:
    evidence = log.evidence(3, cosigners=WITNESSES)
    return Case(replace(evidence, inclusion_proof=log.tree.inclusion_proof(4, 8)))


ATTACKS: list[tuple[str, Callable[[SimLog], Case], int, str]] = [
    ("rollback_offline", _rollback_offline, 4, "RollbackError"),
    ("consistent_liar_at_smaller_size", _consistent_liar_smaller, 4, "RollbackError"),
    ("fork_offline_same_size", _fork_offline_same_size, 4, "ForkError"),
    ("fork_offline_larger", _fork_offline_larger, 4, "RootMismatchError"),
    ("extension_without_proof", _unproven_extension, 4, "MissingProofError"),
    ("forged_root", _forged_root, 3, "does not verify"),
    ("forged_key", _forged_key, 3, "no signature by key"),
    ("quorum_unmet", _quorum_unmet, 4, "missing: witness-1.example"),
    ("witnesses_cosigned_a_fork", _witness_cosigned_a_fork, 4, "QuorumError"),
    ("self_anchored", _self_anchored, 4, "SelfAnchoredError"),
    ("no_anchor_at_all", _no_anchor_at_all, 4, "AnchorMissingError"),
    ("fabric_anchor_missing", _fabric_anchor_missing, 4, "AnchorMissingError"),
    ("anchor_on_a_fork", _anchor_on_a_fork, 4, "ForkError"),
    ("crlf_prompt_normalised", _crlf_prompt_normalised, 5, "does not match input_commitment"),
    ("record_bytes_of_another_record", _record_bytes_of_another, 1, "bytes are record"),
    ("proof_for_another_leaf", _proof_for_another_leaf, 2, "root mismatch"),
]


def run(case: Case, log: SimLog) -> Verdict:
    return verify_record(case.evidence, log.signer.verifier(), ORIGIN, seen_note=case.seen,
                         disclosure=case.disclosure, policy=case.policy)


@pytest.mark.parametrize(("build", "check", "reason"),
                         [pytest.param(b, c, r, id=name) for name, b, c, r in ATTACKS])
def test_attack_fails_its_check_with_exit_1(build: Callable[[SimLog], Case], check: int,
                                            reason: str) -> None:
    log = honest()
    verdict = run(build(log), log)
    assert not verdict.ok
    assert verdict.failed is not None and verdict.failed.number == check
    assert reason in verdict.failed.reason
    assert verdict.exit_code == EXIT_CHECK_FAILED
    # Checks that depend on the failed one did not run (3 runs before 2).
    assert all(c.passed is None for c in verdict.checks
               if c.number > check and not (check == 2 and c.number == 3))


def test_forged_checkpoint_is_blamed_on_check_3_not_the_inclusion_proof() -> None:
    log = honest()
    verdict = run(_forged_key(log), log)
    statuses = {c.number: c.status for c in verdict.checks}
    assert statuses == {1: "pass", 2: "skipped", 3: "fail", 4: "skipped", 5: "skipped"}


def test_record_missing_from_a_source_that_answered_fails_check_1() -> None:
    verdict = record_missing("r-404", "not found")
    assert verdict.failed is not None and verdict.failed.number == 1
    assert verdict.exit_code == EXIT_CHECK_FAILED


# --- the honest cases: each trust level, and history that does extend ---------------


def test_quorum_of_witnesses_passes_as_witnessed() -> None:
    log = honest()
    verdict = run(Case(log.evidence(3, cosigners=WITNESSES)), log)
    assert verdict.ok and verdict.trust == WITNESSED and verdict.exit_code == EXIT_OK
    assert "cosigned by 2 of 2" in verdict.checks[3].reason


def test_quorum_one_of_two_passes_with_one_cosignature() -> None:
    log = honest()
    policy = TrustPolicy(witnesses=witness_keys(WITNESSES), quorum=1)
    verdict = run(Case(log.evidence(3, cosigners=WITNESSES[1:]), policy=policy), log)
    assert verdict.ok and verdict.trust == WITNESSED


def test_cosigned_anchored_checkpoint_covering_the_record_counts() -> None:
    # The newest checkpoint is not cosigned yet; the anchored (older, covering) one is.
    log = honest(10)
    anchored = log.note(8, cosigners=WITNESSES)
    verdict = run(Case(log.evidence(3, size=10, anchored_note=anchored)), log)
    assert verdict.ok and verdict.trust == WITNESSED


def test_cosigned_anchor_that_does_not_cover_the_record_does_not_count() -> None:
    log = honest(10)
    anchored = log.note(4, cosigners=WITNESSES)
    verdict = run(Case(log.evidence(6, size=10, anchored_note=anchored)), log)
    assert verdict.failed is not None and verdict.failed.number == 4
    assert "QuorumError" in verdict.failed.reason


def test_fabric_anchor_passes_as_fabric() -> None:
    log = honest()
    evidence = log.evidence(3, anchored_size=6, from_fabric=True)
    verdict = run(Case(evidence, policy=TrustPolicy(fabric=True)), log)
    assert verdict.ok and verdict.trust == FABRIC


def test_self_anchored_accepted_says_so() -> None:
    log = honest()
    verdict = run(Case(log.evidence(3, anchored_size=8), policy=SELF), log)
    assert verdict.ok and verdict.trust == SELF_ANCHORED and verdict.exit_code == EXIT_OK
    assert verdict.checks[3].status == "self-anchored"
    assert verdict.summary.startswith("SELF-ANCHORED") and "VERIFIED" not in verdict.summary


def test_larger_checkpoint_with_proof_from_the_seen_size_passes() -> None:
    log = honest(12)
    verdict = run(Case(log.evidence(3, cosigners=WITNESSES, seen=log.note(8)),
                       seen=log.note(8)), log)
    assert verdict.ok and "extends the size 8" in verdict.checks[3].reason


def test_crlf_prompt_opens_with_its_exact_bytes() -> None:
    log = honest()
    index = log.add(sim_record(8, prompt=CRLF_PROMPT))
    verdict = run(Case(log.evidence(index, cosigners=WITNESSES),
                       disclosure=Disclosure(CRLF_PROMPT, SALT)), log)
    assert verdict.ok and verdict.checks[4].passed
