"""Read the anchored checkpoint straight from the Fabric channel (for verify)."""

from __future__ import annotations

import json

from ledger.anchor.fabric import ChaincodeRefusedError, FabricGateway


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
        return str(latest["note"]).encode(), ref
