"""Shared fixtures: a tiny seeded model built once per session, torch on one thread."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest


def _isolated_home() -> None:
    """Point ``AUDIT_LEDGER_HOME`` at a fresh folder for the whole run, before any project
    module reads it: a test that leaves a setting at its default (the vault keyring, the
    verifier's state, the logs) writes there, never into the user's own home. The
    converted default model and the downloaded wheels are shared read-only (symlinks)."""
    real = Path(os.environ.get("AUDIT_LEDGER_HOME", Path.home() / ".cache" / "audit-ledger"))
    home = Path(tempfile.mkdtemp(prefix="audit-ledger-tests-"))
    for shared in ("models", "downloads"):
        if (real / shared).exists():
            (home / shared).symlink_to(real / shared, target_is_directory=True)
    os.environ["AUDIT_LEDGER_HOME"] = str(home)
    atexit.register(shutil.rmtree, home, True)


_isolated_home()


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
