"""Regenerate the v2 leaf vectors (``leaves_v2.json``): an environment leaf and a record
leaf built from fixed inputs, with their exact envelope and body bytes and leaf hashes.

    .venv/bin/python -m tests.vectors.make_leaf_vectors

The format is forever: ``tests/unit/test_leaves_v2.py`` rebuilds both leaves from the
inputs stored here and must get the stored bytes. Regenerate only for a new format
version, never to make a changed builder pass.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ledger.leaves.commitments import row_commitments
from ledger.leaves.environment import build_environment
from ledger.leaves.record_v2 import EnvironmentRef, build_record_v2, row_data

HERE = Path(__file__).parent
ORIGIN = "vectors.audit-ledger/log"

INPUTS: dict[str, Any] = {
    "origin": ORIGIN,
    "environment": {
        "engine": "engine-0",
        "record_id": "0192f0c0-0000-7000-8000-000000000001",
        "created_at": "2026-12-02T01:02:03.456Z",
        "model": {"name": "tiny-llama", "digest": "sha256:" + "ab" * 32, "pinned": True},
        "hardware": {"accelerator": "cuda", "accelerator_model": "NVIDIA H200",
                     "driver_version": "560.35.03", "cpu_count": 16},
        "software": {"torch": {"version": "2.5.1", "git_version": "a" * 40},
                     "service": {"git_revision": "b" * 40, "dirty": False}},
        "tokenization_contract": {"tokenizer_digest": "sha256:" + "cd" * 32,
                                  "padding_side": "left", "max_input_tokens": 2048},
        "generation_config_digest": "sha256:" + "ef" * 32,
    },
    "record": {
        "tenant": "acme",
        "engine": "engine-0",
        "record_id": "0192f0c0-0000-7000-8000-000000000002",
        "created_at": "2026-12-02T01:02:04.000Z",
        "input_salt": "11" * 32, "output_salt": "22" * 32, "user_salt": "33" * 32,
        "prompt": "my PIN is 7236", "input_ids": [1, 2, 3, 4, 5],
        "output": "42.", "output_ids": [6, 7],
        "stop": ["\n\n"], "user": "alice@example.com",
        "batch": {"id": "0123456789abcdef0123456789abcdef", "size": 2, "row": 1},
        "padded_length": 7,
        "generation": {"max_new_tokens": 16, "temperature": 0.0, "top_p": 1.0,
                       "seed": None, "do_sample": False},
        "timings_ms": {"parse": 0.125, "tokenize": 0.5, "forward": 12.25, "decode": 0.75},
        "gpu_sample": {"utilization_pct": 87, "memory_used_bytes": 1073741824},
        "stream_start_record_id": "0192f0c0-0000-7000-8000-000000000003",
    },
}


def build(inputs: dict[str, Any]) -> dict[str, Any]:
    """Both leaves from ``inputs`` (the test calls this too)."""
    env_in, rec = inputs["environment"], inputs["record"]
    environment = build_environment(**env_in)
    commitments = row_commitments(
        input_salt=bytes.fromhex(rec["input_salt"]),
        output_salt=bytes.fromhex(rec["output_salt"]),
        user_salt=bytes.fromhex(rec["user_salt"]), prompt=rec["prompt"],
        input_ids=rec["input_ids"], output=rec["output"], output_ids=rec["output_ids"],
        stop=rec["stop"], user=rec["user"])
    record = build_record_v2(
        origin=inputs["origin"], tenant=rec["tenant"], engine=rec["engine"],
        environment=EnvironmentRef(0, environment.leaf_hash), commitments=commitments,
        data=row_data(input_token_count=len(rec["input_ids"]),
                      output_token_count=len(rec["output_ids"]), truncated=False,
                      finish_reason="stop", rows=rec["batch"]["size"],
                      padded_length=rec["padded_length"], padding_side="left",
                      padding_count=rec["padded_length"] - len(rec["input_ids"]),
                      generation=rec["generation"]),
        batch=rec["batch"], timings_ms=rec["timings_ms"], gpu_sample=rec["gpu_sample"],
        stream_start_record_id=rec["stream_start_record_id"],
        record_id=rec["record_id"], created_at=rec["created_at"])
    return {
        name: {"envelope": leaf.envelope.decode(), "body": leaf.body.decode(),
               "leaf_hash": leaf.leaf_hash.hex()}
        for name, leaf in (("environment", environment), ("record", record))
    }


def main() -> None:
    text = json.dumps({"inputs": INPUTS, "leaves": build(INPUTS)}, indent=1,
                      ensure_ascii=False)
    (HERE / "leaves_v2.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
