"""Verification of one record from evidence: numbered checks, each passed or failed with
its reason. Pure: evidence in, verdict out; fetching evidence is someone else's job.

1. the record's canonical bytes hash to its leaf hash (and name the asked-for record);
2. the inclusion proof leads from that leaf to the checkpoint's root;
3. the checkpoint is signed by the pinned log key;
4. the checkpoint is consistent with the latest anchored checkpoint (which must exist)
   and with the last checkpoint this verifier has already seen;
5. a given prompt and salt open the input commitment; an output and salt the output one;
6. replay (done by the caller; reported here as a check like the others).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ledger import merkle
from ledger.canonical import parse_strict
from ledger.checkpoint import Checkpoint, NoteVerifier, check_extends
from ledger.digest import commitment_matches
from ledger.errors import LedgerError
from ledger.record import validate_body

CHECK_NAMES = {
    1: "record bytes hash to the leaf",
    2: "inclusion proof leads to the checkpoint root",
    3: "checkpoint signed by the pinned log key",
    4: "checkpoint consistent with the anchor and with what this verifier saw before",
    5: "prompt and output open their commitments",
    6: "replay reproduces the output",
}


class AnchorMissingError(LedgerError):
    """No anchored checkpoint exists for the log."""


@dataclass(frozen=True)
class Evidence:
    """Everything needed to verify one record against one checkpoint."""

    record_id: str
    canonical: bytes
    leaf_index: int
    inclusion_proof: Sequence[bytes]
    checkpoint_note: bytes
    anchored_note: bytes | None = None
    anchor_ref: str | None = None
    # Consistency between the checkpoint and the anchored one (smaller size first).
    anchor_consistency: Sequence[bytes] = ()
    # Consistency between the verifier's last-seen checkpoint and this one.
    seen_consistency: Sequence[bytes] = ()
    # The leaf hash the log itself holds at leaf_index, when the source can tell.
    log_leaf_hash: bytes | None = None


@dataclass(frozen=True)
class Disclosure:
    """What the verifier was given to open the commitments (all optional)."""

    prompt: str | None = None
    input_salt: bytes | None = None
    output: str | None = None
    output_salt: bytes | None = None


@dataclass
class Check:
    number: int
    passed: bool | None  # None: not run (nothing to check, or an earlier check failed)
    reason: str

    @property
    def name(self) -> str:
        return CHECK_NAMES[self.number]

    def to_dict(self) -> dict[str, Any]:
        status = "skipped" if self.passed is None else ("pass" if self.passed else "fail")
        return {"check": self.number, "name": self.name, "status": status,
                "reason": self.reason}


@dataclass
class Verdict:
    record_id: str
    checks: list[Check] = field(default_factory=list)
    checkpoint: Checkpoint | None = None
    record: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return all(c.passed is not False for c in self.checks) and any(
            c.passed for c in self.checks)

    @property
    def failed(self) -> Check | None:
        return next((c for c in self.checks if c.passed is False), None)

    def add(self, number: int, passed: bool | None, reason: str) -> bool:
        self.checks.append(Check(number, passed, reason))
        return passed is not False

    def to_dict(self) -> dict[str, Any]:
        return {"record_id": self.record_id, "verified": self.ok,
                "failed_check": self.failed.number if self.failed else None,
                "tree_size": self.checkpoint.size if self.checkpoint else None,
                "checks": [c.to_dict() for c in self.checks]}


def verify_record(
    evidence: Evidence,
    verifier: NoteVerifier,
    origin: str,
    *,
    seen_note: bytes | None = None,
    disclosure: Disclosure | None = None,
    require_anchor: bool = True,
) -> Verdict:
    """Run checks 1-5 in order; a failed check stops the ones that depend on it."""
    verdict = Verdict(evidence.record_id)
    leaf = merkle.hash_leaf(evidence.canonical)

    # Check 1: bytes -> leaf hash, and the bytes are the record that was asked for.
    # (Canonical spelling is the writer's job and fsck's; here the bytes must only have
    # one meaning: no duplicate keys, no NaN.)
    try:
        body = parse_strict(evidence.canonical)
        validate_body(body)
    except LedgerError as exc:
        verdict.add(1, False, f"record bytes are not an audit record: {exc}")
        return _skip_rest(verdict, 2)
    if not isinstance(body, dict) or body.get("record_id") != evidence.record_id:
        got = body.get("record_id") if isinstance(body, dict) else None
        verdict.add(1, False, f"bytes are record {got!r}, not {evidence.record_id!r}")
        return _skip_rest(verdict, 2)
    if evidence.log_leaf_hash is not None and evidence.log_leaf_hash != leaf:
        verdict.add(1, False, f"record bytes hash to {leaf.hex()}, the log holds "
                    f"{evidence.log_leaf_hash.hex()} at index {evidence.leaf_index}")
        return _skip_rest(verdict, 2)
    verdict.record = body
    verdict.add(1, True, f"leaf hash {leaf.hex()} at index {evidence.leaf_index}")

    # Check 2: inclusion in the checkpoint (read unsigned here, signature is check 3).
    try:
        claimed = Checkpoint.peek(evidence.checkpoint_note)
        merkle.verify_inclusion(leaf, evidence.leaf_index, claimed.size,
                                evidence.inclusion_proof, claimed.root)
    except LedgerError as exc:
        verdict.add(2, False, f"inclusion proof does not hold: {exc}")
        return _skip_rest(verdict, 3)
    verdict.add(2, True, f"leaf {evidence.leaf_index} is in the tree of size {claimed.size}")

    # Check 3: the checkpoint's signature, under the key the verifier pinned.
    try:
        checkpoint = verifier.open_checkpoint(evidence.checkpoint_note, origin)
    except LedgerError as exc:
        verdict.add(3, False, str(exc))
        return _skip_rest(verdict, 4)
    verdict.checkpoint = checkpoint
    verdict.add(3, True, f"signed by {verifier.name}+{verifier.key_hash.hex()}")

    # Check 4: anchored and not a split view.
    reasons = []
    try:
        if evidence.anchored_note is None:
            if require_anchor:
                raise AnchorMissingError("no anchored checkpoint was found for this log")
            reasons.append("no anchor required")
        else:
            anchored = verifier.open_checkpoint(evidence.anchored_note, origin)
            older, newer = sorted((anchored, checkpoint), key=lambda c: c.size)
            check_extends(older, newer, evidence.anchor_consistency)
            reasons.append(f"consistent with anchored size {anchored.size} "
                           f"({evidence.anchor_ref or 'no reference'})")
        if seen_note is not None:
            # The source's newest checkpoint may not be older than one already seen.
            seen = verifier.open_checkpoint(seen_note, origin)
            check_extends(seen, checkpoint, evidence.seen_consistency)
            reasons.append(f"consistent with previously seen size {seen.size}")
        else:
            reasons.append("first checkpoint this verifier has seen")
    except LedgerError as exc:
        verdict.add(4, False, f"{type(exc).__name__}: {exc}")
        return _skip_rest(verdict, 5)
    verdict.add(4, True, "; ".join(reasons))

    # Check 5: commitments, when something was disclosed.
    disclosure = disclosure or Disclosure()
    data = body.get("data", {})
    opened, failures, notes = [], [], []
    for label, text, salt, key in (
        ("prompt", disclosure.prompt, disclosure.input_salt, "input_commitment"),
        ("output", disclosure.output, disclosure.output_salt, "output_commitment"),
    ):
        if text is None and salt is None:
            continue
        if salt is None:  # e.g. a prompt given only for replay
            notes.append(f"{label} given without its salt: commitment not opened")
        elif text is None:
            failures.append(f"{label} salt given without the {label} text")
        elif commitment_matches(str(data.get(key, "")), salt, text):
            opened.append(label)
        else:
            failures.append(f"{label} or its salt does not match {key}")
    if failures:
        verdict.add(5, False, "; ".join(failures))
    elif opened:
        verdict.add(5, True, f"{' and '.join(opened)} match the record")
    else:
        verdict.add(5, None, "; ".join(notes) or "no prompt or output given")
    return verdict


def _skip_rest(verdict: Verdict, start: int) -> Verdict:
    for number in range(start, 6):
        verdict.add(number, None, "not run: an earlier check failed")
    return verdict
