"""Verification of one record from evidence: numbered checks, each passed or failed with
its reason. Pure: evidence in, verdict out; fetching evidence is someone else's job.

The numbers are stable (scripts and the README refer to them):

1. the record's canonical bytes hash to its leaf hash (and name the asked-for record);
   a source that answered but has no such record fails here too. For a v2 leaf
   (decision 0026) the bytes are its envelope: the body must hash to the envelope's
   digest and agree with its kind, time and tenant tag, both in canonical form (the
   bytes the envelope commits to, as verify.js demands), and a v2 record's environment
   leaf must open the same way and be the leaf (index and hash) the record names; a
   streamed v2 record's stream start leaf must open too and be the one it names: an
   ``audit-stream-start/v2`` before it, of its tenant, with its commitments (0050);
2. the inclusion proof leads from that leaf to the checkpoint's root (and, for a v2
   record, its environment leaf's and its stream start leaf's own proofs to the same
   root);
3. the checkpoint is signed by the pinned log key;
4. the checkpoint is no rollback of, and no fork from, the last checkpoint this verifier
   saw, is consistent with the anchored checkpoint, and someone other than the operator
   vouches for it (a Fabric anchor read by the verifier, or a quorum of witnesses);
5. a given prompt and salt open the input commitment; an output and salt the output one;
6. replay (done by the caller; reported here as a check like the others).

Evaluation order is 1, 3, 2, 4, 5: the signature is checked before the root it signs is
used, so a forged checkpoint is blamed on check 3, never on the inclusion proof. The
verdict lists checks by number whatever the order they ran in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ledger import merkle
from ledger.canonical import parse_strict
from ledger.checkpoint import Checkpoint, NoteVerifier, check_extends
from ledger.cosignature import WitnessKey, valid_cosigners
from ledger.digest import commitment_matches
from ledger.error_map import EXIT_CHECK_FAILED, EXIT_OK
from ledger.errors import LeafBindingError, LedgerError, VerificationError
from ledger.leaves import commitments
from ledger.leaves.envelope import Leaf, is_envelope
from ledger.leaves.environment import ENVIRONMENT_KIND, fingerprints
from ledger.leaves.kinds import NAMES_ENVIRONMENT, open_leaf
from ledger.leaves.stream_link import StartFacts, named_start, stream_start_problem
from ledger.record import validate_body

CHECK_NAMES = {
    1: "record bytes hash to the leaf",
    2: "inclusion proof leads to the checkpoint root",
    3: "checkpoint signed by the pinned log key",
    4: "checkpoint consistent with what this verifier saw, anchored and vouched for",
    5: "prompt and output open their commitments",
    6: "replay reproduces the output",
}

# What a verdict lets the verifier remember (``Verdict.state_note``).
CHECKPOINT = "checkpoint"
ANCHOR = "anchor"

# Trust levels check 4 can reach (``Check.level``), strongest first.
FABRIC = "fabric"
WITNESSED = "witnessed"
SELF_ANCHORED = "self-anchored"


class AnchorMissingError(VerificationError):
    """No anchored checkpoint exists for the log."""


class MissingProofError(VerificationError):
    """A consistency proof the verifier needs was not provided."""


class SelfAnchoredError(VerificationError):
    """The only anchor is one the operator controls."""


class QuorumError(VerificationError):
    """Fewer valid witness cosignatures than the policy requires."""

    def __init__(self, found: Sequence[str], missing: Sequence[str], quorum: int) -> None:
        super().__init__(
            f"witness quorum unmet: {len(found)} of {quorum} required cosignatures "
            f"(valid: {', '.join(found) or 'none'}; missing: {', '.join(missing)})")
        self.found, self.missing, self.quorum = list(found), list(missing), quorum


@dataclass(frozen=True)
class LeafEvidence:
    """Another leaf a v2 record depends on (its environment, its stream start), with
    its own proof to the same checkpoint as the record's."""

    leaf_index: int
    envelope: bytes
    body: bytes
    inclusion_proof: Sequence[bytes]


