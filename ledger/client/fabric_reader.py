"""Read the anchored checkpoint straight from the Fabric channel (for verify)."""

from __future__ import annotations

import json
import logging

from ledger.anchor.fabric import ChaincodeRefusedError, FabricGateway
from ledger.errors import BackendConfigurationError, BackendError

log = logging.getLogger(__name__)


class FabricAnchorReader:
    def __init__(self, gateway: FabricGateway, origin: str) -> None:
        self.gateway, self.origin = gateway, origin

    def __call__(self) -> tuple[bytes, str] | None:
        try:
            latest = json.loads(self.gateway.evaluate("GetLatest", self.origin))
        except ChaincodeRefusedError as exc:
            if exc.code == "NOT_FOUND":
                return None
            raise
        ref = f"fabric:{self.gateway.channel}:{latest['txId']}"
        # The block comes from the channel too (qscc GetBlockByTxID), not from the
        # service's table; a peer whose policy hides qscc leaves the reference without it.
        try:
            ref += f" block {self.gateway.block_of(str(latest['txId']))}"
        except BackendConfigurationError:
            raise
        except BackendError as exc:
            log.warning("could not read the block of %s from the channel: %s",
                        latest["txId"], exc)
        return str(latest["note"]).encode(), ref
