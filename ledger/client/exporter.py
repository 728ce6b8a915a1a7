"""Building evidence bundles from a log (a database's, or the in-memory twin) or a server."""

from __future__ import annotations

import base64
import urllib.parse
from collections.abc import Callable
from datetime import datetime
from typing import Protocol

from ledger.bundle import Bundle, BundleEntry
from ledger.checkpoint import Checkpoint
from ledger.client.sources import RecordNotFoundError, ServerSource, named_start_id
from ledger.errors import BackendError
from ledger.leaves.mirror import LOG_WIDE_TENANT
from ledger.store.log_api import EvidenceLog, RecordRow
from ledger.store.mirror import MirrorPages
from ledger.verify import LeafEvidence
from ledger.witness.cosignatures import cosigned_note

Progress = Callable[[int, int | None], None]
DEFAULT_EARLIER_SIZES = 1000


class BundledLog(EvidenceLog, Protocol):
    """The evidence of a log and the mirror pages its bundled records are chosen from."""

    @property
    def mirror(self) -> MirrorPages: ...


def export_from_log(ledger: BundledLog, since: datetime | None, until: datetime | None,
                    filters: dict[str, str], progress: Progress | None = None,
                    log_key: str = "", since_size: int | None = None) -> Bundle:
    """A bundle of the matching records at the latest checkpoint, with consistency proofs
    from every earlier checkpoint size >= ``since_size`` (see ``ledger.bundle``); by
    default from the latest ``DEFAULT_EARLIER_SIZES`` checkpoint sizes (a log sealing
    every second publishes 86,400 a day: proofs from all of them would swamp a bundle)."""
    latest = ledger.latest_checkpoint()
    if latest is None:
        raise BackendError("the log has no checkpoint yet")
    entries: list[BundleEntry] = []
    named = NamedLeaves(ledger, latest.size)
    cursor: str | None = None
    while True:
        found = ledger.mirror.page(since=since, until=until, limit=1000, cursor=cursor,
                                   filters=filters)
        entries += [named.entry(row) for row in found.rows if row.leaf_index < latest.size]
        if progress:
            progress(len(entries), None)
        cursor = found.next_cursor
        if cursor is None:
            break
    anchored = ledger.anchors.latest()
    consistency: list[bytes] = []
    if anchored is not None:
        low, high = sorted((anchored.size, latest.size))
        consistency = ledger.consistency_proof(low, high) if low < high else []
    earlier = [c.size for c in ledger.iter_checkpoints()
               if max(since_size or 0, 1) <= c.size < latest.size]
    if since_size is None:
        earlier = earlier[-DEFAULT_EARLIER_SIZES:]
    proofs_from = {s: ledger.consistency_proof(s, latest.size) for s in earlier}
    origin = latest.note.split(b"\n", 1)[0].decode()
    return Bundle(origin, log_key, cosigned_note(ledger, latest.size, latest.note), entries,
                  anchored.note if anchored else None, anchored.ref if anchored else None,
                  consistency, proofs_from, named.environments, named.starts)


class NamedLeaves:
    """Bundle entries for mirror rows at one checkpoint size, and the other leaves their
    v2 records name (environment leaves, stream starts), each gathered once with its
    inclusion proof: a bundle carries them beside the entries."""

    def __init__(self, ledger: BundledLog, size: int, scope: str | None = None) -> None:
        # ``scope``: a tenant-scoped reader's bundle carries no other tenant's leaf, even
        # one a record names (the verifier then says the leaf was not given).
        self.ledger, self.size, self.scope = ledger, size, scope
        self.environments: dict[int, LeafEvidence] = {}
        self.starts: dict[int, LeafEvidence] = {}

    def entry(self, row: RecordRow) -> BundleEntry:
        start_id = named_start_id(row.body)
        start = None if start_id is None else self.ledger.get_record(start_id)
        if start is not None and not self._readable(start, self.scope):
            start = None
        if start is not None and start.leaf_index < self.size:
            self._keep(self.starts, start)
        index = row.environment_index
        if index is not None and index not in self.environments:
            environment = self.ledger.record_at(index)
            if environment is not None and self._readable(environment, LOG_WIDE_TENANT):
                self._keep(self.environments, environment)
        return BundleEntry(row.record_id, row.leaf_index, row.canonical,
                           self.ledger.inclusion_proof(row.leaf_index, self.size),
                           row.body, row.environment_index,
                           None if start is None else start.leaf_index)

    def _readable(self, leaf: RecordRow, owner: str | None) -> bool:
        """A leaf a record names goes into a scoped bundle only if ``owner`` holds it: a
        stream start the reader's tenant, an environment leaf the log (no tenant)."""
        return self.scope is None or leaf.tenant == owner

    def _keep(self, leaves: dict[int, LeafEvidence], row: RecordRow) -> None:
        if row.body is not None and row.leaf_index not in leaves:
            leaves[row.leaf_index] = LeafEvidence(
                row.leaf_index, row.canonical, row.body,
                self.ledger.inclusion_proof(row.leaf_index, self.size))


