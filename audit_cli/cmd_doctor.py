"""Print this machine's hardware and software fingerprints."""

from __future__ import annotations

import argparse

from audit_cli.extras import require_extra
from audit_cli.options import print_json


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--torch-threads", type=int, default=1)


def run(args: argparse.Namespace) -> int:
    require_extra("serve", "torch", "transformers")  # before anything imports them
    from inference_wrapper.engine.fingerprint.hardware import capture_hardware
    from inference_wrapper.engine.fingerprint.software import (
        dependencies_digest,
        framework_info,
        python_info,
        service_revision,
        set_torch_threads,
    )

    set_torch_threads(args.torch_threads)
    report = {
        "hardware": capture_hardware().to_dict(),
        "software": {
            "python": python_info(),
            **framework_info(),
            "service": service_revision(),
            "dependencies_digest": dependencies_digest(),
        },
    }
    if args.json:
        print_json(report)
        return 0
    for section, values in report.items():
        print(f"[{section}]")
        for key, value in values.items():
            print(f"  {key:22} {value}")
    return 0