@dataclass(frozen=True)
class Evidence:
    """Everything needed to verify one record against one checkpoint."""

    record_id: str
    canonical: bytes
    leaf_index: int
    inclusion_proof: Sequence[bytes] | None  # None: the source could not produce one
    checkpoint_note: bytes
    anchored_note: bytes | None = None
    anchor_ref: str | None = None
    # Consistency between the checkpoint and the anchored one (smaller size first);
    # None: the source gave none.
    anchor_consistency: Sequence[bytes] | None = ()
    # Consistency from the verifier's last-seen checkpoint to this one; None: not given.
    seen_consistency: Sequence[bytes] | None = ()
    # The leaf hash the log itself holds at leaf_index, when the source can tell.
    log_leaf_hash: bytes | None = None
    # True only when the verifier read ``anchored_note`` from the Fabric channel itself;
    # an anchor the source merely reports is the operator's word.
    anchor_from_fabric: bool = False
    # How many leaves the source's log holds, when it can tell (a database): a signed
    # checkpoint larger than that covers entries the log no longer has (check 4).
    log_size: int | None = None
    # A v2 leaf's body (``canonical`` is then its envelope) and, for a v2 record, the
    # environment leaf it names and (streamed) the stream start leaf it names.
    body: bytes | None = None
    environment: LeafEvidence | None = None
    stream_start: LeafEvidence | None = None


@dataclass(frozen=True)
class Disclosure:
    """What the verifier was given to open the commitments (all optional), as the exact
    bytes that were committed to."""

    prompt: bytes | None = None
    input_salt: bytes | None = None
    output: bytes | None = None
    output_salt: bytes | None = None


@dataclass(frozen=True)
class TrustPolicy:
    """Who, besides the operator, must vouch for a checkpoint (check 4).

    ``fabric``: the caller read the anchor from a Fabric channel (a consistent Fabric
    anchor passes). ``witnesses``/``quorum``: pinned witness keys and how many of them
    must have cosigned (default: all). With neither, the local anchor is all there is:
    the verdict is self-anchored, a failure unless ``accept_self_anchored``.
    """

    witnesses: Sequence[WitnessKey] = ()
    quorum: int | None = None
    fabric: bool = False
    accept_self_anchored: bool = False
    require_anchor: bool = True

    @property
    def required(self) -> int:
        return len(self.witnesses) if self.quorum is None else self.quorum


@dataclass
class Check:
    number: int
    passed: bool | None  # None: not run (nothing to check, or an earlier check failed)
    reason: str
    # Check 4 only: which trust level made it pass (FABRIC, WITNESSED, SELF_ANCHORED).
    level: str | None = None
    # Check 4 only: whether the checkpoint itself meets the trust policy, so that the
    # verifier may remember it; False when only an older anchored checkpoint vouches.
    advances: bool = True

    @property
    def name(self) -> str:
        return CHECK_NAMES[self.number]

    @property
    def status(self) -> str:
        if self.passed is None:
            return "skipped"
        if not self.passed:
            return "fail"
        return SELF_ANCHORED if self.level == SELF_ANCHORED else "pass"

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.number, "name": self.name, "status": self.status,
                "reason": self.reason, "level": self.level}


