"""Run a witness (C2SP tlog-witness) that cosigns other logs' checkpoints: serve, key."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

from audit_cli.options import print_json
from ledger.cosignature import Cosigner


def _default_home() -> Path:
    from inference_wrapper.defaults import DATA_HOME

    return DATA_HOME / "witness"


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--home", type=Path, default=None,
                        help="where the key and database live (default: "
                             "$AUDIT_LEDGER_HOME/witness)")
    parser.add_argument("--key", dest="key_path", type=Path, default=None,
                        help="witness key file, created 0600 on first use "
                             "(default: HOME/witness.key)")
    parser.add_argument("--name", default=None,
                        help="witness name for a new key (default: <hostname>/witness); "
                             "an existing key keeps its own name")
    actions = parser.add_subparsers(dest="action", required=True)
    serve = actions.add_parser("serve", help="serve POST /add-checkpoint")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8090)
    serve.add_argument("--db", dest="database_url", default=None,
                       help="witness state database URL (default: SQLite HOME/witness.db)")
    serve.add_argument("--log", dest="logs", nargs=2, action="append", default=[],
                       metavar=("ORIGIN", "VKEY"),
                       help="a log to witness: its origin line and verifier key "
                            "(repeatable)")
    serve.add_argument("--config", type=Path, default=None,
                       help='JSON file {"logs": [{"origin": ..., "key": VKEY}, ...]}')
    actions.add_parser("key", help="print the witness's verifier key (vkey)")


def _cosigner(args: argparse.Namespace) -> Cosigner:
    from ledger.witness.state import decode_cosigner_key, load_or_create_cosigner

    home = args.home or _default_home()
    path = args.key_path or home / "witness.key"
    if path.exists() and args.name is None:
        name = decode_cosigner_key(path.read_text()).name
    else:
        name = args.name or f"{socket.gethostname()}/witness"
    return load_or_create_cosigner(path, name)


def run(args: argparse.Namespace) -> int:
    import logging

    from ledger.errors import InvalidInputError

    try:
        cosigner = _cosigner(args)
    except ValueError as exc:
        raise InvalidInputError("--key", str(exc)) from exc
    vkey = cosigner.witness_key.encode()
    if args.action == "key":
        if args.json:
            print_json({"name": cosigner.name, "vkey": vkey})
        else:
            print(vkey)
        return 0

    from aiohttp import web

    from ledger.witness.service import Witness, create_witness_app, load_logs
    from ledger.witness.state import WitnessStore

    try:
        logs = load_logs(args.logs, args.config)
    except (ValueError, OSError) as exc:
        raise InvalidInputError("--log/--config", str(exc)) from exc
    if not logs:
        raise InvalidInputError("--log", "configure at least one log to witness")
    home = args.home or _default_home()
    url = args.database_url or f"sqlite:///{home / 'witness.db'}"
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    app = create_witness_app(Witness(cosigner, WitnessStore(url), logs))
    print(f"witness {cosigner.name} key {vkey}", flush=True)
    print(f"serving add-checkpoint for {len(logs)} log(s) on "
          f"http://{args.host}:{args.port}", flush=True)
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)
    return 0
