"""Run the auditor's console on this machine: pages and verification code from this install.

Serves on 127.0.0.1 and fetches only evidence from the operator (``--server``), with your
key; the record pages run `audit-ledger verify`'s checks 1-4 in your browser with the
verification code of this install, which the operator cannot change. Needs no extra.
"""

from __future__ import annotations

import argparse
import os

from inference_wrapper.server.console_pages import verification_code_digest
from ledger.client.sources import ServerSource
from ledger.errors import InvalidInputError


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", help="the operator's service base URL")
    parser.add_argument("--api-key", default=os.environ.get("AUDIT_LEDGER_API_KEY"),
                        help="your auditor key for --server (or AUDIT_LEDGER_API_KEY)")
    parser.add_argument("--port", type=int, default=8765,
                        help="port on 127.0.0.1 (default 8765; 0 picks a free one)")
    parser.add_argument("--print-digest", action="store_true",
                        help="print the digest of this install's verification code and exit "
                             "(compare it with the one an operator-hosted console shows)")


def run(args: argparse.Namespace) -> int:
    if args.print_digest:
        print(verification_code_digest())
        return 0
    if not args.server:
        raise InvalidInputError("--server", "the operator's service URL is required")
    if not args.api_key:
        raise InvalidInputError("--api-key", "is required (or set AUDIT_LEDGER_API_KEY)")
    if not 0 <= args.port <= 65535:
        raise InvalidInputError("--port", "must be from 0 to 65535")
    # Imported here: the search form reads the mirror's cursor rules (SQLAlchemy), which
    # every other command's start-up need not pay for.
    from audit_cli.local_console import LocalConsole, serve_console

    console = LocalConsole(ServerSource(args.server, args.api_key))
    server = serve_console(console, args.port)
    port = server.server_address[1]
    print(f"console on http://127.0.0.1:{port}/console?token={console.token}", flush=True)
    print(f"verification code {verification_code_digest()}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
