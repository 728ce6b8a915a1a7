"""Write an offline evidence bundle for the records matching the filters."""

from __future__ import annotations

import argparse
from pathlib import Path

from audit_cli.evidence import add_key_option, add_source_options
from audit_cli.filters import add_filter_options, filters_from, progress_printer
from audit_cli.options import print_json
from audit_cli.windows import add_window_options, prove_from_tiles
from ledger.errors import InvalidInputError


def register(parser: argparse.ArgumentParser) -> None:
    add_source_options(parser, bundle=False)
    add_filter_options(parser)
    parser.add_argument("--bundle", type=Path, required=True, help="the file to write")
    parser.add_argument("--since-size", type=int, action="append", default=[], metavar="N",
                        help="carry consistency proofs from checkpoint size N on, so that a "
                             "verifier that saw size N can check the bundle extends it "
                             "offline (--db: every published size >= N, by default the "
                             "latest 1000; --server: N itself and the anchored size; "
                             "repeatable)")
    parser.add_argument("--window", action="store_true",
                        help="write a window bundle: every leaf of [--since, --until)'s "
                             "range read through --tiles, proven complete, with the v2 "
                             "bodies the key may read (--tenant: that tenant's and the "
                             "log-wide ones), for 'verify --bundle' offline")
    add_window_options(parser)
    add_key_option(parser)


def run(args: argparse.Namespace) -> int:
    from ledger.checkpoint import Checkpoint
    from ledger.client.exporter import export_from_log, export_from_server
    from ledger.store.sql import SqlLedger

    if args.window:
        return _window(args)
    if bool(args.server) == bool(args.db):
        raise InvalidInputError("source", "give exactly one of --server, --db")
    since, until, filters = filters_from(args)
    if any(size < 0 for size in args.since_size):
        raise InvalidInputError("--since-size", "must be >= 0")
    progress = progress_printer("exported")
    if args.db:
        with SqlLedger(args.db) as ledger:
            bundle = export_from_log(ledger, since, until, filters, progress=progress,
                                     since_size=min(args.since_size, default=None))
    else:
        if not args.api_key:
            raise InvalidInputError("--api-key", "is required with --server")
        bundle = export_from_server(args.server, args.api_key, since, until, filters,
                                    progress=progress, since_sizes=tuple(args.since_size))
    args.bundle.write_text(bundle.dumps())
    if args.json:
        print_json({"bundle": str(args.bundle), "records": len(bundle.entries),
                    "tree_size": bundle.size,
                    "consistency_from": sorted(bundle.consistency_from)})
        return 0
    print(f"wrote {len(bundle.entries)} records to {args.bundle} "
          f"(checkpoint size {Checkpoint.peek(bundle.checkpoint).size}, consistency proofs "
          f"from {len(bundle.consistency_from)} earlier sizes)")
    return 0


def _window(args: argparse.Namespace) -> int:
    from ledger.client.window_export import export_window
    from ledger.leaves.envelope import tenant_tag

    since, until, filters = filters_from(args)
    others = sorted(set(filters) - {"tenant"})
    if others:  # the bundle holds the whole window; verify applies the filters
        raise InvalidInputError(f"--{others[0].replace('_', '-')}", "a window bundle holds "
                                "every leaf of the window: give this filter to verify")
    answer, log, entries, vouched = prove_from_tiles(args, since, until, {})
    assert since is not None and until is not None
    # --tenant: that tenant's bodies and the log-wide ones; else every one the key may read
    tags = ({tenant_tag(log.checkpoint.origin, filters["tenant"]), None}
            if "tenant" in filters else None)
    bundle, left_out = export_window(log, since, until, answer, entries, tags)
    args.bundle.write_text(bundle.dumps())
    if args.json:
        print_json({"bundle": str(args.bundle), "start": answer.start, "end": answer.end,
                    "in_window": answer.in_window, "tree_size": answer.tree_size,
                    "bodies": len(bundle.bodies), "bodies_left_out": left_out})
    else:
        print(f"wrote the leaves [{answer.start}, {answer.end}) of the checkpoint of size "
              f"{answer.tree_size} ({vouched}) to {args.bundle}: {answer.in_window} in the "
              f"window, {len(bundle.bodies)} v2 bodies"
              + (f" ({left_out} of the range's v2 leaves without theirs: another tenant's)"
                 if left_out else ""))
    return 0
