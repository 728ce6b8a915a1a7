"""Write an offline evidence bundle for the records matching the filters."""

from __future__ import annotations

import argparse
from pathlib import Path

from audit_cli.evidence import add_source_options
from audit_cli.filters import add_filter_options, filters_from, progress_printer
from audit_cli.options import print_json
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


def run(args: argparse.Namespace) -> int:
    from ledger.checkpoint import Checkpoint
    from ledger.client.exporter import export_from_db, export_from_server

    if bool(args.server) == bool(args.db):
        raise InvalidInputError("source", "give exactly one of --server, --db")
    since, until, filters = filters_from(args)
    if any(size < 0 for size in args.since_size):
        raise InvalidInputError("--since-size", "must be >= 0")
    progress = progress_printer("exported")
    if args.db:
        bundle = export_from_db(args.db, since, until, filters, progress=progress,
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
