"""How the store keeps a v2 body: deflated against a fixed dictionary of the bodies' own
member names (decision 0026), recovered byte for byte when read.

A body is about 1 KB of canonical JSON, most of it member names and fixed words that
every body repeats; deflate with a preset dictionary (RFC 1951 raw stream, 4 KB window)
keeps little more than the hex digits and numbers. The stored form starts with a format
byte, so a later dictionary can be added without touching stored rows. This is storage
only: the envelope's digest is over the canonical body, which is what readers get back.
"""

from __future__ import annotations

import zlib

from ledger.errors import CanonicalFormError

# Format byte 1: raw deflate, level 1, 4 KB window, with DICTIONARY_1. Never change this
# dictionary: rows stored with it are read with it. A new one gets a new format byte.
DICTIONARY_1 = (
    b'{"created_at":"2026-01-01T00:00:00.000Z","engine":"engine-0",'
    b'"generation_config_digest":"sha256:","hardware":{"accelerator":"cuda",'
    b'"accelerator_model":"NVIDIA","driver_version":""},"model":{"digest":"sha256:",'
    b'"name":"","pinned":true},"record_id":"","schema":"environment/v1","software":{},'
    b'"tokenization_contract":{"tokenizer_digest":"sha256:"}}'
    b'"stop":"hmac-sha256:","user":"hmac-sha256:","stream":{"start_record_id":"'
    b'"gpu_sample":{"memory_used_bytes":,"power_w":,"utilization_pct":},"truncated":true,'
    b'"finish_reason":"stop","temperature":0.7,"top_p":0.9,"seed":'
    b'{"batch":{"id":"","row":1,"size":32},"commitments":{"input":"hmac-sha256:",'
    b'"input_ids":"hmac-sha256:","output":"hmac-sha256:","output_ids":"hmac-sha256:"},'
    b'"created_at":"2026-12-02T01:02:03.456Z","data":{"finish_reason":"length",'
    b'"generation":{"do_sample":false,"max_new_tokens":32,"seed":null,"temperature":0,'
    b'"top_p":1},"input_token_count":12,"output_token_count":32,"padding":{"count":4,'
    b'"side":"left"},"shape":[32,16],"truncated":false},"engine":"engine-0",'
    b'"environment":{"leaf_hash":"","leaf_index":0},"gpu_sample":null,"record_id":"0192f0c0-'
    b'0000-7000-8000-","schema":"audit-record/v2","tenant":"","timings_ms":{"decode":0.5,'
    b'"forward":12.25,"parse":0.125,"tokenize":0.5}}'
)
_FORMAT_1 = b"\x01"
_WBITS = -12  # raw deflate, 4 KB window: a body and the dictionary fit


# Streams that have taken the dictionary and nothing else. Each body starts from a copy:
# loading the dictionary is a fifth of the cost of packing one, and a copy's output is
# byte for byte a fresh stream's (``tests/unit/test_leaves_v2.py``).
_PACKER = zlib.compressobj(1, zlib.DEFLATED, _WBITS, 4, zlib.Z_DEFAULT_STRATEGY, DICTIONARY_1)
_UNPACKER = zlib.decompressobj(_WBITS, DICTIONARY_1)


def pack_body(body: bytes) -> bytes:
    """The stored form of a body."""
    packer = _PACKER.copy()
    return _FORMAT_1 + packer.compress(body) + packer.flush()


def unpack_body(stored: bytes) -> bytes:
    """The body a stored form holds (the exact bytes ``pack_body`` was given)."""
    if stored[:1] != _FORMAT_1:
        raise CanonicalFormError(f"unknown stored body format {stored[:1]!r}", field="body")
    unpacker = _UNPACKER.copy()
    try:
        body = unpacker.decompress(stored[1:]) + unpacker.flush()
    except zlib.error as exc:
        raise CanonicalFormError(f"stored body does not inflate: {exc}", field="body") from exc
    if not unpacker.eof or unpacker.unused_data:
        raise CanonicalFormError("stored body is cut short or has trailing bytes",
                                 field="body")
    return body
