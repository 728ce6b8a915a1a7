"""Software fingerprint: interpreter, frameworks, this service's revision, the model."""

from __future__ import annotations

import functools
import importlib.metadata
import json
import platform
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ledger.canonical import canonical_bytes
from ledger.digest import sha256_digest

SCHEMA = "software-fingerprint/v1"
UNKNOWN = "unknown"
SERVICE_ROOT = Path(__file__).resolve().parents[3]  # the checkout this package runs from


@dataclass(frozen=True)
class SoftwareFingerprint:
    python: dict[str, Any]
    torch: dict[str, Any]
    transformers: dict[str, Any]
    service: dict[str, Any]
    dependencies_digest: str
    model_digest: str
    tokenizer_digest: str
    generation_config_digest: str
    schema: str = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def python_info() -> dict[str, Any]:
    build_no, build_date = platform.python_build()
    return {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "build": f"{build_no} ({build_date})",
        "compiler": platform.python_compiler(),
    }


def vcs_commit_of(distribution: str) -> str | None:
    """The commit a package was installed from, if pip recorded one (PEP 610)."""
    try:
        text = importlib.metadata.distribution(distribution).read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        return None
    if not text:
        return None
    commit = json.loads(text).get("vcs_info", {}).get("commit_id")
    return str(commit) if commit else None


@functools.cache  # read once per process: an engine's revision is the one it started with
def service_revision(root: Path = SERVICE_ROOT) -> dict[str, Any]:
    """This service's git revision and dirty flag, or an explicit 'unknown'."""
    try:
        import git

        repo = git.Repo(root, search_parent_directories=False)
        revision = repo.head.commit.hexsha
        dirty = repo.is_dirty(untracked_files=False)
    except Exception:  # no checkout, no commits, no git binary: say so, never guess
        return {"git_revision": UNKNOWN, "dirty": None}
    return {"git_revision": revision, "dirty": dirty}


@functools.cache  # the installed set is read once per process
def dependencies_digest() -> str:
    """Digest of the installed distribution set (name==version, sorted)."""
    pins = sorted(
        {f"{d.metadata['Name'].lower()}=={d.version}" for d in importlib.metadata.distributions()
         if d.metadata["Name"]}
    )
    return sha256_digest(canonical_bytes(pins))


def framework_info() -> dict[str, dict[str, Any]]:
    """The versions of the model stack this process would run."""
    import torch
    import transformers

    return {
        "torch": {"version": torch.__version__, "git_version": torch.version.git_version,
                  "cuda_build": torch.version.cuda},
        "transformers": {"version": transformers.__version__},
    }


def set_torch_threads(count: int) -> None:
    """torch's intra-op threads (1 is fastest on small shared machines)."""
    import torch

    torch.set_num_threads(count)


def capture_software(
    *, model_digest: str, tokenizer_digest: str, generation_config_digest: str
) -> SoftwareFingerprint:
    import torch
    import transformers

    return SoftwareFingerprint(
        python=python_info() | {"executable_abi": sys.implementation.cache_tag},
        torch={
            "version": torch.__version__,
            "git_version": torch.version.git_version,
            "cuda_build": torch.version.cuda,
        },
        transformers={
            "version": transformers.__version__,
            "git_sha": vcs_commit_of("transformers") or UNKNOWN,
        },
        service=service_revision(),
        dependencies_digest=dependencies_digest(),
        model_digest=model_digest,
        tokenizer_digest=tokenizer_digest,
        generation_config_digest=generation_config_digest,
    )
