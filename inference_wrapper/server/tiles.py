"""The log as C2SP tlog-tiles over HTTP: ``/tlog/checkpoint`` and ``/tlog/tile/...``.

What is served is what the latest signed checkpoint covers, read straight from the log's
tables. Who may read what (docs/decisions/0036): the checkpoint and hash tiles to every
reader; an entry bundle to an all-tenant reader (auditor, all-tenant admin), and to a
tenant's key only when every leaf in it is a v2 envelope, which discloses a tenant tag,
a kind and a time but no record. The v2 bodies beside them (``/tlog/bodies/<tag>/...``,
``ledger.body_bundles``): a tenant's key reads only its own tenant's and the log-wide
environments; an all-tenant reader reads every one.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from inference_wrapper.server.access import caller, readable_tenant
from inference_wrapper.server.appkeys import LEDGER
from inference_wrapper.server.problems import Problem
from ledger import body_bundles, tiles
from ledger.errors import InvalidInputError
from ledger.leaves.envelope import tenant_tag
from ledger.store.tile_reads import (
    TileNotFoundError,
    covered,
    read_body_bundle,
)
from ledger.witness.cosignatures import cosigned_note

PREFIX = "/tlog"
TILE_PATTERN = PREFIX + "/tile/{tile_path:.+}"  # a tile path spans several segments
BODIES_PATTERN = PREFIX + "/bodies/{body_path:.+}"
IMMUTABLE = "public, max-age=31536000, immutable"


async def tlog_checkpoint(request: web.Request) -> web.Response:
    ledger = request.app[LEDGER]
    latest = await asyncio.to_thread(ledger.latest_checkpoint)
    if latest is None:
        raise Problem(404, "Not Found", "no checkpoint has been sealed yet")
    note = await asyncio.to_thread(cosigned_note, ledger, latest.size, latest.note)
    return web.Response(body=note, headers={"Content-Type": "text/plain; charset=utf-8",
                                            "Cache-Control": "no-cache"})


async def tlog_tile(request: web.Request) -> web.Response:
    key = caller(request)  # the access middleware checked its role (route table)
    try:
        ref = tiles.parse_path("tile/" + request.match_info["tile_path"])
    except InvalidInputError as exc:
        raise Problem(404, "Not Found", f"not a tile path: {exc.reason}") from exc
    ledger = request.app[LEDGER]
    latest = await asyncio.to_thread(ledger.latest_checkpoint)
    if latest is None or not covered(ref, latest.size):
        raise Problem(404, "Not Found", "the latest checkpoint does not cover this tile")
    try:
        if ref.entries:
            entries = await asyncio.to_thread(ledger.tiles.entries, ref.first,
                                              ref.first + ref.width)
            if readable_tenant(key) is not None and not tiles.only_envelopes(entries):
                raise Problem(403, "Forbidden", "this bundle holds whole records of every "
                              "tenant: an all-tenant reader's key is needed")
            body = tiles.encode_bundle(entries)
        else:
            body = await asyncio.to_thread(ledger.tiles.hash_tile, ref)
    except TileNotFoundError as exc:
        raise Problem(404, "Not Found", "the tile is not stored") from exc
    return web.Response(body=body, headers={"Content-Type": "application/octet-stream",
                                            "Cache-Control": IMMUTABLE})



async def tlog_bodies(request: web.Request) -> web.Response:
    key = caller(request)
    try:
        tag, ref = body_bundles.parse_body_path("bodies/" + request.match_info["body_path"])
    except InvalidInputError as exc:
        raise Problem(404, "Not Found", f"not a bodies path: {exc.reason}") from exc
    ledger = request.app[LEDGER]
    tenant = readable_tenant(key)
    if tenant is not None and tag is not None:
        meta = await asyncio.to_thread(ledger.log_meta)
        if meta is None or tag != tenant_tag(meta.origin, tenant):
            raise Problem(403, "Forbidden", "these are another tenant's bodies: a tenant's "
                          "key reads its own tenant's and the log-wide ones")
    latest = await asyncio.to_thread(ledger.latest_checkpoint)
    if latest is None or not covered(ref, latest.size):
        raise Problem(404, "Not Found", "the latest checkpoint does not cover this bundle")
    try:
        body = await asyncio.to_thread(read_body_bundle, ledger.tiles, tag, ref)
    except TileNotFoundError as exc:
        raise Problem(404, "Not Found", "no leaf of this tag is in this bundle") from exc
    return web.Response(body=body, headers={"Content-Type": "application/octet-stream",
                                            "Cache-Control": IMMUTABLE})
