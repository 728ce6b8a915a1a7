"""Loading a causal LM directory, only after its files match a pinned manifest."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference_wrapper.defaults import DEFAULT_MODEL_DIR, DEFAULT_MODEL_NAME, PINNED_MANIFEST
from inference_wrapper.engine.contract import tokenizer_digest
from inference_wrapper.engine.modelfiles import (
    build_manifest,
    load_manifest,
    manifest_digest,
    verify_directory,
)
from ledger.canonical import canonical_bytes
from ledger.digest import sha256_digest

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    name: str
    directory: Path
    model: Any  # transformers PreTrainedModel
    tokenizer: Any  # transformers PreTrainedTokenizerFast
    device: Any  # torch.device
    digest: str
    tokenizer_digest: str
    generation_config_digest: str
    pinned: bool


def pick_device(requested: str | None = None) -> Any:
    import torch

    if requested:
        return torch.device(requested)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_model(
    directory: Path,
    *,
    name: str | None = None,
    manifest: dict[str, Any] | None = None,
    device: str | None = None,
    dtype: str = "float32",
) -> LoadedModel:
    """Verify ``directory`` against ``manifest`` (if given), then load it offline.

    Without a manifest the directory's digest is computed and recorded, but nothing
    vouches for it: the log says so.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = Path(directory)
    if manifest is not None:
        digest = verify_directory(directory, manifest)
    else:
        digest = manifest_digest(build_manifest(directory))
        log.warning("model %s is not pinned; recording its digest %s", directory, digest)
    target = pick_device(device)
    model = AutoModelForCausalLM.from_pretrained(
        directory, local_files_only=True, dtype=getattr(torch, dtype)
    ).to(target)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    generation_config = model.generation_config.to_dict()
    generation_config.pop("transformers_version", None)
    return LoadedModel(
        name=name or directory.name,
        directory=directory,
        model=model,
        tokenizer=tokenizer,
        device=target,
        digest=digest,
        tokenizer_digest=tokenizer_digest(directory),
        generation_config_digest=sha256_digest(canonical_bytes(generation_config)),
        pinned=manifest is not None,
    )


def load_default_model(device: str | None = None) -> LoadedModel:
    """The shipped SmolLM2-135M-Instruct, verified against the pinned manifest."""
    if not DEFAULT_MODEL_DIR.is_dir():
        raise FileNotFoundError(
            f"default model not found at {DEFAULT_MODEL_DIR}; run the set-up (make setup)"
        )
    return load_model(
        DEFAULT_MODEL_DIR,
        name=DEFAULT_MODEL_NAME,
        manifest=load_manifest(PINNED_MANIFEST),
        device=device,
    )


@dataclass
class ServedModel:
    """What the API side of an engine process knows of the model: its facts and its
    tokenizer (admission counts tokens, routes apply the chat template, streams decode).
    The weights stay in the engine process."""

    name: str
    directory: Path
    tokenizer: Any  # transformers PreTrainedTokenizerFast
    digest: str
    tokenizer_digest: str
    pinned: bool
    model: None = None  # never here: the engine process holds it


def load_served_model(directory: Path, *, name: str | None = None,
                      manifest: dict[str, Any] | None = None) -> ServedModel:
    """The API side's view of a model directory: the manifest is checked (the engine checks
    it again when it loads the weights), only the tokenizer is loaded."""
    from transformers import AutoTokenizer

    directory = Path(directory)
    if manifest is not None:
        digest = verify_directory(directory, manifest)
    else:
        digest = manifest_digest(build_manifest(directory))
    return ServedModel(
        name=name or directory.name,
        directory=directory,
        tokenizer=AutoTokenizer.from_pretrained(directory, local_files_only=True),
        digest=digest,
        tokenizer_digest=tokenizer_digest(directory),
        pinned=manifest is not None,
    )
