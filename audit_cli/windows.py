"""Proved windows for query --prove, export --window and verify: the options, the
trusted checkpoint (the pinned key, and witnesses) and the local filter."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from typing import Any

from ledger.checkpoint import Checkpoint, NoteVerifier
from ledger.cosignature import valid_cosigners
from ledger.errors import InvalidInputError
from ledger.window import WindowError


def add_window_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("proved windows, read through tiles")
    group.add_argument("--tiles", help="a tiles prefix: the service's http(s)://HOST/tlog, "
                       "a directory, or s3://bucket/prefix")
    group.add_argument("--witness", action="append", default=[], metavar="VKEY",
                       help="a pinned witness key (or a file of them); repeatable")
    group.add_argument("--witness-quorum", type=int, metavar="K",
                       help="valid cosignatures needed (default: every --witness)")
    group.add_argument("--accept-unwitnessed", action="store_true",
                       help="accept a checkpoint no witness cosigned (the answer says so)")
    group.add_argument("--origin", help="the log's origin (default: the key's name)")


def trusted_checkpoint(args: argparse.Namespace, verifier: NoteVerifier, note: bytes
                       ) -> tuple[Checkpoint, str]:
    """The checkpoint, verified with the pinned key and the witness policy; and how it
    is vouched for ("witnessed by a, b" or "UNWITNESSED")."""
    from audit_cli.cmd_verify import _witnesses

    checkpoint = verifier.open_checkpoint(note, args.origin or verifier.name)
    witnesses = _witnesses(args.witness)
    if not witnesses:
        if not (getattr(args, "accept_unwitnessed", False)
                or getattr(args, "accept_self_anchored", False)):
            raise InvalidInputError("--witness", "a proved window needs pinned witnesses "
                                    "(or --accept-unwitnessed)")
        return checkpoint, "UNWITNESSED"
    quorum = args.witness_quorum or len(witnesses)
    cosigned = valid_cosigners(note, witnesses)
    if len(cosigned) < quorum:
        raise WindowError(f"checkpoint {checkpoint.size} carries {len(cosigned)} valid "
                          f"cosignatures of the {quorum} needed")
    return checkpoint, "witnessed by " + ", ".join(sorted(cosigned))


def prove_from_tiles(args: argparse.Namespace, since: Any, until: Any,
                     filters: Mapping[str, str]) -> tuple[Any, Any, list[bytes], str]:
    """Read the window through ``--tiles`` and prove it: (answer, the tiled log, the
    leaves read, how the checkpoint is vouched for)."""
    from audit_cli.evidence import pinned_verifier
    from ledger.client.tiles import TiledLog, open_tiles

    if not args.tiles:
        raise InvalidInputError("--tiles", "a proved window is read through tiles")
    if since is None or until is None:
        raise InvalidInputError("--since", "a proved window needs --since and --until")
    verifier = pinned_verifier(args)
    source = open_tiles(args.tiles, getattr(args, "api_key", None))
    note = source.get("checkpoint")
    if note is None:
        raise InvalidInputError("--tiles", "no checkpoint is published there")
    checkpoint, vouched = trusted_checkpoint(args, verifier, note)
    log = TiledLog(source, checkpoint, note)
    answer, entries = log.prove_window(since, until, leaf_filter(filters, checkpoint.origin))
    return answer, log, entries, vouched


def leaf_filter(filters: Mapping[str, str], origin: str) -> Callable[[int, bytes], bool]:
    """The query's filters applied to one leaf's bytes: a v1 record's own columns, or a
    v2 envelope's tenant tag (its other columns are in bodies, which tiles do not carry)."""
    from ledger.audit import open_record
    from ledger.leaves.envelope import is_envelope, tenant_tag
    from ledger.record import mirror_columns

    tag = tenant_tag(origin, filters["tenant"]) if "tenant" in filters else None

    def keep(index: int, entry: bytes) -> bool:
        if not filters:
            return True
        if is_envelope(entry):
            if set(filters) != {"tenant"}:
                raise InvalidInputError(sorted(set(filters) - {"tenant"})[0].replace(
                    "_", "-"), "v2 leaves are filtered by tenant only through tiles")
            return bool(json.loads(entry)["tenant_tag"] == tag)
        columns: dict[str, Any] = mirror_columns(open_record(entry))
        return all(str(columns.get(name)) == value for name, value in filters.items())

    return keep