@dataclass
class Verdict:
    record_id: str
    checks: list[Check] = field(default_factory=list)
    checkpoint: Checkpoint | None = None
    record: dict[str, Any] | None = None
    # The note this verifier may remember after this verdict: the checkpoint when it meets
    # the trust policy itself, else the anchored note that does (a prefix of it), else
    # None. Only meaningful when the verdict is ok.
    state_note: bytes | None = None
    environment: dict[str, Any] | None = None  # a v2 record's environment body, once checked
    stream_start_index: int | None = None  # a streamed v2 record's start leaf, once checked

    @property
    def ok(self) -> bool:
        return all(c.passed is not False for c in self.checks) and any(
            c.passed for c in self.checks)

    @property
    def failed(self) -> Check | None:
        return next((c for c in sorted(self.checks, key=lambda c: c.number)
                     if c.passed is False), None)

    @property
    def trust(self) -> str | None:
        """The trust level check 4 reached (None when it did not pass)."""
        return next((c.level for c in self.checks if c.number == 4 and c.passed), None)

    @property
    def advances_state(self) -> bool:
        """Whether the verifier may remember this very checkpoint: verified, and vouched
        for itself (not only through an older anchored checkpoint that covers the
        record; ``state_note`` then says what it may remember instead)."""
        return self.ok and all(c.advances for c in self.checks if c.number == 4)

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.ok else EXIT_CHECK_FAILED

    @property
    def summary(self) -> str:
        if self.ok:
            if self.trust == SELF_ANCHORED:
                return "SELF-ANCHORED (verified against the operator's own anchor only)"
            return "VERIFIED"
        failed = self.failed
        return f"NOT VERIFIED (check {failed.number} failed)" if failed else "NOT VERIFIED"

    def add(self, number: int, passed: bool | None, reason: str,
            level: str | None = None, advances: bool = True) -> bool:
        self.checks.append(Check(number, passed, reason, level, advances))
        self.checks.sort(key=lambda c: c.number)
        return passed is not False

    def to_dict(self) -> dict[str, Any]:
        result = {"record_id": self.record_id, "verified": self.ok, "trust": self.trust,
                  "summary": self.summary,
                  "failed_check": self.failed.number if self.failed else None,
                  "tree_size": self.checkpoint.size if self.checkpoint else None,
                  "checks": [c.to_dict() for c in self.checks]}
        if self.environment is not None:  # a v2 record's, from its checked environment leaf
            result["environment"] = fingerprints(self.environment)
        return result


def record_missing(record_id: str, reason: str) -> Verdict:
    """The verdict when a source that answered has no such record: check 1 fails."""
    verdict = Verdict(record_id)
    verdict.add(1, False, f"the log has no record {record_id!r}: {reason}")
    return _skip_rest(verdict, {2, 3, 4, 5})


