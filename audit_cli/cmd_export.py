"""Write an offline evidence bundle for the records matching the filters."""

from __future__ import annotations

import argparse
from pathlib import Path

from audit_cli.evidence import add_source_options
from audit_cli.filters import add_filter_options, filters_from, progress_printer
from ledger.errors import InvalidInputError


def register(parser: argparse.ArgumentParser) -> None:
    add_source_options(parser, bundle=False)
    add_filter_options(parser)
    parser.add_argument("--bundle", type=Path, required=True, help="the file to write")


def run(args: argparse.Namespace) -> int:
    from ledger.checkpoint import Checkpoint
    from ledger.client.exporter import export_from_db, export_from_server

    if bool(args.server) == bool(args.db):
        raise InvalidInputError("source", "give exactly one of --server, --db")
    since, until, filters = filters_from(args)
    progress = progress_printer("exported")
    if args.db:
        bundle = export_from_db(args.db, since, until, filters, progress=progress)
    else:
        if not args.api_key:
            raise InvalidInputError("--api-key", "is required with --server")
        bundle = export_from_server(args.server, args.api_key, since, until, filters,
                                    progress=progress)
    args.bundle.write_text(bundle.dumps())
    print(f"wrote {len(bundle.entries)} records to {args.bundle} "
          f"(checkpoint size {Checkpoint.peek(bundle.checkpoint).size})")
    return 0
