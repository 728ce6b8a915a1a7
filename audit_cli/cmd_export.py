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
                             "range read through --tiles, proven complete, for 'verify "
                             "--bundle' offline")
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
    from ledger.tiles import root_with_leaves
    from ledger.window_bundle import WindowBundle

    since, until, filters = filters_from(args)
    answer, log, entries, vouched = prove_from_tiles(args, since, until, {})
    nodes: dict[tuple[int, int], bytes] = {}

    def outside(level: int, idx: int) -> bytes:
        nodes[(level, idx)] = log.nodes.node(level, idx)
        return nodes[(level, idx)]

    from ledger import merkle

    root_with_leaves(log.size, answer.start, [merkle.hash_leaf(e) for e in entries], outside)
    assert since is not None and until is not None
    bundle = WindowBundle(log.note, since, until, answer.start, answer.end,
                          list(enumerate(entries, start=answer.start)), nodes)
    args.bundle.write_text(bundle.dumps())
    if args.json:
        print_json({"bundle": str(args.bundle), "start": answer.start, "end": answer.end,
                    "in_window": answer.in_window, "tree_size": answer.tree_size})
    else:
        print(f"wrote the leaves [{answer.start}, {answer.end}) of the checkpoint of size "
              f"{answer.tree_size} ({vouched}) to {args.bundle}: {answer.in_window} in the "
              "window")
    return 0
