"""Options shared by the subcommands that load a model."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="a local Hugging Face causal-LM directory (default: shipped model)")
    parser.add_argument("--model-manifest", type=Path, default=None,
                        help="pinned model-manifest/v1 file the directory must match")
    parser.add_argument("--device", default=None, help="cpu or cuda[:N] (default: best)")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="torch intra-op threads (1 is fastest on small shared machines)")


def load_from_options(args: argparse.Namespace) -> Any:
    from inference_wrapper.engine.fingerprint.software import set_torch_threads
    from inference_wrapper.engine.model import load_default_model, load_model
    from inference_wrapper.engine.modelfiles import load_manifest

    set_torch_threads(args.torch_threads)
    if args.model_dir is None:
        return load_default_model(device=args.device)
    manifest = load_manifest(args.model_manifest) if args.model_manifest else None
    return load_model(args.model_dir, manifest=manifest, device=args.device)


def served_from_options(args: argparse.Namespace, engines: int) -> Any:
    """An ``AuditedGenerator`` whose model runs in ``engines`` supervised engine processes;
    this process loads only the tokenizer (decision 0030)."""
    from inference_wrapper.audit.generator import AuditedGenerator
    from inference_wrapper.defaults import DEFAULT_MODEL_DIR, DEFAULT_MODEL_NAME, PINNED_MANIFEST
    from inference_wrapper.engine.model import load_served_model
    from inference_wrapper.engine.modelfiles import load_manifest
    from inference_wrapper.engine.placement import engine_specs
    from inference_wrapper.engine.supervised import SupervisedEngine

    if args.model_dir is None:
        if not DEFAULT_MODEL_DIR.is_dir():
            raise FileNotFoundError(f"default model not found at {DEFAULT_MODEL_DIR}; run "
                                    "the set-up (make setup)")
        directory, manifest_path, name = DEFAULT_MODEL_DIR, PINNED_MANIFEST, DEFAULT_MODEL_NAME
    else:
        directory, manifest_path, name = args.model_dir, args.model_manifest, None
    manifest = load_manifest(manifest_path) if manifest_path else None
    served = load_served_model(directory, name=name, manifest=manifest)
    specs = engine_specs(engines, directory, name=served.name, manifest=manifest_path,
                         device=args.device, torch_threads=args.torch_threads)
    return AuditedGenerator(served, engines=[SupervisedEngine(spec) for spec in specs])


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))
