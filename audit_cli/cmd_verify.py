"""Verify a past inference: numbered checks, each with its reason.

Exit 0 verified, 1 a check failed (named), 2 usage error, 3 evidence source unreachable,
4 internal error. Check 4 needs someone besides the operator to vouch for the checkpoint:
a Fabric anchor (--fabric-*) or witness cosignatures (--witness); the operator's own
anchor alone passes only with --accept-self-anchored, and reads SELF-ANCHORED.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from audit_cli.evidence import (
    add_key_option,
    add_source_options,
    one_source,
    open_source,
    pinned_verifier,
)
from audit_cli.options import print_json
from ledger.checkpoint import Checkpoint, NoteVerifier
from ledger.client.sources import RecordNotFoundError, gather
from ledger.cosignature import WitnessKey
from ledger.error_map import EXIT_CHECK_FAILED, EXIT_OK
from ledger.errors import InvalidInputError, LedgerError
from ledger.leaves.environment import fingerprints
from ledger.leaves.record_v2 import RECORD_KIND
from ledger.record import RECORD_SCHEMA
from ledger.verify import (
    SELF_ANCHORED,
    Check,
    Disclosure,
    TrustPolicy,
    Verdict,
    record_missing,
    verify_record,
)


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("record_id", nargs="?", help="the record (all records of a bundle "
                        "when omitted)")
    add_source_options(parser)
    add_key_option(parser)
    parser.add_argument("--origin", help="the log's origin line (default: the one the "
                        "checkpoint names; give it to refuse other logs of the same key)")
    opening = parser.add_argument_group(
        "open the commitments (files are read as exact bytes: CRLF line endings are kept "
        "and no newline is added or stripped)")
    prompt = opening.add_mutually_exclusive_group()
    prompt.add_argument("--prompt-file", type=Path, help="the prompt, as the exact bytes sent")
    prompt.add_argument("--prompt", help="the prompt as inline text (committed as UTF-8)")
    opening.add_argument("--input-salt", help="hex salt returned with the answer")
    output = opening.add_mutually_exclusive_group()
    output.add_argument("--output-file", type=Path, help="the output, as the exact bytes "
                        "returned")
    output.add_argument("--output", help="the output as inline text (committed as UTF-8)")
    opening.add_argument("--output-salt", help="hex salt returned with the answer")
    parser.add_argument("--replay", action="store_true",
                        help="re-run the model named by the record and compare (needs torch)")
    parser.add_argument("--model-dir", type=Path, help="model directory for --replay")
    parser.add_argument("--stop", action="append", default=[], metavar="TEXT",
                        help="--replay of a v2 record: the request's stop strings, in order "
                        "(the record holds them only as a commitment)")
    parser.add_argument("--model-manifest", type=Path)
    trust = parser.add_argument_group(
        "who vouches for the checkpoint (check 4): a Fabric anchor, witnesses, or, "
        "explicitly accepted, the operator's own anchor")
    trust.add_argument("--witness", action="append", default=[], metavar="VKEY",
                       help="a pinned witness key (name+hash+base64) or a file of them, one "
                            "per line; repeatable")
    trust.add_argument("--witness-quorum", type=int, metavar="K",
                       help="valid cosignatures needed (default: every --witness)")
    trust.add_argument("--accept-self-anchored", action="store_true",
                       help="accept a checkpoint only the operator's own (local) anchor "
                            "vouches for; the result then reads SELF-ANCHORED")
    fabric = parser.add_argument_group("check the anchor on a Fabric channel")
    fabric.add_argument("--fabric-endpoint", help="a peer's Gateway, host:port")
    fabric.add_argument("--fabric-mspid")
    fabric.add_argument("--fabric-cert", type=Path, help="enrolment certificate (PEM)")
    fabric.add_argument("--fabric-key", type=Path, help="its private key (PEM)")
    fabric.add_argument("--fabric-tls-ca", type=Path)
    fabric.add_argument("--fabric-channel", default="auditchannel")
    fabric.add_argument("--fabric-chaincode", default="anchor")
    parser.add_argument("--state", type=Path, help="this verifier's state file (default: one "
                        "per log under AUDIT_LEDGER_HOME/verifier)")
    parser.add_argument("--no-state", action="store_true",
                        help="neither read nor advance the state file")
    parser.add_argument("--report", type=Path, metavar="DIR",
                        help="an evidence pack from `audit-ledger report`: recompute its "
                             "digest from its files and compare it with the report record "
                             "in the log (--db or --server; the record is verified too)")
    window = parser.add_argument_group("a window bundle (export --window): filters applied "
                                       "locally to its window's leaves")
    from audit_cli.filters import FILTERS

    for name in FILTERS:
        window.add_argument(f"--{name.replace('_', '-')}", dest=name)
    window.add_argument("--since", help="RFC 3339 time (UTC if no zone): the bundle must "
                        "prove a window that starts no later")
    window.add_argument("--until", help="RFC 3339 time: the bundle's window must end no "
                        "earlier")


def _salt(value: str | None, name: str) -> bytes | None:
    if value is None:
        return None
    try:
        return bytes.fromhex(value)
    except ValueError as exc:
        raise InvalidInputError(name, "must be hex") from exc


def _read(path: Path | None, text: str | None, name: str) -> bytes | None:
    """The exact bytes of a file (nothing normalised), or inline text as UTF-8."""
    if text is not None:
        return text.encode("utf-8")
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InvalidInputError(name, f"cannot read {path}: {exc.strerror}") from exc


def _witnesses(values: list[str]) -> list[WitnessKey]:
    keys: list[WitnessKey] = []
    for value in values:
        lines = [value]
        if Path(value).is_file():
            lines = Path(value).read_text(encoding="utf-8").splitlines()
        for line in lines:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                keys.append(WitnessKey.decode(line))
            except ValueError as exc:
                raise InvalidInputError("--witness", f"{line[:40]!r}: {exc}") from exc
    return keys


def pinned_witnesses(args: argparse.Namespace) -> tuple[list[WitnessKey], int | None]:
    """``--witness`` and ``--witness-quorum`` checked as one policy, for every command
    that trusts a checkpoint by its cosignatures (verify, query --prove, restore)."""
    witnesses = _witnesses(args.witness)
    names = [w.name for w in witnesses]
    if len(set(names)) != len(names):
        raise InvalidInputError("--witness", "the same witness name is given twice")
    # A cosignature does not commit to the witness's name: one key pinned under two names
    # would count one witness twice toward the quorum.
    if len({w.public_key for w in witnesses}) != len(witnesses):
        raise InvalidInputError("--witness", "the same witness key is given twice")
    quorum = args.witness_quorum
    if quorum is not None and not witnesses:
        raise InvalidInputError("--witness-quorum", "needs at least one --witness")
    if quorum is not None and not 1 <= quorum <= len(witnesses):
        raise InvalidInputError("--witness-quorum",
                                f"must be between 1 and {len(witnesses)} (the witnesses given)")
    return witnesses, quorum


def _policy(args: argparse.Namespace) -> TrustPolicy:
    witnesses, quorum = pinned_witnesses(args)
    return TrustPolicy(witnesses=witnesses, quorum=quorum, fabric=bool(args.fabric_endpoint),
                       accept_self_anchored=args.accept_self_anchored)


def _print_verdict(verdict: Verdict) -> None:
    marks = {"pass": "PASS", "fail": "FAIL", "skipped": "skip", SELF_ANCHORED: "SELF"}
    print(f"record {verdict.record_id}")
    for check in verdict.checks:
        print(f"  [{marks[check.status]}] {check.number}. {check.name}: {check.reason}")
    if verdict.environment is not None:  # v2: the fingerprints are the environment leaf's
        print("  environment (from its own leaf, checked in 1 and 2):")
        for name, value in fingerprints(verdict.environment).items():
            print(f"    {name}: {value}")
    print(verdict.summary)


def _replay_check(verdict: Verdict, args: argparse.Namespace, prompt: bytes | None) -> None:
    if not args.replay or verdict.record is None or verdict.failed:
        return
    if verdict.record.get("schema") not in (RECORD_SCHEMA, RECORD_KIND):
        raise InvalidInputError("--replay", f"replay re-runs a generate call; this leaf is "
                                f"a {verdict.record.get('schema')!r}")
    if prompt is None:
        raise InvalidInputError("--prompt-file", "--replay needs the prompt")
    try:
        text = prompt.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError("--prompt-file", "--replay needs a UTF-8 prompt") from exc
    from inference_wrapper.audit.replay import replay, replay_v2

    if verdict.record.get("schema") == RECORD_KIND:
        assert verdict.environment is not None  # check 1 opened it
        result = replay_v2(verdict.record, verdict.environment, text,
                           input_salt=_salt(args.input_salt, "--input-salt"),
                           output_salt=_salt(args.output_salt, "--output-salt"),
                           stop=tuple(args.stop), model_dir=args.model_dir,
                           manifest_path=args.model_manifest)
    else:
        result = replay(verdict.record, text, model_dir=args.model_dir,
                        manifest_path=args.model_manifest)
    why = "; ".join(result.differences) or "no fingerprint differs"
    if result.reproduced:
        verdict.checks.append(Check(6, True, f"output token digest reproduced "
                                    f"({result.replayed_output_digest}); {why}"))
    else:
        verdict.checks.append(Check(6, False, f"output token digest {result.replayed_output_digest}"
                                    f" differs from recorded {result.recorded_output_digest}; "
                                    f"input ids {'match' if result.input_ids_match else 'differ'};"
                                    f" differences: {why}"))


# A concurrent verifier may advance the state between our read and our write; we then
# verify again against what it stored. More than a few rounds means something is odd.
STATE_ATTEMPTS = 5


def run(args: argparse.Namespace) -> int:
    one_source(args)  # --bundle with --server or --db: which one was meant is unknown
    if args.report:
        return _verify_report(args)
    verifier = pinned_verifier(args)
    args.verifier_name = verifier.name  # the default origin (see _origin)
    policy = _policy(args)
    prompt = _read(args.prompt_file, args.prompt, "--prompt-file")
    output = _read(args.output_file, args.output, "--output-file")
    disclosure = Disclosure(prompt, _salt(args.input_salt, "--input-salt"), output,
                            _salt(args.output_salt, "--output-salt"))
    state = _State(args, verifier)
    if args.bundle and _is_window_bundle(args.bundle):
        return _verify_window(args, verifier)
    for name in ("since", "until"):  # a record or record bundle proves no window
        if getattr(args, name) is not None:
            raise InvalidInputError(f"--{name}", "applies to a window bundle "
                                    "(export --window)")
    if args.bundle:
        return _verify_bundle(args, verifier, policy, disclosure, state)
    if not args.record_id:
        raise InvalidInputError("record_id", "is required unless verifying a bundle")
    source = open_source(args)
    reader, gateway = _fabric_reader(args, args.origin or verifier.name, verifier)
    try:
        for _ in range(STATE_ATTEMPTS):
            try:
                evidence = gather(source, args.record_id, state.load_for, reader)
            except RecordNotFoundError as exc:
                verdict = record_missing(args.record_id, str(exc))
                break
            if gateway is not None and evidence.anchor_ref:
                evidence = _with_block(evidence, source)
            origin = _origin(args, evidence.checkpoint_note)
            verdict = verify_record(evidence, verifier, origin, seen_note=state.seen,
                                    disclosure=disclosure, policy=policy)
            # Only a checkpoint that itself meets the trust policy is remembered (or the
            # anchored prefix of it that does).
            if not verdict.ok or verdict.state_note is None \
                    or state.advance(verdict.state_note):
                break
    finally:
        if hasattr(source, "ledger"):
            source.ledger.close()
        if gateway is not None:
            gateway.close()
    _replay_check(verdict, args, prompt)
    _report([verdict], args)
    return verdict.exit_code


def _verify_report(args: argparse.Namespace) -> int:
    """The pack's digest, recomputed from its files, against the one the log holds."""
    import json

    from audit_cli.report_pack import recompute

    if one_source(args) not in ("db", "server"):
        raise InvalidInputError("--db", "verify --report reads the logged digest from the "
                                "log: give --db or --server")
    verifier = pinned_verifier(args)
    digest, problems = recompute(args.report)
    try:
        logged = json.loads((args.report / "report.record.json").read_text())
        record_id = str(logged["record_id"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InvalidInputError("--report", f"{args.report} has no readable "
                                f"report.record.json (made with --no-log?): {exc}") from exc
    source = open_source(args)
    try:
        evidence = gather(source, record_id, None)
    except RecordNotFoundError as exc:
        verdict = record_missing(record_id, str(exc))
    else:
        verdict = verify_record(evidence, verifier, args.origin or verifier.name,
                                policy=_policy(args))
    finally:
        if hasattr(source, "ledger"):
            source.ledger.close()
    logged_digest = (verdict.record or {}).get("report", {}).get("digest")
    if not verdict.ok:
        problems.append(f"the report record {record_id} does not verify: {verdict.summary}")
    elif logged_digest != digest:
        problems.append(f"the pack's digest is {digest}; the log's report record "
                        f"{record_id} names {logged_digest}")
    if args.json:
        print_json({"report": str(args.report), "pack_digest": digest,
                    "logged_digest": logged_digest, "verified": not problems,
                    "problems": problems, "record": verdict.to_dict()})
    else:
        _print_verdict(verdict)
        for problem in problems:
            print(f"  [FAIL] {problem}")
        print(f"pack {args.report}: " + ("digest MATCHES the log" if not problems else
                                         "NOT verified"))
    return EXIT_OK if not problems else EXIT_CHECK_FAILED


class _State:
    """The state file of the log being verified, found once its origin is known."""

    def __init__(self, args: argparse.Namespace, verifier: NoteVerifier) -> None:
        self.args, self.verifier = args, verifier
        self.path: Path | None = None
        self.seen: bytes | None = None

    def load_for(self, checkpoint_note: bytes) -> bytes | None:
        from ledger.client.state import default_state_path, load_seen

        if self.args.no_state:
            return None
        origin = _origin(self.args, checkpoint_note)
        self.path = self.args.state or default_state_path(self.verifier, origin)
        try:
            self.seen = load_seen(self.path)
        except OSError as exc:
            raise InvalidInputError("--state", f"cannot read the state file {self.path}: "
                                    f"{exc.strerror}") from exc
        if self.seen is not None:
            # The verifier's own memory, not evidence: a state it cannot read is named
            # as such (never blamed on the log being verified).
            try:
                self.verifier.open_checkpoint(self.seen, origin)
            except LedgerError as exc:
                raise InvalidInputError(
                    "--state", f"the state file {self.path} is not a checkpoint of {origin} "
                    f"signed by the pinned key ({exc}); it was damaged or replaced: "
                    "restore it, or remove it to start afresh (losing rollback "
                    "detection up to now)") from exc
        return self.seen

    def advance(self, note: bytes) -> bool:
        """Store ``note`` if the state still holds what we verified against; False when
        another verifier moved it meanwhile (verify again)."""
        from ledger.client.state import compare_and_swap

        if self.args.no_state or self.path is None:
            return True
        return compare_and_swap(self.path, self.seen, note)


def _origin(args: argparse.Namespace, checkpoint_note: bytes) -> str:
    """The log's origin: ``--origin``, else the pinned key's name (the service names its
    key after its log's origin). Never the checkpoint's own origin line: a log that could
    pick its origin could pick an empty state file, and with it escape rollback and fork
    detection (the checkpoint must then match this origin, or check 3 fails)."""
    return str(args.origin) if args.origin else args.verifier_name


def _fabric_reader(args: argparse.Namespace, origin: str,
                   verifier: NoteVerifier) -> tuple[Any, Any]:
    if not args.fabric_endpoint:
        return None, None
    if not (args.fabric_mspid and args.fabric_cert and args.fabric_key):
        raise InvalidInputError("--fabric-mspid", "--fabric-mspid, --fabric-cert and "
                                "--fabric-key are needed with --fabric-endpoint")
    from ledger.anchor.fabric import FabricGateway, Identity
    from ledger.client.fabric_reader import FabricAnchorReader

    gateway = FabricGateway(args.fabric_endpoint,
                            Identity.from_files(args.fabric_mspid, args.fabric_cert,
                                                args.fabric_key),
                            args.fabric_channel, args.fabric_chaincode,
                            tls_ca=args.fabric_tls_ca)
    return FabricAnchorReader(gateway, origin, verifier), gateway


def _with_block(evidence: Any, source: Any) -> Any:
    """Add the block number the service recorded for the same Fabric transaction."""
    from dataclasses import replace

    try:
        recorded = source.anchored()
    except Exception:
        return evidence
    if recorded and recorded[1].startswith(str(evidence.anchor_ref) + ":"):
        block = recorded[1].rsplit(":", 1)[1]
        return replace(evidence, anchor_ref=f"{evidence.anchor_ref} block {block}")
    return evidence


def _verify_bundle(args: argparse.Namespace, verifier: NoteVerifier, policy: TrustPolicy,
                   disclosure: Disclosure, state: _State) -> int:
    from ledger.bundle import MAX_BUNDLE_BYTES, Bundle

    try:
        if args.bundle.stat().st_size > MAX_BUNDLE_BYTES:
            raise InvalidInputError("--bundle", f"{args.bundle} is larger than "
                                    f"{MAX_BUNDLE_BYTES} bytes: export it in parts")
        bundle = Bundle.loads(args.bundle.read_bytes())
    except OSError as exc:
        raise InvalidInputError("--bundle", f"cannot read {args.bundle}: {exc.strerror}") from exc
    origin = _origin(args, bundle.checkpoint)
    anchor = _bundle_anchor(args, verifier, bundle)
    for _ in range(STATE_ATTEMPTS):
        seen = state.load_for(bundle.checkpoint)
        # An entry that cannot be read fails check 1; the others are still judged.
        verdicts = [record_missing(entry.record_id, str(entry.problem))
                    for entry in bundle.problems(args.record_id)]
        for evidence in bundle.evidence(args.record_id, seen):
            if anchor is not None:
                evidence = replace(evidence, **anchor)
            verdict = verify_record(evidence, verifier, origin, seen_note=seen, policy=policy,
                                    disclosure=disclosure if args.record_id else None)
            verdicts.append(verdict)
        if args.record_id and not verdicts:
            verdicts = [record_missing(args.record_id, "the bundle holds no such record")]
        # Once every record verified, what they let us remember (the bundle's checkpoint
        # if it meets the trust policy itself, else its anchored prefix that does).
        notes = {v.state_note for v in verdicts}
        if not verdicts or not all(v.ok for v in verdicts) or len(notes) != 1 \
                or None in notes or state.advance(notes.pop() or b""):
            break
    for verdict in verdicts:
        _replay_check(verdict, args, disclosure.prompt)
    _report(verdicts, args)
    return EXIT_OK if verdicts and all(v.ok for v in verdicts) else EXIT_CHECK_FAILED


def _bundle_anchor(args: argparse.Namespace, verifier: NoteVerifier,
                   bundle: Any) -> dict[str, Any] | None:
    """With --fabric-*, the anchor read from the channel replaces the bundle's claim; its
    consistency proof comes from the bundle's proofs from earlier sizes."""
    reader, gateway = _fabric_reader(args, _origin(args, bundle.checkpoint), verifier)
    if reader is None:
        return None
    try:
        anchored = reader()
    finally:
        gateway.close()
    if anchored is None:
        return {"anchored_note": None, "anchor_ref": None, "anchor_from_fabric": False}
    size = Checkpoint.peek(anchored[0]).size
    proof = [] if size == bundle.size else bundle.consistency_from.get(size) \
        if size < bundle.size else None
    return {"anchored_note": anchored[0], "anchor_ref": anchored[1],
            "anchor_consistency": proof, "anchor_from_fabric": True}


def _report(verdicts: list[Verdict], args: argparse.Namespace) -> None:
    trust = sorted({v.trust for v in verdicts if v.trust})
    if args.json:
        if len(verdicts) == 1:
            print_json(verdicts[0].to_dict())
        else:
            print_json({"verified": sum(v.ok for v in verdicts), "failed": sum(
                not v.ok for v in verdicts), "trust": trust,
                "results": [v.to_dict() for v in verdicts]})
        return
    if len(verdicts) == 1:
        _print_verdict(verdicts[0])
        return
    failed = [v for v in verdicts if not v.ok]
    for verdict in failed:
        _print_verdict(verdict)
    print(f"{len(verdicts) - len(failed)} of {len(verdicts)} records verified")
    if SELF_ANCHORED in trust:
        print("SELF-ANCHORED: only the operator's own anchor vouches for this checkpoint")


def _utc_text(moment: datetime) -> str:
    """A bundle's window edge as RFC 3339 UTC (a time without a zone is UTC)."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    return moment.isoformat() + "Z"


def _is_window_bundle(path: Path) -> bool:
    from ledger.window_bundle import is_window_bundle

    try:
        with open(path, encoding="utf-8") as handle:
            return is_window_bundle(handle.read(200))
    except (OSError, UnicodeDecodeError):
        return False  # the bundle reader names what is wrong with it


def _verify_window(args: argparse.Namespace, verifier: NoteVerifier) -> int:
    """A window bundle: every leaf of its range present and checked against its signed
    (and witnessed) checkpoint; filters (--tenant etc.) applied locally."""
    from audit_cli.filters import FILTERS, parse_time
    from audit_cli.windows import leaf_filter, trusted_checkpoint
    from ledger.window import check_covers
    from ledger.window_bundle import BundleReader, WindowBundle, check_bundle

    since, until = parse_time(args.since, "--since"), parse_time(args.until, "--until")
    bundle = WindowBundle.loads(args.bundle.read_text(encoding="utf-8"))
    checkpoint, vouched = trusted_checkpoint(args, verifier, bundle.checkpoint)
    filters = {n: getattr(args, n) for n in FILTERS if getattr(args, n, None)}
    reader = BundleReader(bundle, checkpoint)  # its bodies, checked as the filter reads them
    answer = check_bundle(bundle, checkpoint, leaf_filter(filters, checkpoint.origin, reader),
                          reader)
    check_covers((bundle.since, bundle.until), since, until)
    window = [_utc_text(bundle.since), _utc_text(bundle.until)]
    if args.json:
        print_json({"complete": True, "since": window[0], "until": window[1],
                    "start": answer.start, "end": answer.end,
                    "in_window": answer.in_window, "matched": len(answer.matched),
                    "tree_size": answer.tree_size, "checkpoint": vouched})
    else:
        print(f"window proved: [{window[0]}, {window[1]})")
        print(f"{answer.summary()} (signed checkpoint of size {answer.tree_size}, "
              f"{vouched}; {answer.in_window} leaves in the window)")
    return EXIT_OK
