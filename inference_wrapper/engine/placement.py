"""Where engine processes run: one per GPU on a CUDA machine, each seeing only its own."""

from __future__ import annotations

import os
from pathlib import Path

from inference_wrapper.engine.process import EngineSpec


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries, without
    creating a CUDA context here (the engines do that)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [entry.strip() for entry in listed.split(",") if entry.strip()]
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return [str(index) for index in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML: no GPU this process can see
        return []


def engine_specs(count: int, model_dir: Path, *, name: str | None, manifest: Path | None,
                 device: str | None, torch_threads: int) -> list[EngineSpec]:
    """``count`` engines. On CUDA (asked for, or found when no device is given) engine
    ``i`` gets the ``i``-th visible GPU as its only one; on CPU they share the cores."""
    gpus = visible_gpus() if device is None or device.startswith("cuda") else []
    if device is not None and device.startswith("cuda") and not gpus:
        raise ValueError(f"--device {device}: no GPU is visible to this process")
    if gpus and count > len(gpus):
        raise ValueError(f"{count} engines asked for, {len(gpus)} GPUs visible")
    specs = []
    for index in range(count):
        env = {"CUDA_VISIBLE_DEVICES": gpus[index]} if gpus else {}
        specs.append(EngineSpec(
            engine_id=f"engine-{index}", model_dir=Path(model_dir), name=name,
            manifest=manifest, device="cuda:0" if gpus else (device or "cpu"),
            torch_threads=torch_threads, env=env))
    return specs
