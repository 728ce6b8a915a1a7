"""A log anchored on the peer double, as the anchoring tests drive it: a SQLite ledger, its
integrator, the Fabric anchor registered on the double's channel, and the anchor store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledger.anchor.fabric import FabricAnchor, FabricGateway, Identity
from ledger.anchor.worker import AnchorWorker
from ledger.store.anchors import SqlAnchorStore
from ledger.store.integrator import Integrator
from ledger.store.keys import load_or_create_signer
from ledger.store.log_api import StoredCheckpoint
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger
from tests.fabric.conftest import gateway_for
from tests.fabric.peer_double import GatewayDouble, PeerDouble
from tests.records import make_record


@dataclass
class AnchoredLog:
    origin: str
    ledger: SqlLedger
    anchor: FabricAnchor
    gateway: FabricGateway
    integrator: Integrator
    store: SqlAnchorStore
    double: GatewayDouble
    next_record: int = 0

    def grow(self, count: int) -> StoredCheckpoint:
        """Append ``count`` records and seal a checkpoint over them."""
        for _ in range(count):
            self.ledger.append(make_record(self.next_record))
            self.next_record += 1
        sealed = self.integrator.seal_now()
        assert sealed is not None
        return sealed

    def proof(self, first: int, second: int) -> str:
        return json.dumps([h.hex() for h in self.ledger.consistency_proof(first, second)])

    def chain(self, size: int) -> dict[str, Any]:
        return self.anchor.checkpoint(size)

    def block_on_chain(self, tx_id: str) -> int:
        return self.double.committed[tx_id].block

    def worker(self, **options: Any) -> AnchorWorker:
        worker = AnchorWorker(self.ledger, self.anchor, store=self.store, **options)
        worker.prepared = True  # registered when the log was opened
        return worker


@contextmanager
def anchored_log(peer: PeerDouble, identity: Identity, directory: Path,
                 origin: str) -> Iterator[AnchoredLog]:
    """A fresh log in ``directory``, registered on the double's channel."""
    url = f"sqlite:///{directory / 'ledger.db'}"
    upgrade(url)
    signer = load_or_create_signer(directory / "log.key", origin)
    with SqlLedger(url) as ledger:
        gateway = gateway_for(peer, identity, timeout_s=5, commit_timeout_s=5)
        store = SqlAnchorStore(ledger.engine)
        anchor = FabricAnchor(ledger, gateway, signer.verifier(), origin, store)
        anchor.register()
        assert peer.gateway is not None
        try:
            yield AnchoredLog(origin, ledger, anchor, gateway,
                              Integrator(ledger, signer, origin), store, peer.gateway)
        finally:
            gateway.close()