def verify_record(
    evidence: Evidence,
    verifier: NoteVerifier,
    origin: str,
    *,
    seen_note: bytes | None = None,
    disclosure: Disclosure | None = None,
    policy: TrustPolicy | None = None,
) -> Verdict:
    """Run checks 1-5 (in the order 1, 3, 2, 4, 5); a failed check stops the ones that
    depend on it."""
    policy = policy or TrustPolicy()
    verdict = Verdict(evidence.record_id)
    leaf = merkle.hash_leaf(evidence.canonical)

    # Check 1: bytes -> leaf hash, and the bytes are the record that was asked for.
    # (Canonical spelling is the writer's job and fsck's; here the bytes must only have
    # one meaning: no duplicate keys, no NaN.)
    body = (_check_leaf_v2(verdict, evidence, leaf, origin)
            if is_envelope(evidence.canonical) else _check_record(verdict, evidence, leaf))
    if body is None:
        return _skip_rest(verdict, {2, 3, 4, 5})

    # Check 3 before 2: the root is only worth proving against once it is authentic.
    try:
        checkpoint = verifier.open_checkpoint(evidence.checkpoint_note, origin)
    except LedgerError as exc:
        verdict.add(3, False, str(exc))
        return _skip_rest(verdict, {2, 4, 5}, "not run: the checkpoint is not authentic")
    verdict.checkpoint = checkpoint
    verdict.add(3, True, f"signed by {verifier.name}+{verifier.key_hash.hex()}")

    # A signed checkpoint beyond the log's own size: the log lost entries it signed for
    # (a truncated copy, or a rewrite), a history problem, not a bad proof.
    if evidence.log_size is not None and checkpoint.size > evidence.log_size:
        verdict.add(2, None, "not run: the log cannot prove inclusion in a tree larger "
                    "than itself")
        verdict.add(4, False, f"the log holds {evidence.log_size} entries but its signed "
                    f"checkpoint covers {checkpoint.size}: entries the log signed for are "
                    "missing from it")
        return _skip_rest(verdict, {5})

    # Check 2: inclusion in the (now authentic) checkpoint.
    if evidence.inclusion_proof is None:
        verdict.add(2, False, "the source could not produce an inclusion proof (its tree "
                    "lacks a node on the path)")
        return _skip_rest(verdict, {4, 5})
    try:
        merkle.verify_inclusion(leaf, evidence.leaf_index, checkpoint.size,
                                evidence.inclusion_proof, checkpoint.root)
    except LedgerError as exc:
        verdict.add(2, False, f"inclusion proof does not hold: {exc}")
        return _skip_rest(verdict, {4, 5})
    where = f"leaf {evidence.leaf_index}"
    if verdict.environment is not None and evidence.environment is not None:
        environment = evidence.environment
        try:
            merkle.verify_inclusion(merkle.hash_leaf(environment.envelope),
                                    environment.leaf_index, checkpoint.size,
                                    environment.inclusion_proof, checkpoint.root)
        except LedgerError as exc:
            verdict.add(2, False, f"the environment leaf's inclusion proof does not hold: "
                        f"{exc}")
            return _skip_rest(verdict, {4, 5})
        where += f" and its environment leaf {environment.leaf_index}"
    if verdict.stream_start_index is not None and evidence.stream_start is not None:
        start = evidence.stream_start
        try:
            merkle.verify_inclusion(merkle.hash_leaf(start.envelope), start.leaf_index,
                                    checkpoint.size, start.inclusion_proof, checkpoint.root)
        except LedgerError as exc:
            verdict.add(2, False, f"the stream start leaf's inclusion proof does not hold: "
                        f"{exc}")
            return _skip_rest(verdict, {4, 5})
        where += f" and its stream start leaf {start.leaf_index}"
    where += " are" if " and " in where else " is"
    verdict.add(2, True, f"{where} in the tree of size {checkpoint.size}")

    # Check 4: no rollback or fork, anchored, and vouched for by someone else.
    try:
        reasons, level, remember = _check_history(evidence, verifier, origin, checkpoint,
                                                  seen_note, policy)
    except LedgerError as exc:
        verdict.add(4, False, f"{type(exc).__name__}: {exc}")
        return _skip_rest(verdict, {5})
    verdict.add(4, True, "; ".join(reasons), level, remember == CHECKPOINT)
    verdict.state_note = (evidence.checkpoint_note if remember == CHECKPOINT
                          else evidence.anchored_note if remember == ANCHOR else None)

    _check_disclosure(verdict, body, disclosure or Disclosure())
    return verdict


def _check_record(verdict: Verdict, evidence: Evidence, leaf: bytes) -> dict[str, Any] | None:
    try:
        body = parse_strict(evidence.canonical)
        validate_body(body)
    except LedgerError as exc:
        verdict.add(1, False, f"record bytes are not an audit record: {exc}")
        return None
    if not isinstance(body, dict) or body.get("record_id") != evidence.record_id:
        got = body.get("record_id") if isinstance(body, dict) else None
        verdict.add(1, False, f"bytes are record {got!r}, not {evidence.record_id!r}")
        return None
    if evidence.log_leaf_hash is not None and evidence.log_leaf_hash != leaf:
        verdict.add(1, False, f"record bytes hash to {leaf.hex()}, the log holds "
                    f"{evidence.log_leaf_hash.hex()} at index {evidence.leaf_index}")
        return None
    verdict.record = body
    verdict.add(1, True, f"leaf hash {leaf.hex()} at index {evidence.leaf_index}")
    return body


