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
         "inclusion_proof": ["<hex>", ...],
         "body": "<base64>", "environment_index": 3,     (v2 leaves only)
         "stream_start_index": 5}                        (streamed v2 records only)
      ],
      "environments": {"3": {"envelope": "<base64>", "body": "<base64>",
                             "inclusion_proof": ["<hex>", ...]}},  (when any)
      "stream_starts": {"5": {...as an environment...}}            (when any)
    }

A v2 leaf's ``canonical`` is its envelope and ``body`` its body (decision 0026); each
environment leaf a v2 record names is carried once, under ``environments``, with its own
inclusion proof to the bundle's checkpoint, and so is the stream start leaf a streamed
v2 record names, under ``stream_starts`` (decision 0050: check 1 opens it).

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

from ledger.canonical import parse_strict, strict_int
from ledger.checkpoint import Checkpoint
from ledger.errors import InvalidInputError, LedgerError
from ledger.verify import Evidence, LeafEvidence

BUNDLE_FORMAT = "audit-ledger-bundle/v2"
READABLE_FORMATS = ("audit-ledger-bundle/v1", BUNDLE_FORMAT)


# A bundle is read whole; past this it is refused with a clear error (export smaller
# bundles: --since, --until, --tenant).
MAX_BUNDLE_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class BundleEntry:
    record_id: str
    leaf_index: int
    canonical: bytes
    inclusion_proof: Sequence[bytes]
    body: bytes | None = None  # a v2 leaf's body
    environment_index: int | None = None  # the environment leaf a v2 record names
    stream_start_index: int | None = None  # the stream start leaf a streamed one names
    # Why the entry could not be read (its record then fails check 1; the others are
    # still judged). None for a well-formed entry.
    problem: str | None = None


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
    # The environment leaves the v2 entries name, each once, by leaf index.
    environments: Mapping[int, LeafEvidence] = field(default_factory=dict)
    # The stream start leaves streamed v2 entries name, each once, by leaf index.
    stream_starts: Mapping[int, LeafEvidence] = field(default_factory=dict)

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
            "entries": [entry_json(e) for e in self.entries],
            **({"environments": leaves_json(self.environments)}
               if self.environments else {}),
            **({"stream_starts": leaves_json(self.stream_starts)}
               if self.stream_starts else {}),
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1) + "\n"

    @classmethod
    def loads(cls, text: str | bytes) -> Bundle:
        """Read a bundle strictly (one meaning only: duplicate keys, deep nesting, huge
        numbers and non-integer integers are refused). A malformed frame is a usage
        error; a malformed entry is kept with its ``problem`` for check 1."""
        if len(text) > MAX_BUNDLE_BYTES:
            raise InvalidInputError("bundle", f"larger than {MAX_BUNDLE_BYTES} bytes: export "
                                    "it in smaller parts (--since/--until)")
        try:
            data = parse_strict(text)
            if not isinstance(data, dict):
                raise TypeError("not a JSON object")
            if data.get("format") not in READABLE_FORMATS:
                raise InvalidInputError("bundle", f"not an {BUNDLE_FORMAT} (or v1) file")
            anchor = data.get("anchor")
            entries = data["entries"]
            if not isinstance(entries, list):
                raise TypeError("entries is not a list")
            return cls(
                origin=_text(data["origin"], "origin"),
                log_key=_text(data["log_key"], "log_key"),
                checkpoint=_text(data["checkpoint"], "checkpoint").encode(),
                entries=[_entry(number, e) for number, e in enumerate(entries)],
                environments=_leaves(data.get("environments", {}), "environments"),
                stream_starts=_leaves(data.get("stream_starts", {}), "stream_starts"),
                anchored=_text(anchor["checkpoint"], "anchor.checkpoint").encode()
                if anchor else None,
                anchor_ref=_text(anchor["ref"], "anchor.ref") if anchor else None,
                anchor_consistency=_hashes(anchor["consistency"], "anchor.consistency")
                if anchor else (),
                consistency_from={_size(size): _hashes(proof, f"consistency_from.{size}")
                                  for size, proof in data.get("consistency_from", {}).items()},
            )
        except InvalidInputError as exc:
            if exc.field == "bundle":
                raise
            raise InvalidInputError("bundle", f"malformed bundle: {exc}") from exc
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InvalidInputError("bundle", f"malformed bundle: {exc}") from exc

    def problems(self, record_id: str | None = None) -> list[BundleEntry]:
        """The entries that could not be read (each fails check 1)."""
        return [e for e in self.entries if e.problem is not None
                and (record_id is None or e.record_id == record_id)]

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
            if entry.problem is not None:
                continue
            if record_id is not None and entry.record_id != record_id:
                continue
            yield Evidence(
                record_id=entry.record_id, canonical=entry.canonical,
                leaf_index=entry.leaf_index, inclusion_proof=entry.inclusion_proof,
                checkpoint_note=self.checkpoint, anchored_note=self.anchored,
                anchor_ref=self.anchor_ref, anchor_consistency=self.anchor_consistency,
                seen_consistency=seen_consistency, body=entry.body,
                environment=None if entry.environment_index is None
                else self.environments.get(entry.environment_index),
                stream_start=None if entry.stream_start_index is None
                else self.stream_starts.get(entry.stream_start_index),
            )


