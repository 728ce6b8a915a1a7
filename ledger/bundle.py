"""Evidence bundles: one self-contained JSON file to verify records with no server.

Format ``audit-ledger-bundle/v2`` (all hashes hex, record bytes base64)::

    {
      "format": "audit-ledger-bundle/v2",
      "origin": "<log origin>",
      "log_key": "<verifier key, informational: verifiers pin their own>",
      "checkpoint": "<signed checkpoint note that every proof leads to; it may carry
                     witness cosignature lines after the log's signature>",
      "anchor": {"checkpoint": "<anchored note>", "ref": "<where>",
                 "consistency": ["<hex>", ...]} | null,
      "consistency_from": {"<earlier size>": ["<hex>", ...], ...},
      "entries": [
        {"record_id": "...", "leaf_index": 7, "canonical": "<base64 of the exact bytes>",
         "inclusion_proof": ["<hex>", ...]}
      ]
    }

``anchor.consistency`` links the bundle's checkpoint and the anchored one (smaller size
first). ``consistency_from`` holds, for each earlier checkpoint size the log published
(by default the latest 1000; all from N on with the exporter's ``--since-size N``), the
consistency proof from that size to the bundle's: a verifier that already saw a
checkpoint of that size can prove offline that the bundle extends it. Nothing in a
bundle is trusted: every entry is verified like online evidence. Version 1 files (no
``consistency_from``) are still read.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ledger.checkpoint import Checkpoint
from ledger.errors import InvalidInputError, LedgerError
from ledger.verify import Evidence

BUNDLE_FORMAT = "audit-ledger-bundle/v2"
READABLE_FORMATS = ("audit-ledger-bundle/v1", BUNDLE_FORMAT)


@dataclass(frozen=True)
class BundleEntry:
    record_id: str
    leaf_index: int
    canonical: bytes
    inclusion_proof: Sequence[bytes]


@dataclass(frozen=True)
class Bundle:
    origin: str
    log_key: str
    checkpoint: bytes
    entries: Sequence[BundleEntry]
    anchored: bytes | None = None
    anchor_ref: str | None = None
    anchor_consistency: Sequence[bytes] = ()
    # Earlier checkpoint size -> consistency proof from it to this bundle's checkpoint.
    consistency_from: Mapping[int, Sequence[bytes]] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """The checkpoint's size (-1 when unreadable: check 3 will say why)."""
        try:
            return Checkpoint.peek(self.checkpoint).size
        except LedgerError:
            return -1

    def to_json(self) -> dict[str, Any]:
        return {
            "format": BUNDLE_FORMAT,
            "origin": self.origin,
            "log_key": self.log_key,
            "checkpoint": self.checkpoint.decode(),
            "anchor": None if self.anchored is None else {
                "checkpoint": self.anchored.decode(), "ref": self.anchor_ref,
                "consistency": [h.hex() for h in self.anchor_consistency]},
            "consistency_from": {str(size): [h.hex() for h in proof]
                                 for size, proof in sorted(self.consistency_from.items())},
            "entries": [{"record_id": e.record_id, "leaf_index": e.leaf_index,
                         "canonical": base64.b64encode(e.canonical).decode(),
                         "inclusion_proof": [h.hex() for h in e.inclusion_proof]}
                        for e in self.entries],
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1) + "\n"

    @classmethod
    def loads(cls, text: str | bytes) -> Bundle:
        try:
            data = json.loads(text)
            if data.get("format") not in READABLE_FORMATS:
                raise InvalidInputError("bundle", f"not an {BUNDLE_FORMAT} (or v1) file")
            anchor = data.get("anchor")
            return cls(
                origin=str(data["origin"]), log_key=str(data["log_key"]),
                checkpoint=str(data["checkpoint"]).encode(),
                entries=[BundleEntry(str(e["record_id"]), int(e["leaf_index"]),
                                     base64.b64decode(e["canonical"], validate=True),
                                     [bytes.fromhex(h) for h in e["inclusion_proof"]])
                         for e in data["entries"]],
                anchored=str(anchor["checkpoint"]).encode() if anchor else None,
                anchor_ref=str(anchor["ref"]) if anchor else None,
                anchor_consistency=[bytes.fromhex(h) for h in anchor["consistency"]]
                if anchor else (),
                consistency_from={int(size): [bytes.fromhex(h) for h in proof]
                                  for size, proof in data.get("consistency_from", {}).items()},
            )
        except InvalidInputError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InvalidInputError("bundle", f"malformed bundle: {exc}") from exc

    def evidence(self, record_id: str | None = None,
                 seen_note: bytes | None = None) -> Iterator[Evidence]:
        """Evidence per entry; with ``seen_note`` (the verifier's state), the proof from
        its size when the bundle carries one (None when it does not)."""
        seen_consistency: Sequence[bytes] | None = ()
        if seen_note is not None:
            seen_size = Checkpoint.peek(seen_note).size
            if seen_size < self.size:
                seen_consistency = self.consistency_from.get(seen_size)
        for entry in self.entries:
            if record_id is not None and entry.record_id != record_id:
                continue
            yield Evidence(
                record_id=entry.record_id, canonical=entry.canonical,
                leaf_index=entry.leaf_index, inclusion_proof=entry.inclusion_proof,
                checkpoint_note=self.checkpoint, anchored_note=self.anchored,
                anchor_ref=self.anchor_ref, anchor_consistency=self.anchor_consistency,
                seen_consistency=seen_consistency,
            )
