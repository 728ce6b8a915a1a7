"""Run one audited generate call and print the output and its record."""

from __future__ import annotations

import argparse
import base64
import json

from audit_cli.extras import require_extra
from audit_cli.options import add_model_options, load_from_options, print_json


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="the prompt text")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    add_model_options(parser)


def run(args: argparse.Namespace) -> int:
    require_extra("serve", "torch", "transformers")  # before anything imports them
    from inference_wrapper.audit.generator import AuditedGenerator
    from inference_wrapper.engine.params import GenerationParams

    generator = AuditedGenerator(load_from_options(args))
    prompt = args.prompt
    if args.chat:
        prompt = generator.loaded.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
    params = GenerationParams(args.max_new_tokens, args.temperature, args.top_p, args.seed)
    result = generator.generate(prompt, params)
    report = {
        "output": result.text,
        "input_salt": base64.b64encode(result.input_salt).decode(),
        "output_salt": base64.b64encode(result.output_salt).decode(),
        "leaf_hash": result.record.leaf_hash.hex(),
        "record": json.loads(result.record.canonical),
    }
    if args.json:
        print_json(report)
    else:
        print(f"output: {result.text}\n")
        print(f"record ({result.record.record_id}, leaf hash {result.record.leaf_hash.hex()}):")
        print(json.dumps(report["record"], indent=2, sort_keys=True))
        print(f"\ninput salt {report['input_salt']}\noutput salt {report['output_salt']}")
    return 0
