"""A live ``audit-ledger serve`` with two witnesses configured gets its checkpoints
cosigned; the lines are served on the latest checkpoint, on proofs and in exports."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from ledger.client.exporter import export_from_log
from ledger.cosignature import WitnessKey, valid_cosigners
from ledger.store.sql import SqlLedger
from ledger.witness.state import load_or_create_cosigner
from tests.integration.witness_proc import WitnessProcess, free_port, start_witness
from tests.live_service import LiveService, start_service


def _call(service: LiveService, path: str, body: dict[str, Any] | None = None) -> Any:
    request = urllib.request.Request(
        f"{service.base_url}{path}", method="POST" if body is not None else "GET",
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {service.client_token}",
                 "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)


def test_live_service_gets_two_cosignatures(tmp_path: Path, tiny_model_dir: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # The witnesses' keys exist first (the service pins them); they start listening only
    # once the service has told us its log key: until then the client backs off.
    names = ["witness.test/w1", "witness.test/w2"]
    keys = [load_or_create_cosigner(tmp_path / f"w{i}" / "witness.key", name).witness_key
            for i, name in enumerate(names)]
    ports = [free_port() for _ in names]
    monkeypatch.setenv("AUDIT_LEDGER_WITNESSES", ",".join(
        f"http://127.0.0.1:{port}={key.encode()}" for port, key in zip(ports, keys,
                                                                      strict=True)))
    service = start_service(tmp_path / "svc", tiny_model_dir)
    witnesses: list[WitnessProcess] = []
    try:
        log_key = _call(service, "/v1/log/public-key")
        for i, name in enumerate(names):
            witnesses.append(start_witness(
                tmp_path / f"w{i}", [(log_key["origin"], log_key["verifier_key"])],
                name=name, port=ports[i]))
        assert [WitnessKey.decode(w.vkey) for w in witnesses] == keys
        receipts = [_call(service, "/v1/generate", {"prompt": f"witness me {i}",
                                                    "max_new_tokens": 4})
                    for i in range(3)]

        deadline, latest = time.monotonic() + 300, None
        while time.monotonic() < deadline:  # polled state, generous overall timeout
            try:
                latest = _call(service, "/v1/checkpoints/latest")
            except urllib.error.HTTPError as exc:  # 404 until the first seal
                assert exc.code == 404, exc
                time.sleep(0.2)
                continue
            if (latest["tree_size"] >= 3 and
                    len(valid_cosigners(latest["checkpoint"].encode(), keys)) == 2):
                break
            time.sleep(0.2)
        assert latest is not None
        note = latest["checkpoint"].encode()
        cosigners = valid_cosigners(note, keys)
        assert set(cosigners) == set(names), note.decode()
        assert all(t > 1_700_000_000 for t in cosigners.values())

        # The proof route's checkpoint carries the same lines (when it is that checkpoint).
        quoted = urllib.parse.quote(receipts[0]["record_id"], safe="")
        proof = _call(service, f"/v1/records/{quoted}/proof?tree_size={latest['tree_size']}")
        assert proof["checkpoint"] == latest["checkpoint"]

        # A bundle exported from the database carries them too (nothing was appended after
        # the third record, so no newer checkpoint exists).
        with SqlLedger(service.database_url) as ledger:
            bundle = export_from_log(ledger, None, None, {})
        assert bundle.checkpoint == note
    finally:
        service.stop()
        for witness in witnesses:
            witness.stop()
