"""The API searches as the console does (decision 0047): parts of names, three orders,
cursors both ways, the total, and pick-lists a key may see. The auditor's own console
asks exactly this of the operator, so it is tested here on its own, over real HTTP."""

from __future__ import annotations

from typing import Any

from inference_wrapper.server.app import KEYS
from tests.console.conftest import Console
from tests.console.test_console_search import add_named


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def records(c: Console, token: str, **query: str) -> Any:
    response = await c.client.get("/v1/records", params=query, headers=bearer(token))
    assert response.status == 200, await response.text()
    return await response.json()


async def test_parts_of_names_newest_first_with_total_and_both_cursors(console: Console) -> None:
    c = console
    await add_named(c)
    auditor = c.tokens["auditor"]
    # "3 8b" is a part of two names, in any case; "_" is a character, not a wildcard.
    first = await records(c, auditor, model_name="3 8b", match="part", order="-time",
                          limit="1", total="true")
    assert first["total"] == 2 and first["previous_cursor"] is None
    assert [r["model_name"] for r in first["records"]] == ["LlamaX3 8B"]  # the newer
    second = await records(c, auditor, model_name="3 8b", match="part", order="-time",
                           limit="1", cursor=first["next_cursor"])
    assert [r["model_name"] for r in second["records"]] == ["Llama_3 8B"]
    assert second["next_cursor"] is None and "total" not in second
    back = await records(c, auditor, model_name="3 8b", match="part", order="-time",
                         limit="1", cursor=second["previous_cursor"])
    assert [r["record_id"] for r in back["records"]] == [
        r["record_id"] for r in first["records"]]
    assert (await records(c, auditor, model_name="lama_3", match="part",
                          total="true"))["total"] == 1
    # Without match=part a filter is the whole name, as the API always answered.
    assert (await records(c, auditor, model_name="Llama", total="true"))["total"] == 0
    assert (await records(c, auditor, model_name="Llama_3 8B", total="true"))["total"] == 1


async def test_oldest_first_is_newest_first_reversed(console: Console) -> None:
    c = console
    await add_named(c)
    auditor = c.tokens["auditor"]
    newest = await records(c, auditor, order="-time", limit="100")
    oldest = await records(c, auditor, order="time", limit="100")
    stamps = [r["created_at"] for r in oldest["records"]]
    assert stamps == sorted(stamps) and len(stamps) == 12
    assert [r["record_id"] for r in newest["records"]] == [
        r["record_id"] for r in reversed(oldest["records"])]


async def test_known_values_and_search_stay_within_the_keys_tenant(console: Console) -> None:
    c = console
    await add_named(c)  # bank-a's named models
    bank_b, _ = c.app[KEYS].create("bank-b", "client")
    auditor = await (await c.client.get("/v1/known-values",
                                        headers=bearer(c.tokens["auditor"]))).json()
    assert {"Llama_3 8B", "Mistral 7B", "tiny"} <= set(auditor["model_name"])
    response = await c.client.get("/v1/known-values", headers=bearer(bank_b))
    assert response.status == 200
    assert (await response.json())["model_name"] == ["tiny"]
    # A part of bank-a's name finds nothing for bank-b, and naming bank-a is refused.
    assert (await records(c, bank_b, model_name="3 8B", match="part",
                          total="true"))["total"] == 0
    refused = await c.client.get("/v1/records", params={"tenant": "bank-a", "match": "part"},
                                 headers=bearer(bank_b))
    assert refused.status == 403 and (await refused.json())["field"] == "tenant"
    unsigned = await c.client.get("/v1/known-values")
    assert unsigned.status == 401
