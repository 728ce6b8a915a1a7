"""Model directories as manifests of per-file SHA-256 digests, checked before serving.

The model digest is ``sha256:`` of the canonical JSON manifest, so it does not depend on
the order files are listed or read in.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ledger.canonical import canonical_bytes
from ledger.digest import sha256_digest
from ledger.errors import ModelIntegrityError

MANIFEST_SCHEMA = "model-manifest/v1"
# Files that describe weights, tokenizer or generation; anything else (READMEs, caches)
# does not change what the model computes and is left out of the digest.
IGNORED_NAMES = {".gitattributes", "README.md", "LICENSE"}


def file_sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def model_files(directory: Path) -> list[str]:
    names = []
    for path in directory.rglob("*"):
        relative = path.relative_to(directory)
        # Hub-style ".cache" folders hold download bookkeeping, not model content.
        if path.is_file() and path.name not in IGNORED_NAMES and ".cache" not in relative.parts:
            names.append(relative.as_posix())
    return sorted(names)


def build_manifest(directory: Path) -> dict[str, Any]:
    """``{"schema": ..., "files": {relative path: sha256 hex}}`` of a model directory."""
    files = {name: file_sha256(directory / name) for name in model_files(directory)}
    return {"schema": MANIFEST_SCHEMA, "files": files}


def manifest_digest(manifest: dict[str, Any]) -> str:
    return sha256_digest(canonical_bytes(manifest))


def load_manifest(path: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads(path.read_text())
    if manifest.get("schema") != MANIFEST_SCHEMA:
        raise ValueError(f"{path}: not a {MANIFEST_SCHEMA} file")
    return manifest


def verify_directory(directory: Path, pinned: dict[str, Any]) -> str:
    """Hash every file and compare with ``pinned``; return the model digest.

    Raises ``ModelIntegrityError`` naming the first file that is missing, unexpected
    or changed. Nothing is loaded before this passes.
    """
    expected: dict[str, str] = pinned["files"]
    present = set(model_files(directory))
    for name in sorted(expected):
        if name not in present:
            raise ModelIntegrityError(name, "pinned file is missing")
        actual = file_sha256(directory / name)
        if actual != expected[name]:
            raise ModelIntegrityError(
                name, f"SHA-256 is {actual}, pinned manifest says {expected[name]}"
            )
    for name in sorted(present - set(expected)):
        raise ModelIntegrityError(name, "file is not in the pinned manifest")
    return manifest_digest(pinned)
