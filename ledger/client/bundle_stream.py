"""An evidence bundle written a page at a time, for exports that must not hold it all.

The same JSON as ``ledger.bundle.Bundle.to_json`` (``Bundle.loads`` reads it), produced as
chunks: the header first, then the entries, one page of mirror rows at a time, so a
40,000-record export holds one page in memory, not the bundle.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime

from ledger.bundle import BUNDLE_FORMAT, entry_json, leaves_json
from ledger.client.exporter import DEFAULT_EARLIER_SIZES, BundledLog, NamedLeaves
from ledger.errors import BackendError
from ledger.witness.cosignatures import cosigned_note

PAGE = 500


def bundle_chunks(ledger: BundledLog, since: datetime | None, until: datetime | None,
                  filters: dict[str, str], contains: dict[str, str] | None = None,
                  scope: str | None = None) -> Iterator[str]:
    """The bundle of the matching records at the latest checkpoint, as text chunks. The
    header (checkpoint, anchor, proofs from the latest earlier sizes) comes first."""
    latest = ledger.latest_checkpoint()
    if latest is None:
        raise BackendError("the log has no checkpoint yet")
    anchored = ledger.anchors.latest()
    anchor = None
    if anchored is not None:
        low, high = sorted((anchored.size, latest.size))
        proof = ledger.consistency_proof(low, high) if low < high else []
        anchor = {"checkpoint": anchored.note.decode(), "ref": anchored.ref,
                  "consistency": [h.hex() for h in proof]}
    earlier = [c.size for c in ledger.iter_checkpoints() if 1 <= c.size < latest.size]
    header = {
        "format": BUNDLE_FORMAT, "origin": latest.note.split(b"\n", 1)[0].decode(),
        "log_key": "", "checkpoint": cosigned_note(ledger, latest.size, latest.note).decode(),
        "anchor": anchor,
        "consistency_from": {str(s): [h.hex() for h in ledger.consistency_proof(s, latest.size)]
                             for s in earlier[-DEFAULT_EARLIER_SIZES:]},
    }
    yield json.dumps(header)[:-1] + ', "entries": [\n'
    named = NamedLeaves(ledger, latest.size, scope)
    first, cursor = True, None
    while True:
        found = ledger.mirror.page(since=since, until=until, limit=PAGE, cursor=cursor,
                                   filters=filters, contains=contains)
        rows, cursor = found.rows, found.next_cursor
        entries = [json.dumps(entry_json(named.entry(r)))
                   for r in rows if r.leaf_index < latest.size]
        if entries:
            yield ("" if first else ",\n") + ",\n".join(entries)
            first = False
        if cursor is None:
            break
    # The leaves the v2 entries name, each once (few environments; one start per
    # streamed record, bounded by the export's cap).
    yield ("\n], " + json.dumps({"environments": leaves_json(named.environments),
                                  "stream_starts": leaves_json(named.starts)})[1:] + "\n")
