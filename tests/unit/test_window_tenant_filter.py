"""The tenant-only fast path of a proved window reads v1 records as canonical JSON spells
them: raw UTF-8, so a tenant named outside ASCII is found, not declared another's."""

from __future__ import annotations

import pytest

from ledger.client.proved_window import LeafFilter
from ledger.errors import InvalidInputError
from tests.records import make_record

ORIGIN = "window.example/log"
TENANTS = ("bank-a", "Crédit Agricole", "银行", "Zürich 😀", 'quote"d', "tab\there",
           "back\\slash", "\u2028line")


@pytest.mark.parametrize("tenant", TENANTS)
def test_a_tenants_own_v1_records_are_kept_and_no_others(tenant: str) -> None:
    keep = LeafFilter({"tenant": tenant}, ORIGIN)
    for other in TENANTS:
        entry = make_record(1, tenant=other).canonical
        assert keep(0, entry) is (other == tenant), (tenant, other)


def test_a_tenant_that_is_not_unicode_text_is_refused_by_name() -> None:
    with pytest.raises(InvalidInputError) as refused:
        LeafFilter({"tenant": "bank\ud800"}, ORIGIN)
    assert refused.value.field == "tenant"
