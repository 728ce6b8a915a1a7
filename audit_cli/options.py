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
    import torch

    from inference_wrapper.engine.model import load_default_model, load_model
    from inference_wrapper.engine.modelfiles import load_manifest

    torch.set_num_threads(args.torch_threads)
    if args.model_dir is None:
        return load_default_model(device=args.device)
    manifest = load_manifest(args.model_manifest) if args.model_manifest else None
    return load_model(args.model_dir, manifest=manifest, device=args.device)


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))
