"""The audit work of one call, in CPU time, at batch size 1 and 32 (issue 10's <= 0.1 ms).

    .venv/bin/python bench/bench_audit_work.py [--calls 3200] [--rounds 5]

CPU time (``time.process_time``: every thread of this process, sleeps and fsync waits
excluded) rather than wall time, so a busy machine slows the figures less than it blurs
a wall-clock ratio. On the tiny model, for the same prepared requests, it measures per call:
(a) generate: tokenize, ``model.generate``, decode (``run_batch``), shared by the audited
    and the bare service;
(b) seal: data fingerprint, salted commitments and the canonical RFC 8785 record;
(c) append: the durable group append (SQLite, synchronous=FULL, one transaction per batch
    as the writer thread commits it), its CPU only;
(d) prepare: validation and the tokenization-contract length check, also done by the bare
    handler of ``bench_endpoint.py``; shown apart, not counted as audit work.
The audit work per call is (b) + (c); each is the best of ``--rounds`` rounds (the least
disturbed). Prints microseconds per call and the share of (a).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from inference_wrapper.generator import AuditedGenerator
from inference_wrapper.model import load_model
from inference_wrapper.params import GenerationParams
from inference_wrapper.tiny import build_tiny_model
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger

PROMPT = "Summarise the credit exposure of the retail portfolio in one sentence:"


def per_call_cpu_us(work: Callable[[], object], calls: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        work()
        best = min(best, time.process_time() - start)
    return best / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=3200, help="calls per round and size")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        manifest = build_tiny_model(Path(tmp) / "tiny")
        generator = AuditedGenerator(load_model(Path(tmp) / "tiny", manifest=manifest))
        params = GenerationParams(max_new_tokens=args.new_tokens)
        url = f"sqlite:///{tmp}/ledger.db"
        upgrade(url)
        print(f"tiny model, {args.new_tokens} new tokens, best of {args.rounds} rounds, "
              "CPU microseconds per call")
        with SqlLedger(url) as ledger:
            for size in (1, 32):
                batches = max(1, args.calls // size)
                requests = [[generator.prepare(f"{PROMPT} ({b}.{i})", params, "bench")
                             for i in range(size)] for b in range(batches)]
                calls = batches * size
                generated = [generator.run_batch(batch) for batch in requests[:2]]
                results = [generated[b % 2] for b in range(batches)]
                sealed = [generator.seal(result) for result in results]

                def prepare(size: int = size, batches: int = batches) -> None:
                    for b in range(batches):
                        for i in range(size):
                            generator.prepare(f"{PROMPT} ({b}.{i})", params, "bench")

                def seal() -> None:
                    for result in results:
                        generator.seal(result)

                def append() -> None:
                    # New records each round (ids are unique), appended a batch at a time
                    # as the batcher does: one group, one transaction, one fsync.
                    batch_records = [[o.record for o in generator.seal(r)] for r in results]
                    start = time.process_time()
                    for records in batch_records:
                        futures = [ledger.submit(record) for record in records]
                        for future in futures:
                            future.result()
                    append.cpu = time.process_time() - start  # type: ignore[attr-defined]

                def generate(rounds: int = 1) -> None:
                    for batch in requests[:max(1, 64 // size)]:
                        generator.run_batch(batch)

                del sealed
                gen_calls = max(1, 64 // size) * size
                a = per_call_cpu_us(generate, gen_calls, args.rounds)
                b = per_call_cpu_us(seal, calls, args.rounds)
                best_append = float("inf")
                for _ in range(args.rounds):
                    append()
                    best_append = min(best_append, append.cpu)  # type: ignore[attr-defined]
                c = best_append / calls * 1e6
                d = per_call_cpu_us(prepare, calls, args.rounds)
                print(f"batch {size:2d}: (a) generate {a:8.1f}  (b) seal {b:6.1f}  "
                      f"(c) append {c:6.1f}  -> audit work (b)+(c) {b + c:6.1f} us "
                      f"= {(b + c) / a:.2%} of generate  [(d) prepare {d:6.1f}, shared]")


if __name__ == "__main__":
    main()
