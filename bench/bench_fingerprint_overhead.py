"""Audited vs bare ``generate`` on the tiny model, side by side in one process.

Bare: tokenize under the same contract, ``model.generate``, decode. Audited: the same
plus validation, data fingerprint, commitments and a canonical record (no ledger
append; that belongs to the ledger benchmarks). Runs alternate so drift hits both.

    .venv/bin/python bench/bench_fingerprint_overhead.py [--runs 40] [--new-tokens 32]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from inference_wrapper.audit.generator import AuditedGenerator
from inference_wrapper.engine.model import load_model
from inference_wrapper.engine.params import GenerationParams
from inference_wrapper.engine.tiny import build_tiny_model

PROMPT = "Summarise the quarterly credit exposure of the retail portfolio."


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        manifest = build_tiny_model(Path(tmp) / "tiny")
        generator = AuditedGenerator(load_model(Path(tmp) / "tiny", manifest=manifest))
    tokenizer, model = generator.loaded.tokenizer, generator.loaded.model
    contract = generator.contract
    params = GenerationParams(max_new_tokens=args.new_tokens)

    def bare() -> str:
        enc, _ = contract.encode(tokenizer, [PROMPT])
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=args.new_tokens, do_sample=False,
                                 temperature=None, top_p=None, top_k=None,
                                 pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id)
        return str(tokenizer.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True))

    def audited() -> str:
        return str(generator.generate(PROMPT, params).text)

    assert bare() == audited(), "both paths must produce the same text"
    times: dict[str, list[float]] = {"bare": [], "audited": []}
    for _ in range(args.runs):
        for name, fn in (("bare", bare), ("audited", audited)):
            start = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - start) * 1000)
    bare_ms = statistics.median(times["bare"])
    audited_ms = statistics.median(times["audited"])
    pairs = sorted(a / b for a, b in zip(times["audited"], times["bare"], strict=True))
    # The audit work alone, timed directly: validation + fingerprint + record.
    audit_ms = []
    for _ in range(args.runs):
        start = time.perf_counter()
        request = generator.prepare(PROMPT, params)
        mid = time.perf_counter()
        batch = generator.run_batch([request])
        end = time.perf_counter()
        generator.seal(batch)
        audit_ms.append(((mid - start) + (time.perf_counter() - end)) * 1000)
    print(f"tiny model, {args.new_tokens} new tokens, {args.runs} alternating runs, 1 thread")
    print(f"  bare generate     median {bare_ms:8.2f} ms")
    print(f"  audited generate  median {audited_ms:8.2f} ms")
    print(f"  overhead ratio (median of per-pair ratios) {statistics.median(pairs):.4f}"
          f"  (ratio of medians {audited_ms / bare_ms:.4f}; target <= 1.01)")
    only = statistics.median(audit_ms)
    print(f"  audit work alone  median {only:8.3f} ms = {only / bare_ms:.4%} of bare generate")


if __name__ == "__main__":
    main()