def entry_json(entry: BundleEntry) -> dict[str, Any]:
    result: dict[str, Any] = {"record_id": entry.record_id, "leaf_index": entry.leaf_index,
                              "canonical": base64.b64encode(entry.canonical).decode(),
                              "inclusion_proof": [h.hex() for h in entry.inclusion_proof]}
    if entry.body is not None:
        result["body"] = base64.b64encode(entry.body).decode()
        result["environment_index"] = entry.environment_index
    if entry.stream_start_index is not None:
        result["stream_start_index"] = entry.stream_start_index
    return result


def leaves_json(leaves: Mapping[int, LeafEvidence]) -> dict[str, Any]:
    return {str(index): {"envelope": base64.b64encode(leaf.envelope).decode(),
                         "body": base64.b64encode(leaf.body).decode(),
                         "inclusion_proof": [h.hex() for h in leaf.inclusion_proof]}
            for index, leaf in sorted(leaves.items())}


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string")
    return value


def _size(text: str) -> int:
    if not text.isdigit() or (text != "0" and text.startswith("0")):
        raise ValueError(f"consistency_from size {text[:20]!r} is not a decimal number")
    return int(text)


def _hashes(value: Any, name: str) -> list[bytes]:
    if not isinstance(value, list) or not all(isinstance(h, str) for h in value):
        raise TypeError(f"{name} must be a list of hex strings")
    return [bytes.fromhex(h) for h in value]


def _entry(number: int, raw: Any) -> BundleEntry:
    """One entry, or a placeholder naming what is wrong with it (check 1 fails for it)."""
    record_id = raw.get("record_id") if isinstance(raw, dict) else None
    label = record_id if isinstance(record_id, str) else f"entry #{number}"
    try:
        if not isinstance(raw, dict):
            raise TypeError("not a JSON object")
        leaf_index = strict_int(raw["leaf_index"], "leaf_index")
        if leaf_index < 0:
            raise ValueError("leaf_index is negative")
        body = raw.get("body")
        environment_index = raw.get("environment_index")
        start_index = raw.get("stream_start_index")
        return BundleEntry(_text(raw["record_id"], "record_id"), leaf_index,
                           base64.b64decode(_text(raw["canonical"], "canonical"),
                                            validate=True),
                           _hashes(raw["inclusion_proof"], "inclusion_proof"),
                           None if body is None else base64.b64decode(
                               _text(body, "body"), validate=True),
                           None if environment_index is None
                           else strict_int(environment_index, "environment_index"),
                           None if start_index is None
                           else strict_int(start_index, "stream_start_index"))
    except (ValueError, KeyError, TypeError) as exc:
        why = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        return BundleEntry(label, -1, b"", (), problem=f"bundle entry #{number} is "
                           f"malformed: {why}")


def _leaves(raw: Any, name: str) -> dict[int, LeafEvidence]:
    """The leaves a bundle carries for its entries (``environments``,
    ``stream_starts``), by leaf index."""
    if not isinstance(raw, dict):
        raise TypeError(f"{name} must be an object")
    return {_size(index): LeafEvidence(
        _size(index), base64.b64decode(_text(leaf["envelope"], "envelope"), validate=True),
        base64.b64decode(_text(leaf["body"], "body"), validate=True),
        _hashes(leaf["inclusion_proof"], f"{name}.{index}.inclusion_proof"))
        for index, leaf in raw.items()}
