"""Shared fixtures: one thread for torch, a tiny seeded model built once per session."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> None:
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from inference_wrapper.tiny import build_tiny_model

    directory = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    build_tiny_model(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_manifest(tiny_model_dir: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads(
        (tiny_model_dir.parent / "tiny-llama.manifest.json").read_text()
    )
    return manifest


@pytest.fixture(scope="session")
def tiny_generator(tiny_model_dir: Path, tiny_manifest: dict[str, Any]) -> Any:
    from inference_wrapper.generator import AuditedGenerator
    from inference_wrapper.model import load_model

    return AuditedGenerator(load_model(tiny_model_dir, name="tiny-llama", manifest=tiny_manifest))
