"""Proved windows for query --prove, export --window and verify: the options, the
trusted checkpoint (the pinned key, and witnesses) and the local filter."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path
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
    group.add_argument("--state", type=Path, help="this auditor's state file (default: one "
                       "per log under $AUDIT_LEDGER_HOME/verifier, shared with verify)")
    group.add_argument("--no-state", action="store_true",
                       help="neither read nor advance the state file")


def trusted_checkpoint(args: argparse.Namespace, verifier: NoteVerifier, note: bytes
                       ) -> tuple[Checkpoint, str]:
    """The checkpoint, verified with the pinned key and the witness policy; and how it
    is vouched for ("witnessed by a, b" or "UNWITNESSED")."""
    from audit_cli.cmd_verify import pinned_witnesses

    checkpoint = verifier.open_checkpoint(note, args.origin or verifier.name)
    witnesses, quorum = pinned_witnesses(args)
    if not witnesses:
        if not (getattr(args, "accept_unwitnessed", False)
                or getattr(args, "accept_self_anchored", False)):
            raise InvalidInputError("--witness", "a proved window needs pinned witnesses "
                                    "(or --accept-unwitnessed)")
        return checkpoint, "UNWITNESSED"
    quorum = quorum or len(witnesses)
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
    from audit_cli.remembered import Memory
    from ledger.client.proved_window import prove_filtered_window
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
    memory = Memory(args, verifier)  # the tree must extend the checkpoint seen last
    divergence = memory.check_tree(checkpoint, log.nodes.read_nodes)
    if divergence is not None:
        raise WindowError(divergence.message)
    answer, entries = prove_filtered_window(log, since, until, filters)
    memory.advance(note)
    return answer, log, entries, vouched


def leaf_filter(filters: Mapping[str, str], origin: str, reader: Any = None
                ) -> Callable[[int, bytes], bool]:
    """The query's filters applied to one leaf's bytes (``ledger.client.proved_window``):
    a v1 record's own columns; a v2 leaf's tenant tag, and its other filters through
    its body and environment when ``reader`` serves them."""
    from ledger.client.proved_window import LeafFilter

    return LeafFilter(filters, origin, reader)
