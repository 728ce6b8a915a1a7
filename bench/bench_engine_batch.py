"""What one engine batch costs the engine, by batch size, and what crosses the socket.

    .venv/bin/python bench/bench_engine_batch.py [--sizes 32,24,16,8,4] [--repeats 5]

Runs the engine's own ``run_batch`` (the code an engine process runs per ``generate``
frame) on the tiny model with one torch thread, for the prompts ``bench_endpoint.py``
sends, and prints per batch size: the engine's CPU time per batch and per row (the median
of ``--repeats`` runs: CPU time, not wall time, so a loaded machine moves it less), and
the frames and bytes a non-streamed batch puts on the socket pair (decision 0030: one
``generate`` frame out, one ``result`` frame back, no ``step`` frames).

Why: ``bench_endpoint.py``'s audited and bare handlers send the engine identical frames
for identical batches (both go through ``Batcher`` and ``engine_batch``, neither streams),
so a difference in engine CPU per request between them is a difference in how many
batches the same requests were cut into. This prints how much a batch's size moves the
engine's cost per request.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

PROMPT = "Summarise the credit exposure of the retail portfolio in one sentence:"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="32,24,16,8,4")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()

    import torch

    from inference_wrapper.engine import wire
    from inference_wrapper.engine.inprocess import InProcessEngine
    from inference_wrapper.engine.model import load_model
    from inference_wrapper.engine.params import GenerationParams
    from inference_wrapper.engine.protocol import EngineBatch
    from inference_wrapper.engine.tiny import build_tiny_model

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "tiny"
        build_tiny_model(model_dir)
        engine = InProcessEngine(load_model(model_dir), engine_id="engine-0")
        params = GenerationParams(max_new_tokens=args.new_tokens)
        print(f"tiny model, {args.new_tokens} new tokens, 1 torch thread; engine CPU is the "
              f"median of {args.repeats} runs (CPU time of this process)")
        for size in (int(x) for x in args.sizes.split(",")):
            prompts = tuple(f"{PROMPT} ({client}.3)" for client in range(size))
            batch = EngineBatch(prompts, params, tuple(() for _ in prompts),
                                tuple(False for _ in prompts))
            result = engine.run(batch)  # warm: allocator, caches
            runs = []
            for _ in range(args.repeats):
                start = time.process_time()
                result = engine.run(batch)
                runs.append(time.process_time() - start)
            cpu = statistics.median(runs)
            out = len(wire.encode({"type": "generate", "id": 1, "stream": False,
                                   "batch": batch.to_wire()}))
            back = len(wire.encode({"type": "result", "id": 1, "result": result.to_wire()}))
            print(f"batch {size:2d}: engine CPU {cpu * 1e3:7.1f} ms per batch, "
                  f"{cpu / size * 1e3:6.2f} ms per row; 2 frames, {out} B out + {back} B "
                  f"back ({(out + back) / size:.0f} B per row)")


if __name__ == "__main__":
    main()