def _check_leaf_v2(verdict: Verdict, evidence: Evidence, leaf: bytes, origin: str
                   ) -> dict[str, Any] | None:
    """Check 1 for a v2 leaf: envelope and body together, then the environment leaf a
    record names (its inclusion is check 2's)."""
    if evidence.body is None:
        verdict.add(1, False, "the leaf is a v2 envelope and the source gave no body")
        return None
    try:  # strict: the body must be the very bytes the envelope commits to (0050)
        opened = open_leaf(evidence.canonical, evidence.body, origin, strict=True)
    except LedgerError as exc:
        verdict.add(1, False, f"the v2 leaf does not open: {type(exc).__name__}: {exc}")
        return None
    if opened.record_id != evidence.record_id:
        verdict.add(1, False, f"bytes are record {opened.record_id!r}, not "
                    f"{evidence.record_id!r}")
        return None
    if evidence.log_leaf_hash is not None and evidence.log_leaf_hash != leaf:
        verdict.add(1, False, f"envelope bytes hash to {leaf.hex()}, the log holds "
                    f"{evidence.log_leaf_hash.hex()} at index {evidence.leaf_index}")
        return None
    reason = (f"envelope and body open as {opened.kind}; leaf hash {leaf.hex()} at index "
              f"{evidence.leaf_index}")
    if opened.kind in NAMES_ENVIRONMENT:  # a record or a stream start
        try:
            environment = _check_environment(opened, evidence.leaf_index,
                                             evidence.environment, origin)
        except LedgerError as exc:
            verdict.add(1, False, f"{type(exc).__name__}: {exc}")
            return None
        verdict.environment = dict(environment.content)
        reason += (f"; environment leaf {environment.content['record_id']} "
                   f"({environment.leaf_hash.hex()}) opens and is the one named")
    if named_start(opened) is not None:  # a streamed record
        try:
            start = _check_stream_start(opened, evidence.leaf_index, evidence.stream_start,
                                        origin)
        except LedgerError as exc:
            verdict.add(1, False, f"stream start: {type(exc).__name__}: {exc}")
            return None
        verdict.stream_start_index = start
        reason += (f"; stream start leaf {named_start(opened)} at index {start} opens and "
                   "is the one named, of the same tenant and commitments")
    verdict.record = dict(opened.content)
    verdict.add(1, True, reason)
    return dict(opened.content)


def _check_environment(record: Leaf, record_index: int, given: LeafEvidence | None,
                       origin: str) -> Leaf:
    named = record.content["environment"]
    if given is None:
        raise LeafBindingError(f"the record names environment leaf {named['leaf_index']} "
                               "and the source gave none")
    if given.leaf_index != named["leaf_index"]:
        raise LeafBindingError(f"the source gave leaf {given.leaf_index} as the environment, "
                               f"the record names leaf {named['leaf_index']}")
    environment = open_leaf(given.envelope, given.body, origin, strict=True)
    if environment.kind != ENVIRONMENT_KIND:
        raise LeafBindingError(f"leaf {given.leaf_index} is a {environment.kind}, not an "
                               "environment")
    # An environment is declared before the records that ran under it, by their engine.
    if given.leaf_index >= record_index:
        raise LeafBindingError(f"environment leaf {given.leaf_index} was appended after "
                               f"record leaf {record_index}")
    if environment.content["engine"] != record.content["engine"]:
        raise LeafBindingError(f"the record ran on {record.content['engine']}, its "
                               f"environment leaf is {environment.content['engine']}'s")
    if environment.leaf_hash.hex() != named["leaf_hash"]:
        raise LeafBindingError(f"the environment leaf hashes to "
                               f"{environment.leaf_hash.hex()}, the record names "
                               f"{named['leaf_hash']}")
    return environment


def _check_stream_start(record: Leaf, record_index: int, given: LeafEvidence | None,
                        origin: str) -> int:
    """The index of the start leaf a streamed record names: given by the source,
    opened, the one with that id, and linked to the record as ``stream_start_problem``
    demands (its inclusion is check 2's)."""
    named = named_start(record)
    if given is None:
        raise LeafBindingError(f"the record names stream start {named} and the source "
                               "gave no such leaf")
    start = open_leaf(given.envelope, given.body, origin, strict=True)
    if start.record_id != named:
        raise LeafBindingError(f"the source gave leaf {given.leaf_index} ({start.record_id})"
                               f" as the stream start, the record names {named}")
    problem = stream_start_problem(record, record_index, StartFacts.of(start, given.leaf_index))
    if problem is not None:
        raise LeafBindingError(problem)
    return given.leaf_index


