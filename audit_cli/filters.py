"""The mirror's filters as command-line options, shared by query, export and audit."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import datetime

from ledger.errors import InvalidInputError

FILTERS = ("tenant", "model_digest", "accelerator_model", "driver_version", "service_revision")


def add_filter_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", help="RFC 3339 time, inclusive (UTC if no zone)")
    parser.add_argument("--until", help="RFC 3339 time, exclusive")
    for name in FILTERS:
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name)


def parse_time(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError as exc:
        raise InvalidInputError(name, f"{value!r} is not an RFC 3339 time") from exc


def filters_from(args: argparse.Namespace) -> tuple[datetime | None, datetime | None,
                                                    dict[str, str]]:
    filters = {name: getattr(args, name) for name in FILTERS if getattr(args, name, None)}
    return parse_time(args.since, "--since"), parse_time(args.until, "--until"), filters


def progress_printer(verb: str) -> Callable[[int, int | None], None]:
    """Progress on a terminal's stderr; silent when not on a terminal."""
    def show(done: int, total: int | None) -> None:
        if not sys.stderr.isatty():
            return
        of = f"/{total}" if total else ""
        end = "\n" if total is not None and done >= total else "\r"
        print(f"  {verb} {done}{of}", end=end, file=sys.stderr, flush=True)
    return show
