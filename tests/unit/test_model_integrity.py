"""Weights are verified against the pinned manifest before anything is loaded."""

import shutil
from pathlib import Path
from typing import Any

import pytest

from inference_wrapper.engine.model import load_model
from inference_wrapper.engine.modelfiles import build_manifest, manifest_digest, verify_directory
from ledger.errors import ModelIntegrityError


@pytest.fixture()
def model_copy(tiny_model_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))


def test_one_changed_byte_in_weights_refused_naming_the_file(
    model_copy: Path, tiny_manifest: dict[str, Any]
) -> None:
    weights = model_copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(ModelIntegrityError) as info:
        load_model(model_copy, manifest=tiny_manifest)
    assert info.value.path == "model.safetensors"
    assert "pinned manifest says" in str(info.value)


def test_changed_tokenizer_refused_naming_the_file(
    model_copy: Path, tiny_manifest: dict[str, Any]
) -> None:
    (model_copy / "tokenizer.json").write_text("{}")
    with pytest.raises(ModelIntegrityError) as info:
        verify_directory(model_copy, tiny_manifest)
    assert info.value.path == "tokenizer.json"


def test_missing_file_refused(model_copy: Path, tiny_manifest: dict[str, Any]) -> None:
    (model_copy / "config.json").unlink()
    with pytest.raises(ModelIntegrityError, match="config.json: pinned file is missing"):
        verify_directory(model_copy, tiny_manifest)


def test_unexpected_file_refused(model_copy: Path, tiny_manifest: dict[str, Any]) -> None:
    (model_copy / "extra.bin").write_bytes(b"\x00")
    with pytest.raises(ModelIntegrityError, match="extra.bin: file is not in the pinned"):
        verify_directory(model_copy, tiny_manifest)


def test_digest_is_order_independent_and_matches(
    model_copy: Path, tiny_manifest: dict[str, Any]
) -> None:
    reordered = {"schema": tiny_manifest["schema"],
                 "files": dict(reversed(list(tiny_manifest["files"].items())))}
    assert manifest_digest(reordered) == manifest_digest(tiny_manifest)
    assert verify_directory(model_copy, tiny_manifest) == manifest_digest(
        build_manifest(model_copy)
    )


def test_tiny_model_build_is_reproducible(tmp_path: Path, tiny_manifest: dict[str, Any]) -> None:
    from inference_wrapper.engine.tiny import build_tiny_model

    assert build_tiny_model(tmp_path / "again") == tiny_manifest
