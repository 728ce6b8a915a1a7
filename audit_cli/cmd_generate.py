"""Run one audited generate call and print the output and its leaves.

Without a log there is still no v1 record (decision 0043): the call is sealed as an
``audit-record/v2`` leaf of a two-leaf local log under ``--origin`` (leaf 0 the engine's
``environment/v1`` leaf, leaf 1 the record), printed as a bundle carries them: each
envelope and body in base64, the record naming its environment by index.
"""

from __future__ import annotations

import argparse
import base64
import json

from audit_cli.extras import require_extra
from audit_cli.options import add_model_options, load_from_options, print_json

LOCAL_ORIGIN = "audit-ledger.local/generate"


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="the prompt text")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--tenant", default="local", help="the record's tenant")
    parser.add_argument("--origin", default=LOCAL_ORIGIN,
                        help="the origin the record's tenant tag is made for "
                             f"(default {LOCAL_ORIGIN})")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    add_model_options(parser)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def run(args: argparse.Namespace) -> int:
    require_extra("serve", "torch", "transformers")  # before anything imports them
    from inference_wrapper.audit.generator import AuditedGenerator, LogBinding, recorded
    from inference_wrapper.engine.params import GenerationParams
    from ledger.leaves.envelope import Leaf
    from ledger.leaves.record_v2 import EnvironmentRef

    generator = AuditedGenerator(load_from_options(args))
    prompt = args.prompt
    if args.chat:
        prompt = generator.loaded.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
    params = GenerationParams(args.max_new_tokens, args.temperature, args.top_p, args.seed)
    environment = generator.environment_leaf()
    log = LogBinding(args.origin)
    log.bind(generator.environment(), EnvironmentRef(0, environment.leaf_hash))
    prepared = generator.prepare(prompt, params, args.tenant)
    (result,) = recorded(generator.seal(generator.run_batch([prepared]), log))
    record = result.record
    assert isinstance(record, Leaf)  # sealed for a log: a v2 leaf
    report = {
        "output": result.text,
        "input_salt": _b64(result.input_salt),
        "output_salt": _b64(result.output_salt),
        "origin": args.origin,
        "leaf_hash": record.leaf_hash.hex(),
        "record": dict(result.record_content),
        "environment": dict(environment.content),
        # As a bundle carries them (ledger/bundle.py), without proofs: no log signed them.
        "entry": {"record_id": record.record_id, "leaf_index": 1,
                  "canonical": _b64(record.canonical), "body": _b64(record.body),
                  "environment_index": 0},
        "environments": {"0": {"envelope": _b64(environment.envelope),
                               "body": _b64(environment.body),
                               "leaf_hash": environment.leaf_hash.hex()}},
    }
    if args.json:
        print_json(report)
    else:
        print(f"output: {result.text}\n")
        print(f"record ({record.record_id}, leaf hash {record.leaf_hash.hex()}, "
              f"origin {args.origin}):")
        print(json.dumps(report["record"], indent=2, sort_keys=True))
        print(f"\nenvironment (leaf 0, leaf hash {environment.leaf_hash.hex()}):")
        print(json.dumps(report["environment"], indent=2, sort_keys=True))
        print(f"\ninput salt {report['input_salt']}\noutput salt {report['output_salt']}")
    return 0
