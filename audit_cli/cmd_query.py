"""Query the auditors' mirror: a table, JSON or CSV."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from typing import Any

from audit_cli.evidence import add_key_option, add_source_options, one_source
from audit_cli.filters import add_filter_options, filters_from
from audit_cli.windows import add_window_options, prove_from_tiles
from ledger.errors import InvalidInputError

COLUMNS = ("leaf_index", "record_id", "created_at", "tenant", "model_name",
           "accelerator_model", "driver_version", "torch_version", "service_revision",
           "checkpoint_size", "anchor_ref")


def register(parser: argparse.ArgumentParser) -> None:
    add_source_options(parser, bundle=False)
    add_filter_options(parser)
    parser.add_argument("--format", choices=("table", "json", "csv"), default="table")
    parser.add_argument("--limit", type=int, default=None, help="stop after this many rows")
    parser.add_argument("--prove", action="store_true",
                        help="read every leaf of the window through --tiles, check it "
                             "against the signed (and witnessed) checkpoint, filter locally "
                             "and say the answer is complete")
    add_window_options(parser)
    add_key_option(parser)


def _rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    since, until, filters = filters_from(args)
    rows: list[dict[str, Any]] = []
    one_source(args, ("server", "db"))
    if args.db:
        from ledger.store.sql import SqlLedger

        with SqlLedger(args.db) as ledger:
            cursor = None
            while True:
                page, cursor = ledger.mirror.query(since=since, until=until, cursor=cursor,
                                                   limit=1000, **filters)
                for row in page:
                    rows.append({"leaf_index": row.leaf_index, "record_id": row.record_id,
                                 "created_at": row.created_at.isoformat() + "Z",
                                 "tenant": row.tenant, **row.columns,
                                 "checkpoint_size": row.checkpoint_size,
                                 "anchor_ref": row.anchor_ref})
                if cursor is None or (args.limit and len(rows) >= args.limit):
                    break
    elif args.server:
        from ledger.client.sources import ServerSource

        if not args.api_key:
            raise InvalidInputError("--api-key", "is required with --server")
        server = ServerSource(args.server, args.api_key)
        query: dict[str, Any] = dict(filters)
        if since:
            query["since"] = since.isoformat()
        if until:
            query["until"] = until.isoformat()
        cursor = None
        while True:
            body = server.get("/v1/records", **query, **({"cursor": cursor} if cursor else {}))
            rows.extend({k: v for k, v in r.items() if k != "record"} for r in body["records"])
            cursor = body.get("next_cursor")
            if not cursor or (args.limit and len(rows) >= args.limit):
                break
    else:
        raise InvalidInputError("source", "give --db or --server")
    return rows[: args.limit] if args.limit else rows


def _proved(args: argparse.Namespace) -> int:
    from ledger.audit import open_record
    from ledger.leaves.envelope import is_envelope
    from ledger.record import mirror_columns

    since, until, filters = filters_from(args)
    answer, log, entries, vouched = prove_from_tiles(args, since, until, filters)
    rows = []
    for index in answer.matched[: args.limit] if args.limit else answer.matched:
        entry = entries[index - answer.start]
        if is_envelope(entry):
            rows.append({"leaf_index": index, **json.loads(entry)})
        else:
            columns = mirror_columns(open_record(entry))
            rows.append({"leaf_index": index, **columns})
    if args.json or args.format == "json":
        print(json.dumps({"complete": True, "start": answer.start, "end": answer.end,
                          "tree_size": answer.tree_size, "in_window": answer.in_window,
                          "matched": len(answer.matched), "checkpoint": vouched,
                          "records": rows}, indent=2, default=str))
        return 0
    for row in rows:
        print("  ".join(str(row.get(c, "-")) for c in ("leaf_index", "record_id",
                                                        "created_at", "tenant", "kind")
                        if c in row))
    print(f"{answer.summary()} (signed checkpoint of size {answer.tree_size}, {vouched}; "
          f"{answer.in_window} leaves in the window)")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.prove:
        return _proved(args)
    rows = _rows(args)
    fmt = "json" if args.json else args.format
    if fmt == "json":
        print(json.dumps(rows, indent=2, default=str))
    elif fmt == "csv":
        writer = csv.DictWriter(sys.stdout, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    else:
        widths = {c: max([len(c)] + [len(str(r.get(c, ""))) for r in rows]) for c in COLUMNS}
        print("  ".join(c.ljust(widths[c]) for c in COLUMNS))
        for row in rows:
            print("  ".join(str(row.get(c, "") if row.get(c) is not None else "-")
                            .ljust(widths[c]) for c in COLUMNS))
        print(f"({len(rows)} records)")
    return 0
