"""The endpoint over real HTTP on loopback, with the tiny model and a SQLite ledger."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

from inference_wrapper.server.app import (
    GENERATOR,
    INTEGRATOR,
    KEYS,
    LEDGER,
    SETTINGS,
    SIGNER,
    create_app,
)
from inference_wrapper.server.route_table import ROUTES, openapi_document
from inference_wrapper.server.settings import Settings
from ledger import merkle
from ledger.checkpoint import NoteVerifier
from ledger.errors import BackendUnavailableError
from ledger.leaves import commitments

Client = TestClient  # type: ignore[type-arg]
MakeClient = Callable[..., Awaitable[Any]]


@pytest.fixture()
def settings(tmp_path: Path) -> Settings:
    return Settings(database_url=f"sqlite:///{tmp_path / 'ledger.db'}",
                    log_key_path=tmp_path / "log.key", max_wait_ms=20.0,
                    checkpoint_interval_s=0.1)


@pytest.fixture()
async def service(aiohttp_client: MakeClient, settings: Settings, tiny_generator: Any) -> Any:
    app = create_app(settings, tiny_generator)
    client = await aiohttp_client(app)
    keys = app[KEYS]
    tokens = {
        "a": keys.create("bank-a", "client")[0],
        "b": keys.create("bank-b", "client")[0],
        "auditor": keys.create("audit-firm", "auditor")[0],
    }
    return client, tokens


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def generate(client: Any, token: str, **body: Any) -> Any:
    return await client.post("/v1/generate", json={"prompt": "Hello ledger", **body},
                             headers=bearer(token))


async def test_generate_answers_with_a_receipt_that_opens_its_record(service: Any) -> None:
    client, tokens = service
    response = await generate(client, tokens["a"], max_new_tokens=8)
    assert response.status == 200
    answer = await response.json()
    assert response.headers["X-Audit-Record-Id"] == answer["record_id"]
    assert response.headers["X-Audit-Leaf-Index"] == str(answer["leaf_index"])
    record = await (await client.get(f"/v1/records/{answer['record_id']}",
                                     headers=bearer(tokens["a"]))).json()
    import base64

    envelope = base64.b64decode(record["canonical_base64"])
    assert merkle.hash_leaf(envelope).hex() == answer["leaf_hash"]
    body = base64.b64decode(record["body_base64"])
    assert json.loads(envelope)["body"] == "sha256:" + hashlib.sha256(body).hexdigest()
    held = record["record"]["commitments"]
    assert commitments.opens(held["input"], bytes.fromhex(answer["input_salt"]), "input",
                             b"Hello ledger")
    assert commitments.opens(held["output"], bytes.fromhex(answer["output_salt"]), "output",
                             answer["output"].encode())
    assert record["tenant"] == "bank-a" and record["record"]["schema"] == "audit-record/v2"
    # The environment leaf it names comes with it (leaf 0: written when the engine started).
    assert record["environment"]["leaf_index"] == record["record"]["environment"]["leaf_index"]
    assert record["environment"]["record"]["model"]["name"] == "tiny-llama"
    assert record["model_name"] == "tiny-llama"  # the mirror's column, through it

    proof = await (await client.get(f"/v1/records/{answer['record_id']}/proof",
                                     headers=bearer(tokens["a"]))).json()
    key = await (await client.get("/v1/log/public-key", headers=bearer(tokens["a"]))).json()
    checkpoint = NoteVerifier.decode(key["verifier_key"]).open_checkpoint(
        proof["checkpoint"].encode())
    merkle.verify_inclusion(bytes.fromhex(answer["leaf_hash"]), answer["leaf_index"],
                            checkpoint.size, [bytes.fromhex(h) for h in proof["inclusion_proof"]],
                            checkpoint.root)


async def test_no_key_is_401(service: Any) -> None:
    client, _ = service
    response = await client.post("/v1/generate", json={"prompt": "x"})
    assert response.status == 401
    assert response.content_type == "application/problem+json"
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


async def test_unknown_key_is_401(service: Any) -> None:
    client, _ = service
    response = await generate(client, "alk_0000000000000000_nope")
    assert response.status == 401
    assert "unknown or revoked" in (await response.json())["detail"]


async def test_revoked_key_is_401(service: Any) -> None:
    client, _ = service
    keys = client.server.app[KEYS]
    token, key = keys.create("bank-c", "client")
    keys.revoke(key.key_id)
    assert (await generate(client, token)).status == 401


async def test_auditor_cannot_generate_403(service: Any) -> None:
    client, tokens = service
    response = await generate(client, tokens["auditor"])
    assert response.status == 403
    assert "auditor" in (await response.json())["detail"]


async def test_client_cannot_see_another_tenants_record_404(service: Any) -> None:
    client, tokens = service
    answer = await (await generate(client, tokens["a"], max_new_tokens=2)).json()
    other = await client.get(f"/v1/records/{answer['record_id']}", headers=bearer(tokens["b"]))
    missing = await client.get("/v1/records/no-such-id", headers=bearer(tokens["b"]))
    assert other.status == missing.status == 404
    assert (await other.json())["detail"] == f"no record {answer['record_id']!r}"
    assert (await client.get(f"/v1/records/{answer['record_id']}/proof",
                             headers=bearer(tokens["b"]))).status == 404
    seen = await client.get(f"/v1/records/{answer['record_id']}", headers=bearer(tokens["auditor"]))
    assert seen.status == 200
    listing = await (await client.get("/v1/records", headers=bearer(tokens["b"]))).json()
    assert listing["records"] == []
    forbidden = await client.get("/v1/records?tenant=bank-a", headers=bearer(tokens["b"]))
    assert forbidden.status == 403


BAD_INPUTS = [
    ("invalid JSON", b'{"prompt": ', 400, "body", "not valid JSON"),
    ("not an object", b'["prompt"]', 400, "body", "must be a JSON object"),
    ("invalid UTF-8", b'{"prompt": "caf\xe9"}', 400, "body", "not valid UTF-8"),
    ("NaN literal", b'{"prompt": "x", "temperature": NaN}', 400, "body", "NaN"),
    ("duplicate key", b'{"prompt": "x", "prompt": "y"}', 400, "prompt", "duplicate"),
    ("wrong type", b'{"prompt": 42}', 422, "prompt", "must be a string"),
    ("wrong number type", b'{"prompt": "x", "max_new_tokens": "8"}', 422, "max_new_tokens",
     "must be an integer"),
    ("boolean as number", b'{"prompt": "x", "top_p": true}', 422, "top_p", "boolean"),
    ("unknown field", b'{"prompt": "x", "colour": "red"}', 422, "colour", "unknown field"),
    ("missing prompt", b'{"max_new_tokens": 3}', 422, "prompt", "is required"),
    ("empty prompt", b'{"prompt": ""}', 422, "prompt", "must not be empty"),
    ("oversize prompt", json.dumps({"prompt": "x" * 20000}).encode(), 422, "prompt",
     "at most 16384"),
    ("negative tokens", b'{"prompt": "x", "max_new_tokens": -1}', 422, "max_new_tokens",
     "between 1 and 512"),
    ("too many tokens", b'{"prompt": "x", "max_new_tokens": 100000}', 422, "max_new_tokens",
     "between 1 and 512"),
    ("temperature out of range", b'{"prompt": "x", "temperature": 7.5}', 422, "temperature",
     "between"),
    ("top_p zero", b'{"prompt": "x", "top_p": 0}', 422, "top_p", "greater than 0"),
    ("negative seed", b'{"prompt": "x", "seed": -1}', 422, "seed", "between"),
    ("oversize body", json.dumps({"prompt": "x" * 70000}).encode(), 413, "body", ""),
]


@pytest.mark.parametrize(("case", "raw", "status", "field", "detail"), BAD_INPUTS,
                         ids=[c[0] for c in BAD_INPUTS])
async def test_bad_input_gets_its_4xx_naming_the_field_and_writes_nothing(
    service: Any, case: str, raw: bytes, status: int, field: str, detail: str
) -> None:
    client, tokens = service
    ledger = client.server.app[LEDGER]
    before = ledger.tree_head()[0]
    response = await client.post("/v1/generate", data=raw, headers={
        **bearer(tokens["a"]), "Content-Type": "application/json"})
    assert response.status == status, await response.text()
    assert response.content_type == "application/problem+json"
    problem = await response.json()
    assert problem["status"] == status and problem["field"] == field
    assert detail in problem["detail"]
    assert "output" not in problem
    assert ledger.tree_head()[0] == before


async def test_64_concurrent_requests_give_64_gap_free_records(service: Any) -> None:
    client, tokens = service
    prompts = [f"request {i} " + "x" * (i % 13) for i in range(64)]
    responses = await asyncio.gather(*(
        client.post("/v1/generate", json={"prompt": p, "max_new_tokens": 4},
                    headers=bearer(tokens["a"])) for p in prompts))
    answers = [await r.json() for r in responses]
    assert [r.status for r in responses] == [200] * 64
    assert sorted(a["leaf_index"] for a in answers) == list(range(1, 65))  # 0: environment
    batches: dict[str, list[dict[str, Any]]] = defaultdict(list)
    ledger = client.server.app[LEDGER]
    for answer in answers:
        row = ledger.get_record(answer["record_id"])
        assert row is not None
        body = json.loads(row.leaf_body)
        batch = body["batch"]
        batches[batch["id"]].append({**batch, "padded_length": body["data"]["shape"][1]})
    assert len(batches) < 64  # requests were batched
    for members in batches.values():
        assert sorted(m["row"] for m in members) == list(range(members[0]["size"]))
        assert all(m["padded_length"] % 8 == 0 for m in members)


async def test_failed_append_gives_5xx_and_no_output(service: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    client, tokens = service

    async def broken(records: Any) -> Any:
        raise BackendUnavailableError("database is down")

    monkeypatch.setattr(client.server.app[LEDGER], "append_many_async", broken)
    response = await generate(client, tokens["a"], max_new_tokens=2)
    assert response.status == 503
    body = await response.json()
    assert "output" not in body and "could not be committed" in body["detail"]


async def test_full_queue_answers_503_with_retry_after(
    aiohttp_client: MakeClient, settings: Settings, tiny_generator: Any
) -> None:
    from dataclasses import replace

    app = create_app(replace(settings, queue_limit=2, max_batch=1), tiny_generator)
    client = await aiohttp_client(app)
    token = app[KEYS].create("bank-a", "client")[0]
    responses = await asyncio.gather(*(
        client.post("/v1/generate", json={"prompt": f"p{i}", "max_new_tokens": 16},
                    headers=bearer(token)) for i in range(12)))
    statuses = [r.status for r in responses]
    assert 503 in statuses and 200 in statuses
    for response in responses:
        if response.status == 503:
            assert response.headers["Retry-After"] == "1"
    assert app[LEDGER].tree_head()[0] == 1 + statuses.count(200)  # and the environment leaf


async def test_openai_client_calls_both_routes(service: Any) -> None:
    from openai import AsyncOpenAI

    client, tokens = service
    base = str(client.make_url("/v1"))
    openai = AsyncOpenAI(base_url=base, api_key=tokens["a"], max_retries=0)
    model = (await openai.models.list()).data[0].id
    chat = await openai.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hi"}], max_tokens=6,
        temperature=0)
    completion = await openai.completions.create(model=model, prompt="Once upon", max_tokens=5,
                                                 temperature=0)
    await openai.close()
    for result in (chat, completion):
        audit = result.model_extra["audit"]  # type: ignore[index]
        record = await client.get(f"/v1/records/{audit['record_id']}", headers=bearer(tokens["a"]))
        assert record.status == 200
        assert (await record.json())["leaf_index"] == audit["leaf_index"]
    assert chat.choices[0].message.role == "assistant"
    assert isinstance(completion.choices[0].text, str)
    assert completion.usage is not None and completion.usage.completion_tokens <= 5


async def test_openai_unknown_model_404(service: Any) -> None:
    client, tokens = service
    response = await client.post("/v1/completions", json={"model": "gpt-9", "prompt": "x"},
                                 headers=bearer(tokens["a"]))
    assert response.status == 404
    assert (await response.json())["error"] == {
        "message": "model 'gpt-9' is not served here; this server serves 'tiny-llama'",
        "type": "invalid_request_error", "param": "model", "code": "model_not_found"}


async def test_checkpoints_and_consistency_routes(service: Any) -> None:
    client, tokens = service
    for _ in range(3):
        answer = await (await generate(client, tokens["a"], max_new_tokens=1)).json()
    app = client.server.app
    app[LEDGER].seal_checkpoint(app[SIGNER], app[SETTINGS].origin)
    latest = await (await client.get("/v1/checkpoints/latest", headers=bearer(tokens["a"]))).json()
    assert latest["tree_size"] == 4  # the environment leaf and three records
    proof = await client.get("/v1/checkpoints/consistency?from=1&to=3",
                             headers=bearer(tokens["a"]))
    assert proof.status == 200 and len((await proof.json())["proof"]) == 2
    bad = await client.get("/v1/checkpoints/consistency?from=5&to=4", headers=bearer(tokens["a"]))
    assert bad.status == 404 and (await bad.json())["field"] == "from"
    # A tree the log has not reached, or a checkpoint that does not exist, is not found
    # (404, naming the parameter): the request itself is well formed.
    ahead = await client.get("/v1/checkpoints/consistency?from=1&to=999",
                             headers=bearer(tokens["a"]))
    assert ahead.status == 404 and (await ahead.json())["field"] == "to"
    missing = await client.get(f"/v1/records/{answer['record_id']}/proof?tree_size=3",
                               headers=bearer(tokens["a"]))
    assert missing.status == 404 and (await missing.json())["field"] == "tree_size"


async def test_health_readiness_metrics(service: Any) -> None:
    client, tokens = service
    await generate(client, tokens["a"], max_new_tokens=2)
    assert (await client.get("/healthz")).status == 200
    app = client.server.app
    app[INTEGRATOR].seal_now()  # the only replica: it takes the lease and seals
    ready = await (await client.get("/readyz")).json()
    replica = ready.pop("replica")
    assert ready == {"ready": True, "checks": {"engine_serving": True, "ledger_reachable": True,
                                               "ledger_appending": True,
                                               "anchoring_within_slo": True,
                                               "anchor_configured": True,
                                               "worker:ledger-writer": True,
                                               "worker:batcher": True,
                                               "worker:integrator": True,
                                               "worker:anchor-worker": True}}
    assert replica["holds_lease"] is True and replica["id"] == app[INTEGRATOR].replica_id
    assert replica["latest_sealed_by"] == replica["id"]
    assert 0 <= replica["last_seal_age_s"] < 3600 and replica["origin"] == app[SETTINGS].origin
    text = await (await client.get("/metrics")).text()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    # Per-request phases and per-batch phases are separate series.
    for phase in ("parse", "queue_wait"):
        assert value("audit_request_phase_seconds_count", phase=phase) == 1
    for phase in ("tokenize", "forward", "decode", "append"):
        assert value("audit_batch_phase_seconds_count", phase=phase) == 1
    assert ("audit_request_phase_seconds_count", (("phase", "forward"),)) not in samples
    # End-to-end latency per route.
    assert value("audit_http_request_duration_seconds_count", route="/v1/generate",
                 method="POST") == 1
    assert value("audit_http_request_duration_seconds_count", route="/readyz",
                 method="GET") == 1
    age = value("audit_checkpoint_age_seconds")
    assert 0 <= age < 3600
    assert value("audit_requests_in_model") == 0
    assert value("process_cpu_seconds_total") > 0  # the process collector
    # CPU per named thread: the model thread has run a generate, the event loop served.
    threads = {dict(labels)["thread"]: v for (name, labels), v in samples.items()
               if name == "audit_thread_cpu_seconds_total"}
    if sys.platform == "linux":  # read from /proc; elsewhere the family is empty
        assert {"MainThread", "model_0", "audit_0", "ledger-writer"} <= set(threads)
        assert threads["MainThread"] > 0  # it imported torch and started the app
    for name in ("audit_batch_size_count", "audit_queue_depth",
                 "audit_checkpoint_lag_entries", "audit_anchor_lag_seconds",
                 "audit_anchor_backlog_checkpoints", "audit_last_seal_age_seconds"):
        assert (name, ()) in samples, name
    assert value("audit_lease_held", replica=replica["id"]) == 1
    assert value("audit_fenced_writer_sessions_total") == 0 == replica["fenced_writer_sessions"]
    assert value("audit_latest_checkpoint_sealed_by", replica=replica["id"]) == 1


async def test_openapi_matches_the_routes(service: Any) -> None:
    client, _ = service
    document = await (await client.get("/openapi.json")).json()
    generator = client.server.app[GENERATOR]
    assert document == openapi_document(generator.limits, generator.loaded.name)
    served = {(r.method, r.resource.canonical) for r in client.server.app.router.routes()
              if r.resource is not None and r.method != "HEAD"
              and not r.resource.canonical.startswith("/console")}  # HTML pages, not API
    documented = {(m.upper(), p) for p, ops in document["paths"].items() for m in ops}
    assert served == documented == {(r.method, r.path) for r in ROUTES}


async def test_drain_answers_queued_requests_and_commits_them(
    aiohttp_client: MakeClient, settings: Settings, tiny_generator: Any
) -> None:
    from inference_wrapper.audit.batcher import Batcher, ShuttingDownError
    from ledger.store.migrate import upgrade
    from ledger.store.sql import SqlLedger

    upgrade(settings.database_url)
    with SqlLedger(settings.database_url) as ledger:
        batcher = Batcher(tiny_generator, ledger, max_batch=4, max_wait_ms=1)
        batcher.start()
        jobs = [asyncio.ensure_future(batcher.submit(tiny_generator.prepare(f"p{i}")))
                for i in range(10)]
        await asyncio.sleep(0)
        await batcher.drain()
        answers = [job.result() for job in jobs]
        assert sorted(a.receipt.leaf_index for a in answers) == list(range(10))
        assert ledger.tree_head()[0] == 10
        with pytest.raises(ShuttingDownError):
            await batcher.submit(tiny_generator.prepare("late"))


async def test_retain_runs_only_for_batches_whose_tenants_may_keep_content(
    settings: Settings, tiny_generator: Any
) -> None:
    from inference_wrapper.audit.batcher import Batcher
    from ledger.store.migrate import upgrade
    from ledger.store.sql import SqlLedger

    upgrade(settings.database_url)
    retained: list[list[str]] = []
    asked: list[set[str]] = []

    def needed(tenants: Any) -> bool:
        asked.append(set(tenants))
        return "keeps" in asked[-1]

    with SqlLedger(settings.database_url) as ledger:
        batcher = Batcher(tiny_generator, ledger, max_batch=4, max_wait_ms=1,
                          retain=lambda durable: retained.append(
                              [r.tenant for r, _, _ in durable]),
                          retain_needed=needed)
        batcher.start()
        try:
            for tenant in ("commitments-only", "keeps"):
                answer = await batcher.submit(tiny_generator.prepare("p", tenant=tenant))
                assert answer.receipt.record_id == answer.output.record.record_id
        finally:
            await batcher.drain()
    assert asked == [{"commitments-only"}, {"keeps"}]
    assert retained == [["keeps"]]  # the first batch skipped the retain step


async def test_a_failing_retain_needed_retains_as_usual(
    settings: Settings, tiny_generator: Any
) -> None:
    from inference_wrapper.audit.batcher import Batcher
    from ledger.store.migrate import upgrade
    from ledger.store.sql import SqlLedger

    upgrade(settings.database_url)
    retained: list[str] = []

    def broken(tenants: Any) -> bool:
        raise RuntimeError("policy cache unavailable")

    with SqlLedger(settings.database_url) as ledger:
        batcher = Batcher(tiny_generator, ledger, max_batch=4, max_wait_ms=1,
                          retain=lambda durable: retained.extend(
                              o.record.record_id for _, o, _ in durable),
                          retain_needed=broken)
        batcher.start()
        try:
            answer = await batcher.submit(tiny_generator.prepare("p", tenant="bank-a"))
        finally:
            await batcher.drain()
    assert retained == [answer.receipt.record_id]  # unsure, so the content is kept


async def test_phase_spans_exported_when_enabled(
    aiohttp_client: MakeClient, settings: Settings, tiny_generator: Any
) -> None:
    from dataclasses import replace

    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from inference_wrapper.server.app import TRACER

    app = create_app(replace(settings, otel_exporter="console"), tiny_generator)
    memory = InMemorySpanExporter()
    app[TRACER].provider.add_span_processor(SimpleSpanProcessor(memory))
    client = await aiohttp_client(app)
    token = app[KEYS].create("bank-a", "client")[0]
    answer = await (await generate(client, token, max_new_tokens=2)).json()
    spans = {s.name: s for s in memory.get_finished_spans()}
    assert set(spans) >= {"parse", "queue_wait", "tokenize", "forward", "decode", "append",
                          "POST /v1/generate"}
    root = spans["POST /v1/generate"]
    assert root.attributes["audit.record_id"] == answer["record_id"]
    assert spans["forward"].parent.span_id == root.context.span_id
    assert spans["tokenize"].end_time <= spans["forward"].start_time
