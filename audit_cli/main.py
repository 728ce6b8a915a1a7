"""Entry point: one module per subcommand, each with ``register`` and ``run``.

Exit codes: 0 success or verified, 1 verification failed, 2 usage error,
3 backend unreachable.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from ledger.errors import BackendError, InvalidInputError, LedgerError, VerificationError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
SUBCOMMANDS = ("doctor", "generate", "serve", "keys", "verify", "export", "query", "log", "audit",
               "report")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="audit-ledger", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"audit_cli.cmd_{name}")
        sub = subparsers.add_parser(name, help=(module.__doc__ or name).splitlines()[0])
        sub.add_argument("--json", action="store_true", help="machine-readable output")
        module.register(sub)
        sub.set_defaults(run=module.run)
    return parser


def exit_code_for(error: LedgerError) -> int:
    if isinstance(error, VerificationError):
        return EXIT_FAILED
    if isinstance(error, InvalidInputError):
        return EXIT_USAGE
    if isinstance(error, BackendError):
        return EXIT_UNREACHABLE
    return EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except LedgerError as error:
        print(f"audit-ledger: {error.diagnostics()}", file=sys.stderr)
        return exit_code_for(error)


if __name__ == "__main__":
    sys.exit(main())
