"""The witness service: C2SP ``tlog-witness`` ``POST /add-checkpoint`` over aiohttp.

``Witness.add`` is the whole protocol step: decide (``ledger.witness_policy``), store the
checkpoint by compare-and-swap, then cosign. The HTTP layer only reads the body and maps
a ``WitnessRefusal`` to its status; no internal error text reaches a client.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path

from aiohttp import web

from ledger.checkpoint import Checkpoint, NoteVerifier, SignedNote
from ledger.cosignature import Cosigner
from ledger.errors import CheckpointFormatError
from ledger.witness.state import WitnessStore
from ledger.witness_policy import (
    MAX_BODY_BYTES,
    AddCheckpoint,
    WitnessRefusal,
    decide,
    parse_request,
)

log = logging.getLogger("audit_ledger.witness")
MAX_SWAP_ATTEMPTS = 16  # each lost swap means the state moved; re-deciding settles it

TrustedLogs = dict[str, list[NoteVerifier]]


def load_logs(pairs: Iterable[Sequence[str]] = (), config: Path | None = None) -> TrustedLogs:
    """Origin -> trusted log keys, from ``(origin, vkey)`` pairs and a JSON config file
    ``{"logs": [{"origin": "...", "key": "<vkey>"}, ...]}``."""
    entries = [(str(origin), str(key)) for origin, key in pairs]
    if config is not None:
        document = json.loads(Path(config).read_text())
        logs = document.get("logs") if isinstance(document, dict) else None
        if not isinstance(logs, list):
            raise ValueError(f"{config}: expected {{\"logs\": [{{\"origin\", \"key\"}}, ...]}}")
        for item in logs:
            if not isinstance(item, dict) or not {"origin", "key"} <= item.keys():
                raise ValueError(f"{config}: each log needs an origin and a key")
            entries.append((str(item["origin"]), str(item["key"])))
    trusted: TrustedLogs = {}
    for origin, key in entries:
        if not origin or "\n" in origin:
            raise ValueError(f"invalid log origin {origin!r}")
        trusted.setdefault(origin, []).append(NoteVerifier.decode(key))
    return trusted


class Witness:
    """Cosigns checkpoints of the configured logs that extend what it cosigned before."""

    def __init__(self, cosigner: Cosigner, store: WitnessStore, logs: Mapping[str,
                 Sequence[NoteVerifier]], clock: Callable[[], float] = time.time) -> None:
        self.cosigner = cosigner
        self.store = store
        self.logs = dict(logs)
        self.clock = clock

    def add(self, request: AddCheckpoint) -> str:
        """The cosignature line(s) for the request's checkpoint, or raise WitnessRefusal."""
        try:
            origin: str | None = Checkpoint.peek(request.note).origin
        except CheckpointFormatError:
            origin = None  # decide() answers 400 for it
        for _ in range(MAX_SWAP_ATTEMPTS):
            stored = (self.store.get(origin)
                      if origin is not None and origin in self.logs else None)
            checkpoint = decide(request, self.logs, stored)
            if self.store.swap(stored, checkpoint, request.note):
                # Cosign the exact body the log signed, not a re-serialization of it.
                body = SignedNote.parse(request.note).body
                return self.cosigner.cosign(body, int(self.clock()))
        raise WitnessRefusal(503, "the witnessed state kept changing; try again")


WITNESS = web.AppKey("witness", Witness)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except Exception:
        log.exception("add-checkpoint failed")
        return web.Response(status=500, text="internal error; see the witness's log\n")


async def add_checkpoint(request: web.Request) -> web.Response:
    body = await request.read()
    witness = request.app[WITNESS]
    try:
        parsed = parse_request(body)
        line = await asyncio.to_thread(witness.add, parsed)
    except WitnessRefusal as refusal:
        text, content_type = refusal.body()
        log.info("refused add-checkpoint: %d %s", refusal.status, refusal.reason)
        return web.Response(status=refusal.status, body=text, content_type=content_type)
    return web.Response(body=line.encode(), content_type="text/plain", charset="utf-8")


async def healthz(request: web.Request) -> web.Response:
    witness = request.app[WITNESS]
    return web.json_response({"name": witness.cosigner.name,
                              "key": witness.cosigner.witness_key.encode(),
                              "logs": sorted(witness.logs)})


def create_witness_app(witness: Witness) -> web.Application:
    # A body a bit larger than the policy's bound still reaches it, to be answered 400.
    app = web.Application(client_max_size=MAX_BODY_BYTES + 1024, middlewares=[_errors])
    app[WITNESS] = witness

    async def close_store(app: web.Application) -> None:
        await asyncio.to_thread(app[WITNESS].store.close)

    app.on_cleanup.append(close_store)
    app.add_routes([web.post("/add-checkpoint", add_checkpoint),
                    web.get("/healthz", healthz)])
    return app
