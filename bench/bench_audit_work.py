"""The audit work of one call, in CPU time, at batch size 1 and 32, for v1 records and for
audit-record/v2 leaves side by side (issue 10's <= 0.1 ms; issue 20's v2 <= 60 us at 32).

    .venv/bin/python bench/bench_audit_work.py [--calls 3200] [--rounds 5] [--sizes 1,32]
    .venv/bin/python bench/bench_audit_work.py --sizes 32 --against OTHER_CHECKOUT [--runs 3]

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

``--against OTHER_CHECKOUT`` compares two trees on this machine's load: this script runs
in a child process with one tree's code, then the other's, alternately (``--runs``
times each, seal and append only, v2 records), and prints the medians and their ratios.
Run it with ``PYTHONPATH=.`` (the editable install may name another checkout).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from inference_wrapper.audit.generator import AuditedGenerator, BatchResult, LogBinding
from inference_wrapper.engine.model import load_model
from inference_wrapper.engine.params import GenerationParams
from inference_wrapper.engine.tiny import build_tiny_model
from ledger.leaves.record_v2 import EnvironmentRef
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger

PROMPT = "Summarise the credit exposure of the retail portfolio in one sentence:"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=3200, help="calls per round and size")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--sizes", default="1,32", help="batch sizes, comma-separated")
    parser.add_argument("--against", type=Path,
                        help="another checkout (the code before a change): both are "
                             "measured alternately in child processes and compared")
    parser.add_argument("--runs", type=int, default=3, help="with --against: runs of each")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.against is not None:
        compare(args)
        return
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
            environment = generator.environment_leaf()
            receipt = ledger.append(environment)
            v2 = LogBinding("bench.audit-ledger/log")
            v2.bind(generator.environment(),
                    EnvironmentRef(receipt.leaf_index, environment.leaf_hash))
            for size in (int(s) for s in args.sizes.split(",")):
                if args.child:  # seal and append of v2 records, as JSON for ``compare``
                    seal_us, append_us = measure_audit(generator, ledger, params, size,
                                                       args.calls, args.rounds, v2)
                    print(json.dumps({"size": size, "seal": seal_us, "append": append_us}),
                          flush=True)
                    continue
                for log in (None, v2):
                    measure_size(generator, ledger, params, size, args.calls, args.rounds,
                                 log)


def measure_size(generator: AuditedGenerator, ledger: SqlLedger, params: GenerationParams,
                 size: int, wanted_calls: int, rounds: int, log: LogBinding | None) -> None:
    batches = max(1, wanted_calls // size)
    requests = [[generator.prepare(f"{PROMPT} ({b}.{i})", params, "bench")
                 for i in range(size)] for b in range(batches)]
    calls, gen_batches = batches * size, max(1, 64 // size)
    generated = [generator.run_batch(batch) for batch in requests[:2]]
    results = [generated[b % 2] for b in range(batches)]
    a = best_of(rounds, lambda: cpu_of(
        lambda: [generator.run_batch(batch) for batch in requests[:gen_batches]]))
    a /= gen_batches * size
    b = best_of(rounds, lambda: cpu_of(lambda: [generator.seal(r, log) for r in results])
                ) / calls
    c = best_of(rounds, lambda: append_cpu(ledger, generator, results, log)) / calls
    d = best_of(rounds, lambda: cpu_of(
        lambda: [generator.prepare(f"{PROMPT} ({n})", params, "bench")
                 for n in range(calls)])) / calls
    print(f"{'v2' if log else 'v1'} batch {size:2d}: (a) generate {a:8.1f}  (b) seal {b:6.1f}"
          f"  (c) append {c:6.1f}"
          f"  -> audit work (b)+(c) {b + c:6.1f} us = {(b + c) / a:.2%} of generate"
          f"  [(d) prepare {d:6.1f}, shared]", flush=True)


def measure_audit(generator: AuditedGenerator, ledger: SqlLedger, params: GenerationParams,
                  size: int, wanted_calls: int, rounds: int, log: LogBinding
                  ) -> tuple[float, float]:
    """(b) seal and (c) append per call, as ``measure_size`` measures them."""
    batches = max(1, wanted_calls // size)
    requests = [[generator.prepare(f"{PROMPT} ({b}.{i})", params, "bench")
                 for i in range(size)] for b in range(2)]
    generated = [generator.run_batch(batch) for batch in requests]
    results = [generated[b % 2] for b in range(batches)]
    calls = batches * size
    seal = best_of(rounds, lambda: cpu_of(lambda: [generator.seal(r, log) for r in results]))
    append = best_of(rounds, lambda: append_cpu(ledger, generator, results, log))
    return seal / calls, append / calls


def compare(args: argparse.Namespace) -> None:
    """This script in child processes, with the other checkout's code and this one's
    alternately (both see the same load); the medians of each and their ratio."""
    trees = {"before": args.against.resolve(), "after": Path(__file__).resolve().parents[1]}
    figures: dict[str, dict[str, list[float]]] = {
        name: {"seal": [], "append": [], "audit": []} for name in trees}
    for _ in range(args.runs):
        for name, tree in trees.items():
            done = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--child", "--sizes",
                 args.sizes.split(",")[-1], "--calls", str(args.calls), "--rounds",
                 str(args.rounds), "--new-tokens", str(args.new_tokens)],
                cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True,
                text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"the {name} run failed:\n{done.stderr[-3000:]}")
            said = json.loads(done.stdout.strip().splitlines()[-1])
            figures[name]["seal"].append(said["seal"])
            figures[name]["append"].append(said["append"])
            figures[name]["audit"].append(said["seal"] + said["append"])
    print(f"v2 batch {args.sizes.split(',')[-1]}, CPU us per call, median of {args.runs} "
          f"alternating runs (each the best of {args.rounds} rounds of {args.calls} calls); "
          f"load {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for part in ("seal", "append", "audit"):
        before, after = (statistics.median(figures[name][part]) for name in trees)
        print(f"  {part:6s} before {before:7.1f}  after {after:7.1f}  after/before "
              f"{after / before:.2f}   (before {_runs(figures['before'][part])}; "
              f"after {_runs(figures['after'][part])})")


def _runs(values: list[float]) -> str:
    return ", ".join(f"{v:.1f}" for v in values)


def cpu_of(work: Callable[[], object]) -> float:
    """CPU microseconds of every thread of this process while ``work`` runs."""
    start = time.process_time()
    work()
    return (time.process_time() - start) * 1e6


def best_of(rounds: int, measure: Callable[[], float]) -> float:
    return min(measure() for _ in range(rounds))


def append_cpu(ledger: SqlLedger, generator: AuditedGenerator,
               results: list[BatchResult], log: LogBinding | None) -> float:
    """Durable appends of fresh records (ids are unique), a batch per group as the
    batcher makes them: one transaction and one fsync per batch; the sealing is not timed."""
    batches = [[output.record for output in generator.seal(result, log)] for result in results]

    def append() -> None:
        for records in batches:
            for future in [ledger.submit(record) for record in records]:
                future.result()

    return cpu_of(append)


if __name__ == "__main__":
    main()