def export_from_server(base_url: str, api_key: str, since: datetime | None,
                       until: datetime | None, filters: dict[str, str],
                       progress: Progress | None = None,
                       since_sizes: tuple[int, ...] = ()) -> Bundle:
    """A bundle from a server's auditor routes. The server lists no past checkpoints, so
    the consistency proofs carried are those from the anchored size and from each of
    ``since_sizes`` (a verifier's last-seen size, e.g. ``export --since-size N``)."""
    server = ServerSource(base_url, api_key)
    latest = server.get("/v1/checkpoints/latest")
    note, size = latest["checkpoint"].encode(), int(latest["tree_size"])
    key = server.get("/v1/log/public-key")
    query: dict[str, str] = dict(filters)
    if since:
        query["since"] = since.isoformat()
    if until:
        query["until"] = until.isoformat()
    entries: list[BundleEntry] = []
    environments: dict[int, LeafEvidence] = {}
    starts: dict[int, LeafEvidence] = {}  # stream start leaves, by index
    cursor = None
    while True:
        page = server.get("/v1/records", **query, limit=500,
                           **({"cursor": cursor} if cursor else {}))
        for row in page["records"]:
            if row["leaf_index"] >= size:
                continue
            quoted = urllib.parse.quote(row["record_id"], safe="")
            proof = server.get(f"/v1/records/{quoted}/proof", tree_size=size)
            full = server.get(f"/v1/records/{quoted}")
            named = full.get("environment")
            body = base64.b64decode(full["body_base64"]) if "body_base64" in full else None
            start = _server_start(server, named_start_id(body), size)
            if start is not None:
                starts[start.leaf_index] = start
            entries.append(BundleEntry(row["record_id"], int(row["leaf_index"]),
                                       base64.b64decode(full["canonical_base64"]),
                                       [bytes.fromhex(h) for h in proof["inclusion_proof"]],
                                       body, int(named["leaf_index"]) if named else None,
                                       None if start is None else start.leaf_index))
            if named and int(named["leaf_index"]) not in environments:  # each once
                environments[int(named["leaf_index"])] = LeafEvidence(
                    int(named["leaf_index"]), base64.b64decode(named["envelope_base64"]),
                    base64.b64decode(named["body_base64"]),
                    [bytes.fromhex(h) for h in proof["environment"]["inclusion_proof"]])
        if progress:
            progress(len(entries), None)
        cursor = page.get("next_cursor")
        if not cursor:
            break
    anchored = server.anchored()
    consistency: list[bytes] = []
    sizes = set(since_sizes)
    if anchored is not None:
        low, high = sorted((Checkpoint.peek(anchored[0]).size, size))
        consistency = server.consistency(low, high) if low < high else []
        sizes.add(low)
    proofs_from = {first: server.consistency(first, size) for first in sorted(sizes)
                   if 0 < first < size}
    return Bundle(key["origin"], key["verifier_key"], note, entries,
                  anchored[0] if anchored else None, anchored[1] if anchored else None,
                  consistency, proofs_from, environments, starts)


def _server_start(server: ServerSource, start_id: str | None, size: int
                  ) -> LeafEvidence | None:
    """The stream start leaf a streamed record names, with its proof at ``size``; None
    when the server has none this key may read (the verifier then fails check 1)."""
    if start_id is None:
        return None
    quoted = urllib.parse.quote(start_id, safe="")
    try:
        full = server.get(f"/v1/records/{quoted}")
        proof = server.get(f"/v1/records/{quoted}/proof", tree_size=size)
    except RecordNotFoundError:
        return None
    if "body_base64" not in full:
        return None
    return LeafEvidence(int(full["leaf_index"]), base64.b64decode(full["canonical_base64"]),
                        base64.b64decode(full["body_base64"]),
                        [bytes.fromhex(h) for h in proof["inclusion_proof"]])
