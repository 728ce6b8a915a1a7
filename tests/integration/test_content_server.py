"""The retention routes in process (aiohttp on loopback, tiny model, SQLite): policy
administration, input errors naming the field, and no output when content that the
policy keeps cannot be stored."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from inference_wrapper.server.app import KEYS, LEDGER, VAULT, create_app
from inference_wrapper.server.settings import Settings

MakeClient = Callable[..., Awaitable[Any]]


@pytest.fixture()
async def service(aiohttp_client: MakeClient, tmp_path: Path, tiny_generator: Any) -> Any:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'ledger.db'}",
                        log_key_path=tmp_path / "log.key", keyring_path=tmp_path / "keyring",
                        max_wait_ms=20.0, checkpoint_interval_s=0.1)
    app = create_app(settings, tiny_generator)
    client = await aiohttp_client(app)
    keys = app[KEYS]
    tokens = {"client": keys.create("bank-a", "client")[0],
              "admin": keys.create("bank-a", "admin")[0],
              "auditor": keys.create("audit-firm", "auditor")[0]}
    return client, app, tokens


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_admin_sets_its_tenant_policy_within_the_minimum(service: Any) -> None:
    client, app, tokens = service
    got = await client.get("/v1/admin/retention", headers=bearer(tokens["admin"]))
    assert (await got.json())["mode"] == "commitments"
    low = await client.put("/v1/admin/retention", json={"mode": "content", "days": 30},
                           headers=bearer(tokens["admin"]))
    assert low.status == 422 and (await low.json())["field"] == "days"
    bad = await client.put("/v1/admin/retention", json={"mode": "forever"},
                           headers=bearer(tokens["admin"]))
    assert bad.status == 422 and (await bad.json())["field"] == "mode"
    denied = await client.put("/v1/admin/retention", json={"mode": "content"},
                              headers=bearer(tokens["client"]))
    assert denied.status == 403
    ok = await client.put("/v1/admin/retention", json={"mode": "content", "days": 400},
                          headers=bearer(tokens["admin"]))
    assert await ok.json() == {"tenant": "bank-a", "mode": "content", "days": 400,
                               "explicit": True}
    assert app[VAULT].policy("bank-a").days == 400


async def test_erasure_route_names_the_bad_field(service: Any) -> None:
    client, _, tokens = service
    for body, field in (({"subject": "a", "record_ids": ["r"]}, "subject"),
                        ({}, "subject"), ({"record_ids": []}, "record_ids"),
                        ({"record_ids": [7]}, "record_ids"), ({"subject": ""}, "subject"),
                        ({"subject": "a", "extra": 1}, "extra")):
        response = await client.post("/v1/admin/erasures", json=body,
                                     headers=bearer(tokens["admin"]))
        assert response.status == 422, body
        assert (await response.json())["field"] == field
    missing = await client.post("/v1/admin/erasures", json={"record_ids": ["no-such"]},
                                headers=bearer(tokens["admin"]))
    assert missing.status == 404


async def test_subject_must_be_short_text(service: Any) -> None:
    client, _, tokens = service
    response = await client.post("/v1/generate", json={"prompt": "hi", "subject": "x" * 300},
                                 headers=bearer(tokens["client"]))
    assert response.status == 422 and (await response.json())["field"] == "subject"


async def test_no_output_when_the_vault_cannot_keep_the_content(service: Any) -> None:
    client, app, tokens = service
    app[VAULT].set_policy("bank-a", "content", 183)
    first = await client.post("/v1/generate", json={"prompt": "kept", "max_new_tokens": 2},
                              headers=bearer(tokens["client"]))
    assert first.status == 200
    with app[LEDGER].engine.begin() as conn:  # the vault breaks for real
        conn.execute(text("DROP TABLE vault_content"))
    size = app[LEDGER].tree_head()[0]
    response = await client.post("/v1/generate", json={"prompt": "lost", "max_new_tokens": 2},
                                 headers=bearer(tokens["client"]))
    problem = await response.json()
    assert response.status == 503 and "output" not in problem
    assert "content vault could not keep its content" in problem["detail"]
    assert "vault_content" not in problem["detail"]  # no internal error text
    assert app[LEDGER].tree_head()[0] == size + 1  # the record itself is in the log


async def test_erasure_also_forgets_the_stored_idempotent_answer(service: Any) -> None:
    client, app, tokens = service
    app[VAULT].set_policy("bank-a", "content", 183)
    body = {"prompt": "secret prompt", "max_new_tokens": 2, "subject": "alice"}
    headers = {**bearer(tokens["client"]), "Idempotency-Key": "erase-me"}
    first = await (await client.post("/v1/generate", json=body, headers=headers)).json()
    erased = await client.post("/v1/admin/erasures", json={"subject": "alice"},
                               headers=bearer(tokens["admin"]))
    assert erased.status == 200 and first["record_id"] in (await erased.json())["records"]
    # The replay no longer hands back the erased answer and its salts: the key is free
    # again, so the same request is a new generate with a new record and new salts.
    again = await (await client.post("/v1/generate", json=body, headers=headers)).json()
    assert again["record_id"] != first["record_id"]
    assert again["input_salt"] != first["input_salt"]
