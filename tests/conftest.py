"""Shared fixtures: a tiny seeded model built once per session, torch on one thread."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def one_torch_thread() -> None:
    """torch on one thread (8 engineers share 2 cores); imported only by tests that use
    the model, so the pure-core tests never load torch."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, one_torch_thread: None) -> Path:
    from inference_wrapper.engine.tiny import build_tiny_model

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
    from inference_wrapper.audit.generator import AuditedGenerator
    from inference_wrapper.engine.model import load_model

    return AuditedGenerator(load_model(tiny_model_dir, name="tiny-llama", manifest=tiny_manifest))
