"""schemathesis ``--checks all`` over every route of a live service for a time budget;
prints the requests per status class, the server errors (from the service's own
``audit_http_requests_total``) and the check failures (from schemathesis' JUnit report).

    PYTHONPATH=$PWD .venv/bin/python bench/schemathesis_soak.py --seconds 300

The service is the shipped CLI on the tiny model and a SQLite ledger, in its own process.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.live_service import start_service  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=300)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    from inference_wrapper.engine.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as scratch:
        home = Path(scratch)
        model_dir = home / "model" / "tiny-llama"
        build_tiny_model(model_dir)
        service = start_service(home / "svc", model_dir)
        junit = home / "junit.xml"
        try:
            run = subprocess.run(
                [str(Path(sys.executable).parent / "schemathesis"), "run",
                 f"{service.base_url}/openapi.json", "--checks", "all",
                 "-H", f"Authorization: Bearer {service.client_token}",
                 "--max-time", str(args.seconds), "--workers", str(args.workers),
                 "--continue-on-failure", "--request-timeout", "120",
                 "--report", "junit", "--report-junit-path", str(junit)],
                cwd=home, capture_output=True, text=True, timeout=args.seconds + 600)
            with urllib.request.urlopen(f"{service.base_url}/metrics", timeout=30) as page:
                metrics = page.read().decode()
        finally:
            service.stop()
        statuses: collections.Counter[str] = collections.Counter()
        for match in re.finditer(r'^audit_http_requests_total\{(.*?)\} (\S+)$', metrics,
                                 re.M):
            status = re.search(r'status="(\d+)"', match.group(1))
            if status:
                statuses[status.group(1)[0] + "xx"] += int(float(match.group(2)))
        failures: collections.Counter[str] = collections.Counter()
        details: list[str] = []
        cases = 0
        if junit.exists():
            for case in ET.parse(junit).getroot().iter("testcase"):
                cases += 1
                for failure in case.iter("failure"):
                    text = (failure.get("message") or "") + (failure.text or "")
                    details.append(f"{case.get('name')}: {text[:2500]}")
                    for code in re.findall(r"- (.+?)\n", text) or ["failure"]:
                        failures[code.strip()] += 1
    print("schemathesis tail:\n" + "\n".join(run.stdout.splitlines()[-25:]))
    for detail in details:
        print("FAILURE", detail)
    print(f"seconds={args.seconds} operations={cases} requests by class: "
          f"{dict(sorted(statuses.items()))}")
    print(f"server errors (5xx): {statuses.get('5xx', 0)}")
    print(f"check failures: {sum(failures.values())} {dict(failures)}")
    return 0 if not failures and not statuses.get("5xx") else 1


if __name__ == "__main__":
    raise SystemExit(main())