def _check_history(evidence: Evidence, verifier: NoteVerifier, origin: str,
                   checkpoint: Checkpoint, seen_note: bytes | None,
                   policy: TrustPolicy) -> tuple[list[str], str, str | None]:
    """Check 4. Raises the error that names the failure; returns reasons, level and what
    the verifier may remember: CHECKPOINT when it meets the policy itself, ANCHOR when
    only the anchored checkpoint (a proven prefix of it) does, None when neither.

    An anchored checkpoint that covers the record proves the record even when the
    checkpoint is larger than it; but then nobody but the operator vouches for the
    entries after the anchored size, so the verifier must not remember the larger one:
    a fork planted past a genuine anchor would otherwise cut it off the honest log."""
    reasons = []
    # (a) What this verifier saw before. Smaller is a rollback and equal-size-other-root
    # a fork, whatever else the source says: neither needs a proof to be seen.
    if seen_note is not None:
        seen = verifier.open_checkpoint(seen_note, origin)
        if checkpoint.size > seen.size and evidence.seen_consistency is None:
            raise MissingProofError(
                f"no consistency proof from the size {seen.size} this verifier saw to "
                f"size {checkpoint.size} (a bundle carries proofs only from the sizes it "
                f"was exported for: ask for one exported with --since-size {seen.size})")
        check_extends(seen, checkpoint, evidence.seen_consistency or ())
        reasons.append(f"extends the size {seen.size} this verifier saw before"
                       if checkpoint.size > seen.size else
                       f"same tree as the size {seen.size} this verifier saw before")
    else:
        reasons.append("first checkpoint this verifier has seen of this log")

    # (b) The anchored checkpoint: authentic and on the same history.
    anchored: Checkpoint | None = None
    if evidence.anchored_note is not None:
        anchored = verifier.open_checkpoint(evidence.anchored_note, origin)
        older, newer = sorted((anchored, checkpoint), key=lambda c: c.size)
        if older.size < newer.size and evidence.anchor_consistency is None:
            raise MissingProofError(f"no consistency proof between the anchored size "
                                    f"{anchored.size} and size {checkpoint.size}")
        check_extends(older, newer, evidence.anchor_consistency or ())
        reasons.append(f"consistent with anchored size {anchored.size} "
                       f"({evidence.anchor_ref or 'no reference'})")

    # (c) Who vouches for it besides the operator.
    covers_checkpoint = anchored is not None and anchored.size >= checkpoint.size
    if policy.fabric and evidence.anchor_from_fabric and anchored is not None:
        remember: str | None = CHECKPOINT if covers_checkpoint or _quorum_on_checkpoint(
            evidence, policy) else ANCHOR  # the channel vouches for the anchored note
        return (reasons + ["anchored on Fabric" + _no_advance(remember, checkpoint,
                                                              anchored)], FABRIC, remember)
    if policy.witnesses:
        own = _cosigners(evidence.checkpoint_note, tuple(policy.witnesses))
        found, by_anchor = dict(own), {}
        if anchored is not None and anchored.size > evidence.leaf_index:
            by_anchor = _cosigners(evidence.anchored_note or b"", tuple(policy.witnesses))
            found.update(by_anchor)
            if covers_checkpoint:
                own = found
        if len(found) >= policy.required:
            remember = (CHECKPOINT if len(own) >= policy.required
                        else ANCHOR if len(by_anchor) >= policy.required else None)
            return reasons + [f"cosigned by {len(found)} of {len(policy.witnesses)} "
                              f"pinned witnesses ({', '.join(sorted(found))}; quorum "
                              f"{policy.required})"
                              + _no_advance(remember, checkpoint, anchored)], WITNESSED, remember
        missing = [w.name for w in policy.witnesses if w.name not in found]
        raise QuorumError(sorted(found), missing, policy.required)
    if policy.fabric:
        raise AnchorMissingError("no anchored checkpoint for this log on the Fabric channel")
    if anchored is None and policy.require_anchor:
        raise AnchorMissingError("no anchored checkpoint was found for this log")
    where = evidence.anchor_ref or "no anchor"
    if not policy.accept_self_anchored:
        raise SelfAnchoredError(
            f"self-anchored: the only anchor ({where}) is kept by the operator, who "
            "vouches for itself; check a Fabric anchor (--fabric-*) or witness "
            "cosignatures (--witness), or accept this with --accept-self-anchored")
    return reasons + [f"SELF-ANCHORED: only the operator's own anchor ({where}); "
                      "accepted by --accept-self-anchored"], SELF_ANCHORED, CHECKPOINT


