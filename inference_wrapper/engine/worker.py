"""The engine process: ``python -m inference_wrapper.engine.worker SPEC``.

First it imports the model stack and reads what does not depend on the model (the
installed distributions, this checkout's revision) and says ``warm``: a supervisor keeps
one such process in reserve, so that a restart costs a model load, not an interpreter
start and a torch import. On ``load`` it loads and verifies the model, captures its
environment, then runs one batch at a time for the API process on the socket it
inherited (``SPEC["fd"]``): each step's tokens as they are generated, then the batch's
result. It exits when the socket closes, so an engine never outlives the API process
that started it.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
from pathlib import Path
from typing import Any

from inference_wrapper.engine import wire

log = logging.getLogger("audit_ledger.engine")


def warm_up() -> None:
    """Everything an engine start needs that no model decides: imported, read, cached."""
    import torch  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    from inference_wrapper.engine.fingerprint.software import (
        dependencies_digest,
        service_revision,
    )

    dependencies_digest()
    service_revision()


def load_engine(spec: dict[str, Any]) -> Any:
    import torch
    from transformers.utils import logging as transformers_logging

    from inference_wrapper.engine.contract import TokenizationContract
    from inference_wrapper.engine.gpu_sample import nvml_sampler
    from inference_wrapper.engine.inprocess import InProcessEngine
    from inference_wrapper.engine.model import load_model
    from inference_wrapper.engine.modelfiles import load_manifest

    torch.set_num_threads(int(spec["torch_threads"]))
    transformers_logging.disable_progress_bar()  # a restart must not fill the log
    manifest = load_manifest(Path(spec["manifest"])) if spec.get("manifest") else None
    loaded = load_model(Path(spec["model_dir"]), name=spec.get("name"), manifest=manifest,
                        device=spec.get("device"))
    contract = spec.get("contract")
    return InProcessEngine(
        loaded, TokenizationContract(**contract) if contract else None,
        engine_id=spec["engine_id"],
        sample_gpu=nvml_sampler(loaded.device) if loaded.device.type == "cuda" else None)


def serve(sock: socket.socket, engine: Any) -> int:
    from inference_wrapper.engine.protocol import EngineBatch

    while True:
        message = wire.recv(sock)
        if message is None or message["type"] == "close":
            return 0
        if message["type"] != "generate":
            log.error("engine %s ignores a %r frame", engine.engine_id, message["type"])
            continue
        batch_id = message["id"]

        def on_step(tokens: list[int | None], batch_id: int = batch_id) -> None:
            wire.send(sock, {"type": "step", "id": batch_id, "tokens": tokens})

        try:
            batch = EngineBatch.from_wire(message["batch"])
            result = engine.run(batch, on_step if message.get("stream") else None)
        except Exception as exc:  # a failed batch fails that batch, not the engine
            log.exception("engine %s: a batch failed", engine.engine_id)
            wire.send(sock, {"type": "error", "id": batch_id,
                             "error": f"{type(exc).__name__}: {exc}"})
            continue
        wire.send(sock, {"type": "result", "id": batch_id, "result": result.to_wire()})


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s engine {spec['engine_id']} %(levelname)s "
                               "%(message)s")
    sock = socket.socket(fileno=int(spec["fd"]))
    try:
        warm_up()
        wire.send(sock, {"type": "warm"})
        order = wire.recv(sock)  # held in reserve until the supervisor needs it
        if order is None or order["type"] != "load":
            return 0
        engine = load_engine(spec)
    except (BrokenPipeError, ConnectionResetError):  # the API process went away
        return 0
    except Exception as exc:  # said to the API process, which refuses or retries
        log.exception("engine %s could not start", spec["engine_id"])
        wire.send(sock, {"type": "failed", "error": f"{type(exc).__name__}: {exc}"})
        return 3
    wire.send(sock, {"type": "ready", "environment": dict(engine.environment())})
    try:
        return serve(sock, engine)
    except (BrokenPipeError, ConnectionResetError):  # the API process went away
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
