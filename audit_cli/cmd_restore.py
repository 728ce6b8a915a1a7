"""Rebuild a log database from its published tiles, proven against a trusted checkpoint."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from audit_cli.evidence import add_key_option, pinned_verifier
from audit_cli.filters import progress_printer
from audit_cli.options import print_json
from ledger.errors import InvalidInputError


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="source", required=True,
                        help="the published tiles: a directory or s3://bucket/prefix")
    parser.add_argument("--db", required=True, help="the database URL to rebuild (empty)")
    add_key_option(parser)
    parser.add_argument("--origin", help="the log's origin (default: the key's name)")
    parser.add_argument("--witness", action="append", default=[], metavar="VKEY",
                        help="a pinned witness key (or a file of them); the published "
                             "checkpoint must carry their cosignatures; repeatable")
    parser.add_argument("--witness-quorum", type=int, metavar="K")
    parser.add_argument("--checkpoint", action="append", default=[], type=Path,
                        metavar="FILE", help="a trusted signed checkpoint kept elsewhere (an "
                        "anchored note, a verifier's state file): the rebuilt tree must "
                        "hash to it; repeatable")


def run(args: argparse.Namespace) -> int:
    from audit_cli.cmd_verify import pinned_witnesses
    from ledger.client.tiles import open_tiles
    from ledger.store.migrate import upgrade
    from ledger.store.restore import bulk_load_aside, restore
    from ledger.store.sql import make_engine

    if args.source.startswith(("http://", "https://")):
        raise InvalidInputError("--from", "restore reads a directory or a bucket")
    verifier = pinned_verifier(args)
    witnesses, quorum = pinned_witnesses(args)  # checked before anything is written
    notes = []
    for path in args.checkpoint:
        try:
            notes.append(path.read_bytes())
        except OSError as exc:
            raise InvalidInputError("--checkpoint", f"cannot read {path}") from exc
    source = open_tiles(args.source)
    # A new SQLite file is built aside and moved into place only once proven: no service
    # can start on a half-restored log.
    target = Path(args.db[len("sqlite:///"):]) if args.db.startswith("sqlite:///") else None
    aside = target.with_name(target.name + ".restoring") if target and not target.exists() \
        else None
    url = f"sqlite:///{aside}" if aside else args.db
    if aside:
        aside.unlink(missing_ok=True)
    upgrade(url)
    # A file built aside is removed unless proven and closed: its one transaction needs
    # neither a full sync nor a write-ahead log (``bulk_load_aside``).
    engine = make_engine(url, sqlite_synchronous="NORMAL") if aside else make_engine(url)
    if aside:
        bulk_load_aside(engine)
    try:
        done = restore(engine, source.get, verifier, args.origin or verifier.name,
                       witnesses=witnesses, quorum=quorum,
                       trusted_notes=notes, progress=progress_printer("restored"))
    except BaseException:
        if aside:
            aside.unlink(missing_ok=True)
        raise
    finally:
        engine.dispose()
    if aside and target:
        os.replace(aside, target)
    if args.json:
        print_json({"restored_size": done.size, "root": done.root.hex(),
                    "proven_against": list(done.proven_against)})
    else:
        against = ", ".join(str(s) for s in done.proven_against)
        print(f"restored {done.size} leaves; root {done.root.hex()} is the published "
              f"checkpoint's" + (f"; consistent with the trusted checkpoints {against}"
                                 if against else "") + "; the log may now be served")
    return 0
