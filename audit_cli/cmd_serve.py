"""Start the audited inference endpoint (aiohttp)."""

from __future__ import annotations

import argparse
import logging
import os
import signal

from audit_cli.extras import require_extra
from audit_cli.options import add_model_options, load_from_options, served_from_options


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--db", dest="database_url", default=None,
                        help="ledger database URL (default: SQLite in ~/.cache/audit-ledger)")
    parser.add_argument("--max-batch", type=int, default=None)
    parser.add_argument("--max-wait-ms", type=float, default=None)
    parser.add_argument("--engines", type=int, default=1,
                        help="engine processes, batches spread over them (on a GPU machine: "
                             "one per visible GPU, each sees only its own)")
    parser.add_argument("--in-process", action="store_true",
                        help="run the model in this process instead (no crash isolation)")
    add_model_options(parser)


def run(args: argparse.Namespace) -> int:
    require_extra("serve", "torch", "transformers", "aiohttp")  # before anything imports them
    from inference_wrapper.audit.generator import AuditedGenerator
    from inference_wrapper.server import serve
    from inference_wrapper.server.app import LIFECYCLE, create_app, open_identity
    from inference_wrapper.server.logging_setup import setup_queued_logging
    from inference_wrapper.server.settings import Settings
    from ledger.error_map import exit_code_for
    from ledger.errors import InvalidInputError, WorkerDiedError
    from ledger.store.apikeys import ApiKeyStore
    from ledger.store.file_modes import private_directory, sqlite_path
    from ledger.store.migrate import upgrade
    from ledger.store.sql import SqlLedger, make_engine

    settings = Settings.from_env(host=args.host, port=args.port,
                                 database_url=args.database_url, max_batch=args.max_batch,
                                 max_wait_ms=args.max_wait_ms)
    # Log calls only enqueue: a stalled stdout must not stall the event loop.
    queued_logging = setup_queued_logging(logging.INFO, capacity=settings.log_queue_capacity)
    # The service home holds the keyring, the log key and (by default) the database.
    private_directory(settings.keyring_path.parent)
    database = sqlite_path(settings.database_url)
    if database is not None:
        database.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    upgrade(settings.database_url)
    # Refuse to start (exit 2, before loading the model) when this replica's key or
    # origin is not the log's: it would seal checkpoints no verifier accepts.
    with SqlLedger(settings.database_url, pg=settings.pg_session()) as ledger:
        identity = open_identity(settings, ledger)
    print(f"log origin {identity.origin} (key hash {identity.signer.key_hash.hex()}"
          f"{', created' if identity.created else ''})", flush=True)
    engine = make_engine(settings.database_url, pg=settings.pg_session())
    keys = ApiKeyStore(engine)
    if not keys.list():
        token, key = keys.create("default", "client")
        auditor_token, _ = keys.create("audit", "auditor")
        base = f"http://{settings.host}:{settings.port}"
        print(f"\nFirst API keys (shown once):\n  client  (tenant {key.tenant}): {token}\n"
              f"  auditor (all tenants):      {auditor_token}\n")
        print("Try:\n"
              f"  curl -s {base}/v1/generate -H 'Authorization: Bearer {token}' \\\n"
              "       -H 'Content-Type: application/json' \\\n"
              "       -d '{\"prompt\": \"The capital of France is\", \"max_new_tokens\": 16}'\n")
    engine.dispose()
    if args.engines < 1:
        raise InvalidInputError("--engines", "needs at least one engine")
    generator = (AuditedGenerator(load_from_options(args)) if args.in_process
                 else served_from_options(args, args.engines))

    def stop_for_supervisor(worker: str) -> None:
        # The same path as SIGTERM: drain, seal, close; then exit non-zero below.
        os.kill(os.getpid(), signal.SIGTERM)

    app = create_app(settings, generator, on_fatal=stop_for_supervisor)
    where = "in this process" if args.in_process else f"{args.engines} engine process(es)"
    print(f"serving {generator.loaded.name} ({generator.loaded.digest}, {where}) on "
          f"http://{settings.host}:{settings.port}", flush=True)
    try:
        # Not web.run_app: it closes the listener at SIGTERM, refusing new connections
        # instead of answering them 503 while the requests in flight drain.
        serve.run(app, settings.host, settings.port,
                  drain_timeout_s=settings.shutdown_grace_s)
        dead = app[LIFECYCLE].dead_worker
        if dead is not None:  # logged, not printed: a stalled stderr must not hang the exit
            logging.getLogger("audit_ledger").critical(
                "stopped because the %s worker died; exiting for the supervisor", dead)
            return exit_code_for(WorkerDiedError(dead))
        return 0
    finally:
        queued_logging.stop()
