"""The console's "prove this answer complete": a search's time window read leaf by leaf
from the log's own tiles and checked against the latest signed checkpoint (issue 26 item
4, issue 24), on a page of its own because it reads the whole window.

This is the operator-hosted proof: the operator's server reads and checks. The local
console (``audit-ledger console``) does the same from the tiles on the auditor's machine.
A tenant's session proves its own tenant's answer only: the filter is forced to its
tenant and the page shows counts and leaf indices, never a record's bytes.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from html import escape

from aiohttp import web

from inference_wrapper.server.appkeys import LEDGER, SETTINGS, SIGNER
from inference_wrapper.server.console import (
    _to_login,
    current_session,
    error_page,
    page,
    search_error,
)
from inference_wrapper.server.console_pages import shown
from inference_wrapper.server.console_search import BadField, parse_search
from ledger.checkpoint import NoteVerifier
from ledger.client.proved_window import prove_window_from
from ledger.errors import InvalidInputError, VerificationError
from ledger.store.log_api import PublishableLog
from ledger.store.tile_reads import StoreTiles
from ledger.witness.client import parse_witnesses
from ledger.witness.cosignatures import cosigned_note

# About 1.5 s of reading and hashing per 100,000 leaves here; a larger window is the CLI's.
PROVE_MAX_LEAVES = 200_000
NOTICE = ("<p id=\"operator-hosted\">This is the operator-hosted proof: the operator's "
          "server read the leaves and checked them. To check it without trusting this "
          "server, run <code>audit-ledger query --prove</code> on your own machine: it reads "
          "the log's tiles and checks every leaf of the window itself.</p>")


def prove(ledger: PublishableLog, verifier: NoteVerifier, witness_setting: str, since: datetime,
          until: datetime, filters: dict[str, str]) -> str:
    """The answer's sentence: complete (and how the checkpoint is vouched for), or why
    it cannot be proven. Raises nothing a caller must map: every refusal is a sentence."""
    latest = ledger.latest_checkpoint()
    if latest is None:
        return "cannot be proven: no checkpoint has been sealed yet"
    note = cosigned_note(ledger, latest.size, latest.note)
    witnesses = [w.key for w in parse_witnesses(witness_setting)]
    try:
        answer, _, vouched = prove_window_from(
            StoreTiles(ledger.tiles, note), verifier, since, until,
            filters, witnesses=witnesses, quorum=1 if witnesses else None)
    except (VerificationError, InvalidInputError) as exc:
        return f"cannot be proven: {exc}"
    if vouched == "UNWITNESSED":
        # The first anchor covering the checkpoint's last leaf (an anchor of this size or a
        # later one, which a consistency proof ties to it).
        last = ledger.record_at(answer.tree_size - 1)
        vouched = (f"an anchor ({last.anchor_ref})" if last is not None and last.anchor_ref
                   else "only the log key (neither witnessed nor anchored)")
    return f"{answer.summary()}; checkpoint size {answer.tree_size} vouched for by {vouched}"


async def prove_page(request: web.Request) -> web.Response:
    session = await current_session(request)
    if session is None:
        return _to_login()
    try:
        search = parse_search(request.query, session.scope)
        if search.since is None or search.until is None:
            raise BadField("until" if search.since else "since",
                           "a proof needs both ends of the time window")
        if search.contains:
            raise BadField(next(iter(search.contains)), "a part of a name cannot be proven: "
                           "choose exact match")
    except (BadField, InvalidInputError) as exc:
        return search_error(exc, session, "Cannot prove")
    filters = {k: v for k, v in search.filters.items() if v}
    app = request.app
    # The proof reads every leaf of the window, every tenant's: bounded, as exports are.
    leaves = await asyncio.to_thread(app[LEDGER].mirror.count, since=search.since,
                                     until=search.until)
    if leaves > PROVE_MAX_LEAVES:
        return error_page(422, "Window too large for the console",
                          f"this window holds {leaves} leaves; the console proves at most "
                          f"{PROVE_MAX_LEAVES}: narrow the time range, or run `audit-ledger "
                          "query --prove`, which reads the tiles on your own machine",
                          session, field="until")
    verdict = await asyncio.to_thread(prove, app[LEDGER], app[SIGNER].verifier(),
                                      app[SETTINGS].witnesses, search.since, search.until,
                                      filters)
    ok = verdict.startswith("complete")
    main = (f"<h2>Is this answer complete?</h2>{NOTICE}"
            f'<p id="proof-verdict" class="{"ok" if ok else "bad"}">{shown(verdict)}</p>'
            f'<p><a href="/console?{escape(search.query_string())}">back to the search</a>'
            "</p>")
    return page("Proof of completeness", main, session)
