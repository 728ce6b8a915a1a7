"""Recipe for the golden v1 log: ``v1_log.sqlite`` (a ledger database as a deployment
before record v2 left it) and ``v1_bundle.json`` (a bundle exported from it).

Made once with the code of the last commit before record v2 (56368a4), never again:

    git worktree add /tmp/v1 56368a4
    cp tests/vectors/make_v1_golden.py /tmp/v1/tests/vectors/
    cd /tmp/v1 && PYTHONPATH=$PWD .venv/bin/python -m tests.vectors.make_v1_golden <out-dir>
    cp <out-dir>/v1_log.sqlite <out-dir>/v1_bundle.json <out-dir>/v1_log.json \\
       <this repository>/tests/vectors/

The log holds four ``audit-record/v1`` records (two tenants) and one
``audit-stream-start/v1``, sealed at size 5 and anchored locally; the signing key is the
fixed test-only seed of ``make_vectors`` (so ``v1_log.json`` can give the verifier key).
``tests/integration/test_record_continuity.py`` verifies the bundle and database as they
are, then appends v2 leaves to a copy of the database and checks the mixed log.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger.anchor.local import LocalAnchor
from ledger.checkpoint import NoteSigner
from ledger.client.exporter import export_from_log
from ledger.digest import commit_text
from ledger.record import build_record
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger

try:
    from ledger.record import build_stream_start  # since record v2
except ImportError:  # the commit the golden files were made at
    from ledger.stream_record import build_stream_start  # type: ignore[attr-defined,no-redef]

ORIGIN = "golden-v1.audit-ledger/log"
SEED = bytes(range(32))  # test only (make_vectors.SEED)
SALT = bytes(range(100, 132))  # test only: the salt of every commitment here
MODEL = {"name": "tiny-llama", "digest": "sha256:" + "ab" * 32, "pinned": True}
HARDWARE = {"accelerator": "none", "accelerator_model": None, "driver_version": None,
            "cpu_model": "golden", "cpu_count": 2, "schema": "hardware-fingerprint/v1"}
SOFTWARE = {"torch": {"version": "2.5.1", "git_version": "a" * 40},
            "service": {"git_revision": "b" * 40, "dirty": False},
            "schema": "software-fingerprint/v1"}
PROMPTS = [("acme", "golden prompt one", "golden output one"),
           ("acme", "golden prompt two", "golden output two"),
           ("globex", "golden prompt three", "golden output three"),
           ("globex", "golden prompt four", "golden output four")]


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{out / 'v1_log.sqlite'}"
    upgrade(url)
    signer = NoteSigner(ORIGIN, Ed25519PrivateKey.from_private_bytes(SEED))
    verifier = signer.verifier()
    records = []
    with SqlLedger(url).start() as ledger:
        ledger.create_log_meta(ORIGIN, verifier.encode())
        for tenant, prompt, output in PROMPTS:
            record = build_record(
                tenant=tenant, model=MODEL, hardware=HARDWARE, software=SOFTWARE,
                data={"input_commitment": commit_text(SALT, prompt),
                      "output_commitment": commit_text(SALT, output),
                      "input_token_count": len(prompt), "finish_reason": "stop"},
                timings_ms={"forward": 1.5})
            ledger.append(record)
            records.append({"record_id": record.record_id, "tenant": tenant,
                            "prompt": prompt, "output": output})
        start = build_stream_start(tenant="acme", model=MODEL, hardware=HARDWARE,
                                   software=SOFTWARE,
                                   input_commitment=commit_text(SALT, "streamed"),
                                   input_bytes=8, generation={"max_new_tokens": 4},
                                   route="/v1/completions")
        ledger.append(start)
        ledger.seal_checkpoint(signer, ORIGIN)
        LocalAnchor(ledger, verifier, ORIGIN).anchor(ledger.latest_checkpoint().note)
    with SqlLedger(url) as ledger:
        bundle = export_from_log(ledger, None, None, {}, log_key=verifier.encode())
    (out / "v1_bundle.json").write_text(bundle.dumps())
    (out / "v1_log.json").write_text(json.dumps({
        "origin": ORIGIN, "verifier_key": verifier.encode(), "salt": SALT.hex(),
        "size": 5, "records": records, "stream_start_record_id": start.record_id},
        indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
