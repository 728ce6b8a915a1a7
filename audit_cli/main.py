"""Entry point: one module per subcommand, each with ``register`` and ``run``.

Exit codes (decided by ledger/error_map.py): 0 success or verified, 1 a verification
check failed (it is named), 2 usage error, 3 evidence source or backend unreachable,
4 internal error (a short message and where the details are). Every option is accepted
before or after the subcommand and its action (``log fsck --db X``, ``--json verify ID``).
"""

from __future__ import annotations

import argparse
import copy
import importlib
import os
import sys
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn, TextIO

from audit_cli.options import print_json
from ledger.error_map import EXIT_INTERNAL, exit_code_for
from ledger.errors import InvalidInputError, LedgerError

SUBCOMMANDS = ("doctor", "generate", "serve", "keys", "verify", "export", "query", "log", "audit",
               "witness", "content", "erase", "retention", "report", "restore", "console")


class UsageError(InvalidInputError):
    """The command line itself is wrong (unknown option, missing argument)."""


class _Parser(argparse.ArgumentParser):
    """Raises instead of printing and exiting, so usage errors go through the one error
    map and come out as JSON with --json."""

    def error(self, message: str) -> NoReturn:
        raise UsageError("arguments", f"{message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="audit-ledger", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="machine-readable output "
                        "(errors too, as {\"error\": {...}} on stdout)")
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of an internal error")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"audit_cli.cmd_{name}")
        sub = subparsers.add_parser(name, help=(module.__doc__ or name).splitlines()[0])
        module.register(sub)
        sub.set_defaults(run=module.run)
    share_options(parser)
    return parser


def share_options(parser: argparse.ArgumentParser,
                  inherited: Sequence[argparse.Action] = ()) -> None:
    """Give every subcommand and action the options of the parsers above it.

    The copies default to SUPPRESS: given after the action they set the value, absent
    they leave the one parsed before the action (or its default) alone.
    """
    for action in inherited:
        if any(s in parser._option_string_actions for s in action.option_strings):
            continue  # the sub-parser has its own option of that name
        shared = copy.copy(action)
        shared.default, shared.required = argparse.SUPPRESS, False
        parser._add_action(shared)
    own = [a for a in parser._actions
           if a.option_strings and not isinstance(a, argparse._HelpAction)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in set(action.choices.values()):
                share_options(child, own)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    json_mode, debug = "--json" in argv, "--debug" in argv
    with _quiet_closed_pipe():
        try:
            args = build_parser().parse_args(argv)
            return int(args.run(args))
        except LedgerError as error:
            return _report_error(error, json_mode, exit_code_for(error))
        except KeyboardInterrupt:
            return _report_error(InvalidInputError("interrupted", "stopped by the user"),
                                 json_mode, 130)
        except Exception as error:  # noqa: BLE001 - the one place a bug becomes exit 4
            return _report_internal(error, json_mode, debug)


def _report_error(error: LedgerError, json_mode: bool, code: int) -> int:
    if json_mode:
        body: dict[str, Any] = {"type": type(error).__name__, "message": str(error),
                                "exit_code": code}
        if isinstance(error, InvalidInputError):
            body["field"] = error.field
        print_json({"error": body})
    else:
        print(f"audit-ledger: {error.diagnostics()}", file=sys.stderr)
    return code


def _report_internal(error: Exception, json_mode: bool, debug: bool) -> int:
    """A short message and where the traceback is; never the traceback on its own."""
    details = "".join(traceback.format_exception(error))
    where = "rerun with --debug to print it"
    if debug:
        print(details, file=sys.stderr, end="")
        where = "printed above (--debug)"
    else:
        home = Path(os.environ.get("AUDIT_LEDGER_HOME", Path.home() / ".cache" / "audit-ledger"))
        log = home / "logs" / "cli-errors.log"
        try:
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("a", encoding="utf-8") as handle:
                # No command line: it may hold an API key.
                handle.write(f"--- {datetime.now(UTC).isoformat()}\n{details}")
            where = f"traceback in {log} (or rerun with --debug)"
        except OSError:
            pass
    message = f"internal error ({type(error).__name__}: {str(error)[:200]}); {where}"
    if json_mode:
        print_json({"error": {"type": "InternalError", "message": message,
                              "exit_code": EXIT_INTERNAL}})
    else:
        print(f"audit-ledger: {message}", file=sys.stderr)
    return EXIT_INTERNAL


class _PipeGuard:
    """stdout that goes quiet when its reader has gone (``| head``), so the command still
    finishes and exits with its own code instead of a BrokenPipeError traceback."""

    def __init__(self, stream: TextIO) -> None:
        self.stream, self.gone = stream, False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self.stream.write(text)
            except BrokenPipeError:
                self._silence()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._silence()

    def _silence(self) -> None:
        self.gone = True
        try:  # what is still buffered then drains into /dev/null at exit
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextmanager
def _quiet_closed_pipe() -> Iterator[None]:
    original = sys.stdout
    guard = _PipeGuard(original)
    sys.stdout = guard
    try:
        yield
    finally:
        guard.flush()
        sys.stdout = original


if __name__ == "__main__":
    sys.exit(main())
