"""A tenant that can hold a key can be written into every leaf kind: keys are refused at
creation for names the leaves' ``tenant`` rule refuses (a no-break space, a tab), which
before were accepted and then failed streaming, erasure and expiry for that tenant; and a
key cannot name the tenant the service keeps for its own leaves (``_reports``), while
any other name beginning with '_' can still get one (a tenant already holding records
must be able to replace a leaked key)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.errors import CanonicalFormError, InvalidInputError
from ledger.leaves import fields
from ledger.report_record import REPORT_TENANT
from ledger.store.apikeys import ApiKeyStore
from ledger.store.migrate import upgrade
from ledger.store.sql import make_engine


@pytest.fixture()
def keys(tmp_path: Path) -> ApiKeyStore:
    url = f"sqlite:///{tmp_path / 'keys.db'}"
    upgrade(url)
    return ApiKeyStore(make_engine(url))


@pytest.mark.parametrize("tenant", ["Acme\u00a0Bank", "tab\there", "new\nline", "zero\u200bwidth",
                                    "\x00", "", "x" * 129, REPORT_TENANT])
def test_a_key_for_a_tenant_no_leaf_may_hold_is_refused(keys: ApiKeyStore, tenant: str) -> None:
    with pytest.raises(InvalidInputError) as refused:
        keys.create(tenant, "client")
    assert refused.value.field == "tenant"


@pytest.mark.parametrize("tenant", ["bank-a", "Crédit Agricole", "银行", "Zürich 😀",
                                    'quote"d', "back\\slash", "x" * 128, "a_b", "_ops"])
def test_a_key_for_a_printable_tenant_is_made(keys: ApiKeyStore, tenant: str) -> None:
    _, key = keys.create(tenant, "client")
    assert key.tenant == tenant


def _leaf_rule_accepts(tenant: str) -> bool:
    try:
        fields.text(tenant, "record.tenant", fields.MAX_TENANT_CHARS)
    except CanonicalFormError:
        return False
    return True


def test_the_key_rule_is_the_leaf_rule_for_every_character_of_the_bmp() -> None:
    for point in list(range(0x10000)) + [0x1F600, 0xE0001, 0x10FFFF]:
        if 0xD800 <= point <= 0xDFFF:
            continue
        tenant = "t" + chr(point)
        try:
            fields.check_tenant_name(tenant, new_key=True)
            accepted = True
        except InvalidInputError:
            accepted = False
        assert accepted is _leaf_rule_accepts(tenant), hex(point)
