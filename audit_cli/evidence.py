"""Options shared by the auditor commands: where evidence comes from, which key to pin."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from ledger.checkpoint import NoteVerifier
from ledger.errors import InvalidInputError


def add_source_options(parser: argparse.ArgumentParser, bundle: bool = True) -> None:
    group = parser.add_argument_group("evidence source (one of)")
    group.add_argument("--server", help="service base URL, e.g. http://127.0.0.1:8080")
    group.add_argument("--api-key", default=os.environ.get("AUDIT_LEDGER_API_KEY"),
                       help="bearer key for --server (or AUDIT_LEDGER_API_KEY)")
    group.add_argument("--db", help="ledger database URL")
    if bundle:
        group.add_argument("--bundle", type=Path, help="an evidence bundle file")


def one_source(args: argparse.Namespace,
               names: tuple[str, ...] = ("server", "db", "bundle")) -> str | None:
    """The evidence source given (None if none). Two at once contradict each other: a
    usage error naming both, never one of them silently preferred."""
    given = [name for name in names if getattr(args, name, None)]
    if len(given) > 1:
        others = " and ".join(f"--{name}" for name in given[1:])
        choices = ", ".join(f"--{name}" for name in names)
        raise InvalidInputError(f"--{given[0]}", f"cannot be combined with {others}: give "
                                f"exactly one of {choices}")
    return given[0] if given else None


def add_key_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-key", default=os.environ.get("AUDIT_LEDGER_LOG_KEY"),
                        help="the pinned log verifier key (name+hash+key) or a file holding "
                             "it; print it with 'audit-ledger log public-key'")


def pinned_verifier(args: argparse.Namespace) -> NoteVerifier:
    if not args.log_key:
        raise InvalidInputError("--log-key", "a pinned log key is required (never taken "
                                "from the server being checked)")
    text = args.log_key
    if Path(text).is_file():
        text = Path(text).read_text().strip()
    try:
        return NoteVerifier.decode(text)
    except ValueError as exc:
        raise InvalidInputError("--log-key", str(exc)) from exc


def open_source(args: argparse.Namespace) -> Any:
    """A server or database source; the caller closes ``.ledger`` if present."""
    if one_source(args) is None:
        raise InvalidInputError("source", "give exactly one of --server, --db, --bundle")
    if args.server:
        from ledger.client.sources import ServerSource

        if not args.api_key:
            raise InvalidInputError("--api-key", "is required with --server")
        return ServerSource(args.server, args.api_key)
    if args.db:
        from ledger.client.database import DatabaseSource
        from ledger.store.sql import SqlLedger

        return DatabaseSource(SqlLedger(args.db))
    return None