def _quorum_on_checkpoint(evidence: Evidence, policy: TrustPolicy) -> bool:
    if not policy.witnesses:
        return False
    own = _cosigners(evidence.checkpoint_note, tuple(policy.witnesses))
    return len(own) >= policy.required


def _no_advance(remember: str | None, checkpoint: Checkpoint,
                anchored: Checkpoint | None) -> str:
    if remember == CHECKPOINT or anchored is None:
        return ""
    kept = (f"remembers the anchored size {anchored.size}, not this one"
            if remember == ANCHOR else "does not remember it")
    return (f" (the record is proven through the anchored size {anchored.size}; the "
            f"size-{checkpoint.size} checkpoint itself is vouched for by nobody but the "
            f"operator, so this verifier {kept})")


@lru_cache(maxsize=64)
def _cosigners(note: bytes, witnesses: tuple[WitnessKey, ...]) -> dict[str, int]:
    # A bundle repeats one checkpoint for every record: check its cosignatures once.
    return valid_cosigners(note, witnesses)


def opens_commitment(body: dict[str, Any], key: str, salt: bytes, value: bytes) -> bool:
    """Does ``salt`` open the record's commitment ``key`` (v1 ``input_commitment`` /
    ``output_commitment``) to ``value``? A v2 record holds them as labelled HMACs."""
    if isinstance(body.get("commitments"), dict):  # a v2 record or stream start
        label = commitments.INPUT if key == "input_commitment" else commitments.OUTPUT
        held = body["commitments"].get(label)
        return held is not None and commitments.opens(str(held), salt, label, value)
    return commitment_matches(str(body.get("data", {}).get(key, "")), salt, value)


def _check_disclosure(verdict: Verdict, body: dict[str, Any], disclosure: Disclosure) -> None:
    data = body.get("data", {})
    if isinstance(body.get("commitments"), dict):  # v2: the names check 5 looks for
        held = body["commitments"]
        data = {f"{label}_commitment": True for label in (commitments.INPUT,
                                                          commitments.OUTPUT)
                if label in held}
    given = any(v is not None for v in (disclosure.prompt, disclosure.input_salt,
                                        disclosure.output, disclosure.output_salt))
    if given and "input_commitment" not in data and "output_commitment" not in data:
        verdict.add(5, False, f"this leaf ({body.get('schema')}) holds no commitment to open")
        return
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
        elif opens_commitment(body, key, salt, text):
            opened.append(label)
        else:
            failures.append(f"{label} or its salt does not match {key}")
    if failures:
        verdict.add(5, False, "; ".join(failures))
    elif opened:
        verdict.add(5, True, f"{' and '.join(opened)} match the record")
    else:
        verdict.add(5, None, "; ".join(notes) or "no prompt or output given")


def _skip_rest(verdict: Verdict, numbers: set[int],
               reason: str = "not run: an earlier check failed") -> Verdict:
    for number in sorted(numbers):
        verdict.add(number, None, reason)
    return verdict

