"""Inspect the log: checkpoint, fsck, consistency, public-key."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from audit_cli.evidence import add_key_option, pinned_verifier
from audit_cli.filters import progress_printer
from audit_cli.options import print_json
from audit_cli.remembered import Memory, add_state_options
from ledger.checkpoint import Checkpoint, NoteVerifier
from ledger.errors import (
    CheckpointFormatError,
    InvalidInputError,
    SignatureError,
    VerificationError,
)


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", help="ledger database URL (default: the service's)")
    add_key_option(parser)
    add_state_options(parser)
    parser.add_argument("--key-file", type=Path,
                        help="the log's signing key file (operators; default: the service's)")
    actions = parser.add_subparsers(dest="action", required=True)
    actions.add_parser("checkpoint", help="the latest signed checkpoint")
    fsck = actions.add_parser("fsck", help="recompute everything from the stored bytes")
    fsck.add_argument("--workers", type=int, default=None,
                      help="processes checking the rows by ranges (default: one per core, "
                           "at most 8; 1: all in this process)")
    consistency = actions.add_parser("consistency", help="prove FROM is a prefix of TO")
    consistency.add_argument("first", type=int)
    consistency.add_argument("second", type=int)
    actions.add_parser("public-key", help="the verifier key to pin")
    publish = actions.add_parser("publish", help="publish the log as C2SP tlog-tiles")
    publish.add_argument("--to", required=True, help="a directory or s3://bucket[/prefix]")
    publish.add_argument("--retention-days", type=int, default=None,
                         help="S3 Object Lock retention (compliance mode; default 2557)")


def _settings(args: argparse.Namespace) -> tuple[str, Path]:
    from inference_wrapper.server.settings import Settings

    settings = Settings.from_env()
    return args.db or settings.database_url, args.key_file or settings.log_key_path


def _verifier(args: argparse.Namespace, key_file: Path, origin: str | None = None
              ) -> NoteVerifier:
    if args.log_key:
        return pinned_verifier(args)
    from ledger.store.keys import bind_to_origin, decode_signer_key

    if not key_file.is_file():
        raise InvalidInputError("--log-key", "give the pinned log key or --key-file")
    signer = decode_signer_key(key_file.read_text())
    # One key may sign several logs: it signs each under that log's origin.
    return (bind_to_origin(signer, origin) if origin else signer).verifier()


def _public_key(args: argparse.Namespace, url: str, key_file: Path) -> NoteVerifier:
    """The verifier key to pin: ``--log-key`` as given; else, with ``--db``, the one the
    log database itself recorded when it was created (no signing key needed: auditors
    have the database, not the key); else from the signing key file."""
    if args.log_key:
        return pinned_verifier(args)
    if args.db:
        stored = _log_meta(args.db)
        if stored is not None:
            try:
                return NoteVerifier.decode(stored[1])
            except ValueError as exc:
                raise CheckpointFormatError(f"the log's stored verifier key is not one: "
                                            f"{exc}") from exc
        if not key_file.is_file():
            raise InvalidInputError("--db", "this database holds no log (no log identity "
                                    "row): give --log-key or --key-file")
    meta = _log_meta(url)
    return _verifier(args, key_file, meta[0] if meta else None)


def _log_meta(url: str) -> tuple[str, str] | None:
    """(origin, verifier key) stored in the log, if there is a log there to ask."""
    from sqlalchemy.exc import SQLAlchemyError

    from ledger.store.sql import SqlLedger

    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).is_file():
        return None  # do not create an empty database just to ask it
    try:
        with SqlLedger(url) as ledger:
            meta = ledger.log_meta()
    except SQLAlchemyError:
        return None
    return (meta.origin, meta.verifier_key) if meta else None


def run(args: argparse.Namespace) -> int:
    from ledger.store.sql import SqlLedger

    url, key_file = _settings(args)
    if args.action == "public-key":
        verifier = _public_key(args, url, key_file)
        print_json({"verifier_key": verifier.encode(), "origin": verifier.name}) if args.json \
            else print(verifier.encode())
        return 0
    with SqlLedger(url) as ledger:
        if args.action == "checkpoint":
            latest = ledger.latest_checkpoint()
            if latest is None:
                print("no checkpoint yet")
                return 1
            if args.json:
                print_json({"tree_size": latest.size, "root": latest.root.hex(),
                            "checkpoint": latest.note.decode()})
            else:
                print(latest.note.decode(), end="")
            return 0
        if args.action == "consistency":
            return _consistency(args, ledger, _verifier(args, key_file))
        if args.action == "publish":
            from ledger.publish.worker import open_sink, publish_latest

            size = publish_latest(ledger, open_sink(args.to, args.retention_days))
            print_json({"published_size": size, "to": args.to}) if args.json else \
                print(f"published the checkpoint of size {size} and its tiles to {args.to}")
            return 0 if size else 1
        from ledger.store.fsck import Finding, fsck
        from ledger.store.fsck_workers import RowWorkers, default_workers

        if args.workers is not None and args.workers < 1:
            raise InvalidInputError("--workers", "give 1 or more")
        meta = None if args.log_key else ledger.log_meta()
        verifier = _verifier(args, key_file, meta.origin if meta else None)
        memory = Memory(args, verifier)
        workers = RowWorkers(url, args.workers or default_workers())
        report = fsck(ledger, verifier, progress=progress_printer("checked"), workers=workers)
        # A tail truncated or rewritten behind the checkpoint this auditor saw last.
        divergence = memory.check(ledger)
        if divergence is not None:
            report.findings.insert(0, Finding(divergence.kind,
                                              f"checkpoint {divergence.seen_size}",
                                              divergence.message))
        elif report.ok:
            latest = ledger.latest_checkpoint()
            memory.advance(latest.note if latest else None)
    if args.json:
        print_json({"ok": report.ok, "tree_size": report.tree_size,
                    "records_checked": report.records_checked,
                    "checkpoints_checked": report.checkpoints_checked,
                    "anchors_checked": report.anchors_checked,
                    "findings": [vars(f) for f in report.findings]})
    else:
        print(f"tree size {report.tree_size}, {report.records_checked} records, "
              f"{report.checkpoints_checked} checkpoints, {report.anchors_checked} anchors "
              "checked")
        for finding in report.findings:
            print(f"  {finding}")
        print("OK" if report.ok else f"{len(report.findings)} findings; first: {report.first}")
    return 0 if report.ok else 1


def _signed(ledger: Any, size: int, verifier: NoteVerifier, option: str) -> Checkpoint | None:
    """The signed checkpoint of ``size``, opened with the pinned key: its root, never the
    root column beside it, is what the proof is checked against."""
    if size == 0:
        return None  # every log extends the empty one
    stored = ledger.checkpoint(size)
    if stored is None:
        raise InvalidInputError(option, f"the log has no signed checkpoint of size {size}")
    try:
        body = verifier.open_checkpoint(stored.note)
    except SignatureError as exc:
        raise SignatureError(f"checkpoint {size}: {exc}") from exc
    except VerificationError as exc:  # not a signed checkpoint note at all
        raise CheckpointFormatError(f"checkpoint {size}: {exc}") from exc
    if body.size != size:
        raise CheckpointFormatError(f"checkpoint {size}: its signed note is for size "
                                    f"{body.size}")
    return body


def _consistency(args: argparse.Namespace, ledger: Any, verifier: NoteVerifier) -> int:
    from ledger import merkle

    first, second = args.first, args.second
    if not 0 <= first <= second:
        raise InvalidInputError("first", f"{first} must be between 0 and {second}")
    old = _signed(ledger, first, verifier, "first")
    new = _signed(ledger, second, verifier, "second")
    if old is not None and new is not None and old.origin != new.origin:
        raise CheckpointFormatError(f"checkpoints {first} and {second} are for different "
                                    f"origins ({old.origin!r}, {new.origin!r})")
    try:
        proof = ledger.consistency_proof(first, second)
    except LookupError as exc:  # a damaged tree: the log cannot prove its own history
        raise VerificationError(f"the log cannot prove {first} -> {second}: its tree "
                                f"lacks a node ({exc}); run 'log fsck'") from exc
    if old is not None and new is not None:
        try:
            merkle.verify_consistency(first, second, proof, old.root, new.root)
        except VerificationError as exc:
            raise VerificationError(f"the signed checkpoints {first} and {second} are not "
                                    f"consistent: {exc}") from exc
    if args.json:
        print_json({"from": first, "to": second, "proof": [h.hex() for h in proof],
                    "verified": True, "origin": new.origin if new else None})
    else:
        for item in proof:
            print(item.hex())
        print(f"verified against the signed checkpoints of size {first} and {second}")
    return 0
