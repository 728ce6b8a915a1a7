"""Verify a past inference: numbered checks, each with its reason.

Exit 0 verified, 1 a check failed, 2 usage error, 3 evidence source unreachable.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from audit_cli.evidence import add_key_option, add_source_options, open_source, pinned_verifier
from audit_cli.options import print_json
from ledger.checkpoint import Checkpoint
from ledger.errors import InvalidInputError
from ledger.verify import Check, Disclosure, Verdict, verify_record


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("record_id", nargs="?", help="the record (all records of a bundle "
                        "when omitted)")
    add_source_options(parser)
    add_key_option(parser)
    parser.add_argument("--prompt-file", type=Path)
    parser.add_argument("--input-salt", help="hex salt returned with the answer")
    parser.add_argument("--output-file", type=Path)
    parser.add_argument("--output-salt", help="hex salt returned with the answer")
    parser.add_argument("--replay", action="store_true",
                        help="re-run the model named by the record and compare (needs torch)")
    parser.add_argument("--model-dir", type=Path, help="model directory for --replay")
    parser.add_argument("--model-manifest", type=Path)
    fabric = parser.add_argument_group("check the anchor on a Fabric channel")
    fabric.add_argument("--fabric-endpoint", help="a peer's Gateway, host:port")
    fabric.add_argument("--fabric-mspid")
    fabric.add_argument("--fabric-cert", type=Path, help="enrolment certificate (PEM)")
    fabric.add_argument("--fabric-key", type=Path, help="its private key (PEM)")
    fabric.add_argument("--fabric-tls-ca", type=Path)
    fabric.add_argument("--fabric-channel", default="auditchannel")
    fabric.add_argument("--fabric-chaincode", default="anchor")
    parser.add_argument("--state", type=Path, help="this verifier's state file")
    parser.add_argument("--no-state", action="store_true",
                        help="neither read nor advance the state file")


def _salt(value: str | None, name: str) -> bytes | None:
    if value is None:
        return None
    try:
        return bytes.fromhex(value)
    except ValueError as exc:
        raise InvalidInputError(name, "must be hex") from exc


def _read(path: Path | None) -> str | None:
    return path.read_text(encoding="utf-8") if path is not None else None


def _print_verdict(verdict: Verdict) -> None:
    marks = {True: "PASS", False: "FAIL", None: "skip"}
    print(f"record {verdict.record_id}")
    for check in verdict.checks:
        print(f"  [{marks[check.passed]}] {check.number}. {check.name}: {check.reason}")
    print("VERIFIED" if verdict.ok else f"NOT VERIFIED (check {verdict.failed.number} failed)"
          if verdict.failed else "NOT VERIFIED")


def _replay_check(verdict: Verdict, args: argparse.Namespace, prompt: str | None) -> None:
    if not args.replay or verdict.record is None or verdict.failed:
        return
    if prompt is None:
        raise InvalidInputError("--prompt-file", "--replay needs the prompt")
    from inference_wrapper.replay import replay

    result = replay(verdict.record, prompt, model_dir=args.model_dir,
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


def run(args: argparse.Namespace) -> int:
    from ledger.client.state import default_state_path, load_seen

    verifier = pinned_verifier(args)
    origin = verifier.name
    prompt, output = _read(args.prompt_file), _read(args.output_file)
    disclosure = Disclosure(prompt, _salt(args.input_salt, "--input-salt"), output,
                            _salt(args.output_salt, "--output-salt"))
    state_path = args.state or default_state_path(verifier)
    seen = None if args.no_state else load_seen(state_path)

    if args.bundle:
        return _verify_bundle(args, verifier, origin, disclosure, seen, prompt)
    if not args.record_id:
        raise InvalidInputError("record_id", "is required unless verifying a bundle")
    source = open_source(args)
    reader, gateway = _fabric_reader(args, origin)
    try:
        from ledger.client.sources import gather

        evidence = gather(source, args.record_id, seen, reader)
        if gateway is not None and evidence.anchor_ref:
            evidence = _with_block(evidence, source)
    finally:
        if hasattr(source, "ledger"):
            source.ledger.close()
        if gateway is not None:
            gateway.close()
    verdict = verify_record(evidence, verifier, origin, seen_note=seen, disclosure=disclosure)
    _replay_check(verdict, args, prompt)
    _report([verdict], args)
    if verdict.ok and not args.no_state and verdict.checkpoint is not None:
        _advance(state_path, seen, evidence.checkpoint_note, verdict)
    return 0 if verdict.ok else 1


def _fabric_reader(args: argparse.Namespace, origin: str) -> tuple[Any, Any]:
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
    return FabricAnchorReader(gateway, origin), gateway


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


def _advance(path: Path, seen: bytes | None, note: bytes, verdict: Verdict) -> None:
    """Remember the newly verified checkpoint if it is larger than the one seen before."""
    from ledger.client.state import save_seen

    assert verdict.checkpoint is not None
    if seen is None or verdict.checkpoint.size > Checkpoint.peek(seen).size:
        save_seen(path, note)


def _verify_bundle(args: argparse.Namespace, verifier: Any, origin: str,
                   disclosure: Disclosure, seen: bytes | None, prompt: str | None) -> int:
    from ledger.bundle import Bundle
    bundle = Bundle.loads(args.bundle.read_bytes())
    # Offline there is no proof between the remembered checkpoint and the bundle's, so
    # the state can only be compared at equal sizes (where a split view shows).
    comparable = seen if seen is not None and Checkpoint.peek(seen).size == Checkpoint.peek(
        bundle.checkpoint).size else None
    verdicts = []
    for evidence in bundle.evidence(args.record_id):
        verdict = verify_record(evidence, verifier, origin, seen_note=comparable,
                                disclosure=disclosure if args.record_id else None)
        _replay_check(verdict, args, prompt)
        verdicts.append(verdict)
    if args.record_id and not verdicts:
        raise InvalidInputError("record_id", f"{args.record_id} is not in the bundle")
    _report(verdicts, args)
    return 0 if verdicts and all(v.ok for v in verdicts) else 1


def _report(verdicts: list[Verdict], args: argparse.Namespace) -> None:
    if args.json:
        if len(verdicts) == 1:
            print_json(verdicts[0].to_dict())
        else:
            print_json({"verified": sum(v.ok for v in verdicts), "failed": sum(
                not v.ok for v in verdicts), "results": [v.to_dict() for v in verdicts]})
        return
    if len(verdicts) == 1:
        _print_verdict(verdicts[0])
        return
    failed = [v for v in verdicts if not v.ok]
    for verdict in failed:
        _print_verdict(verdict)
    print(f"{len(verdicts) - len(failed)} of {len(verdicts)} records verified", file=sys.stdout)
