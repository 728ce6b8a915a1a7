"""Read the anchored checkpoint straight from the Fabric channel (for verify)."""

from __future__ import annotations

import json
import logging

from ledger.anchor.fabric import ChaincodeRefusedError, FabricGateway
from ledger.checkpoint import NoteVerifier, SignedNote
from ledger.errors import BackendConfigurationError, BackendError, CheckpointFormatError
from ledger.lenient_note import canonical_spelling

log = logging.getLogger(__name__)


class FabricAnchorReader:
    """``verifier`` (the pinned log key) lets it read a note that the chaincode before
    decision 0035 stored in a channel member's spelling (ledger.lenient_note)."""

    def __init__(self, gateway: FabricGateway, origin: str,
                 verifier: NoteVerifier | None = None) -> None:
        self.gateway, self.origin, self.verifier = gateway, origin, verifier

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
        return self._spelled(str(latest["note"]).encode()), ref

    def _spelled(self, note: bytes) -> bytes:
        try:
            SignedNote.parse(note)
            return note
        except CheckpointFormatError:
            if self.verifier is None:
                return note
            respelled = canonical_spelling(note, self.verifier)
            if respelled is None:
                return note  # check 4 refuses it, naming why
            log.warning("the channel's note for %s is spelled as the old chaincode "
                        "allowed; checking the log key's signature in it", self.origin)
            return respelled
