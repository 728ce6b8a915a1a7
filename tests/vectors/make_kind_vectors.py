"""Regenerate the vectors of the v2 kinds beside the record (``leaves_v2_kinds.json``):
a stream start, an access, an erasure and a report leaf built from fixed inputs, with
their exact envelope and body bytes and leaf hashes (decision 0043).

    .venv/bin/python -m tests.vectors.make_kind_vectors

The format is forever: ``tests/unit/test_leaf_kinds_v2.py`` rebuilds every leaf from the
inputs stored here and must get the stored bytes. Regenerate only for a new format
version, never to make a changed builder pass.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ledger.leaves.commitments import INPUT, STOP, USER, commit, stop_bytes
from ledger.leaves.content_leaves import build_access, build_erasure
from ledger.leaves.envelope import Leaf
from ledger.leaves.record_v2 import EnvironmentRef
from ledger.leaves.report import build_report
from ledger.leaves.stream_start import build_stream_start_v2

HERE = Path(__file__).parent
ORIGIN = "vectors.audit-ledger/log"

INPUTS: dict[str, Any] = {
    "origin": ORIGIN,
    "stream_start": {
        "tenant": "acme", "engine": "engine-0",
        "record_id": "0192f0c0-0000-7000-8000-000000000003",
        "created_at": "2026-12-02T01:02:03.900Z",
        "environment": {"leaf_index": 0, "leaf_hash": "5a" * 32},
        "input_salt": "11" * 32, "user_salt": "33" * 32, "prompt": "my PIN is 7236",
        "stop": ["\n\n"], "user": "alice@example.com",
        "generation": {"max_new_tokens": 16, "temperature": 0.0, "top_p": 1.0,
                       "seed": None, "do_sample": False},
        "route": "/v1/chat/completions",
    },
    "access": {
        "leaf_id": "0192f0c0-0000-7000-8000-000000000004",
        "created_at": "2026-12-02T01:03:00.000Z",
        "record_id": "0192f0c0-0000-7000-8000-000000000002", "record_tenant": "acme",
        "key_id": "key-auditor-1", "role": "auditor", "key_tenant": "audit-firm",
        "purpose": "MiFID II record-keeping review", "channel": "http",
    },
    "erasure": {
        "leaf_id": "0192f0c0-0000-7000-8000-000000000005",
        "created_at": "2026-12-02T01:04:00.000Z", "tenant": "acme",
        "records": ["0192f0c0-0000-7000-8000-000000000002",
                    "0192f0c0-0000-7000-8000-000000000001"],
        "reason": "request", "selector": "subject", "requested_by": "cli:dpo",
        "legal_basis": "GDPR Art. 17(1)(d), ticket 8812",
    },
    "report": {
        "leaf_id": "0192f0c0-0000-7000-8000-000000000006",
        "created_at": "2026-12-02T01:05:00.000Z", "digest": "sha256:" + "7e" * 32,
        "since": "2026-12-01T00:00:00.000Z", "until": "2026-12-02T00:00:00.000Z",
        "scope_tenant": "acme", "made_by": "compliance-officer", "file": "report.html",
    },
}


def build(inputs: dict[str, Any]) -> dict[str, Leaf]:
    """Every leaf from ``inputs`` (the test calls this too)."""
    origin, start = inputs["origin"], inputs["stream_start"]
    input_salt, user_salt = bytes.fromhex(start["input_salt"]), bytes.fromhex(
        start["user_salt"])
    ref = start["environment"]
    return {
        "stream_start": build_stream_start_v2(
            origin=origin, tenant=start["tenant"], engine=start["engine"],
            environment=EnvironmentRef(ref["leaf_index"], bytes.fromhex(ref["leaf_hash"])),
            commitments={
                INPUT: commit(input_salt, INPUT, start["prompt"].encode()),
                STOP: commit(input_salt, STOP, stop_bytes(start["stop"])),
                USER: commit(user_salt, USER, start["user"].encode())},
            generation=start["generation"], route=start["route"],
            record_id=start["record_id"], created_at=start["created_at"]),
        "access": build_access(origin=origin, **inputs["access"]),
        "erasure": build_erasure(origin=origin, **inputs["erasure"]),
        "report": build_report(origin=origin, **inputs["report"]),
    }


def main() -> None:
    leaves = {name: {"envelope": leaf.envelope.decode(), "body": leaf.body.decode(),
                     "leaf_hash": leaf.leaf_hash.hex()}
              for name, leaf in build(INPUTS).items()}
    text = json.dumps({"inputs": INPUTS, "leaves": leaves}, indent=1, ensure_ascii=False)
    (HERE / "leaves_v2_kinds.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
