"""The v2 kinds beside the record (decision 0043): stream start, access, erasure and
report leaves. Their bytes are pinned by vectors; each opens as its kind and no other;
each refuses a member that is not in its table (a byte count, the fingerprints, a
subject, caller text where a number belongs), so nothing guessable can be added."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from ledger.canonical import canonical_bytes
from ledger.errors import CanonicalFormError, LeafBindingError
from ledger.leaves.content_leaves import (
    ACCESS_KIND,
    ERASURE_KIND,
    validate_access_v2,
    validate_erasure_v2,
)
from ledger.leaves.envelope import Leaf, tenant_tag
from ledger.leaves.kinds import NAMES_ENVIRONMENT, V2_KINDS, open_leaf
from ledger.leaves.report import REPORT_KIND, validate_report_v2
from ledger.leaves.stream_start import STREAM_START_KIND, validate_stream_start_v2
from ledger.report_record import REPORT_TENANT
from tests.vectors.make_kind_vectors import build

VECTORS = json.loads((Path(__file__).resolve().parents[1] / "vectors"
                      / "leaves_v2_kinds.json").read_text())
ORIGIN = VECTORS["inputs"]["origin"]


@pytest.fixture(scope="module")
def leaves() -> dict[str, Leaf]:
    return build(VECTORS["inputs"])


def test_every_kind_rebuilds_to_its_pinned_bytes(leaves: dict[str, Leaf]) -> None:
    for name, leaf in leaves.items():
        stored = VECTORS["leaves"][name]
        assert leaf.envelope.decode() == stored["envelope"], name
        assert leaf.body.decode() == stored["body"], name
        assert leaf.leaf_hash.hex() == stored["leaf_hash"], name


def test_the_service_writes_every_kind_as_v2() -> None:
    assert set(V2_KINDS) == {"audit-record/v2", "environment/v1", STREAM_START_KIND,
                             ACCESS_KIND, ERASURE_KIND, REPORT_KIND}
    assert NAMES_ENVIRONMENT == {"audit-record/v2", STREAM_START_KIND}


def test_each_leaf_opens_as_its_kind_tagged_for_its_tenant(leaves: dict[str, Leaf]) -> None:
    tenants = {"stream_start": "acme", "access": "acme", "erasure": "acme",
               "report": REPORT_TENANT}
    for name, leaf in leaves.items():
        opened = open_leaf(leaf.envelope, leaf.body, ORIGIN, strict=True)
        assert opened.kind == leaf.kind and opened.content == leaf.content
        assert json.loads(leaf.envelope)["tenant_tag"] == tenant_tag(ORIGIN, tenants[name])
        # In another log the same bytes carry the wrong tag.
        with pytest.raises(LeafBindingError, match="tenant tag"):
            open_leaf(leaf.envelope, leaf.body, "another.example/log")


def test_a_body_of_one_kind_never_opens_under_another_kinds_envelope(
        leaves: dict[str, Leaf]) -> None:
    access, erasure = leaves["access"], leaves["erasure"]
    with pytest.raises(LeafBindingError, match="the body hashes to"):
        open_leaf(access.envelope, erasure.body, ORIGIN)
    swapped = access.envelope.replace(ACCESS_KIND.encode(), ERASURE_KIND.encode())
    with pytest.raises(LeafBindingError, match="the envelope's kind is erasure-record/v2"):
        open_leaf(swapped, access.body, ORIGIN)


def _refused(validate: Any, body: dict[str, Any], field: str) -> None:
    with pytest.raises(CanonicalFormError) as caught:
        validate(body)
    assert caught.value.field == field, caught.value


def test_a_stream_start_refuses_v1s_byte_count_fingerprints_and_text_parameters(
        leaves: dict[str, Leaf]) -> None:
    body = dict(leaves["stream_start"].content)
    with_bytes = copy.deepcopy(body)
    with_bytes["data"]["input_bytes"] = 14  # v1 had it: a byte count of the prompt
    _refused(validate_stream_start_v2, with_bytes, "stream_start.data")
    _refused(validate_stream_start_v2, {**body, "hardware": {}}, "stream_start")
    digest = copy.deepcopy(body)
    digest["commitments"]["input_ids_digest"] = "sha256:" + "0" * 64
    _refused(validate_stream_start_v2, digest, "stream_start.commitments")
    plain = copy.deepcopy(body)
    plain["commitments"]["input"] = "sha256:" + "0" * 64  # a digest, not an HMAC
    _refused(validate_stream_start_v2, plain, "stream_start.commitments.input")
    text = copy.deepcopy(body)
    text["data"]["generation"]["stop"] = "my PIN is"  # caller text where numbers belong
    _refused(validate_stream_start_v2, text, "stream_start.data.generation")
    route = copy.deepcopy(body)
    route["data"]["route"] = "/v1/completions?prompt=my+PIN"
    _refused(validate_stream_start_v2, route, "stream_start.data.route")
    no_input = copy.deepcopy(body)
    del no_input["commitments"]["input"]
    _refused(validate_stream_start_v2, no_input, "stream_start.commitments")


def test_access_erasure_and_report_refuse_members_outside_their_tables(
        leaves: dict[str, Leaf]) -> None:
    access = copy.deepcopy(dict(leaves["access"].content))
    access["access"]["subject"] = "alice"
    _refused(validate_access_v2, access, "access.access")
    access = copy.deepcopy(dict(leaves["access"].content))
    access["access"]["purpose"] = "line one\nline two"
    _refused(validate_access_v2, access, "access.access.purpose")
    erasure = copy.deepcopy(dict(leaves["erasure"].content))
    erasure["erasure"]["subject_hash"] = "sha256:" + "0" * 64
    _refused(validate_erasure_v2, erasure, "erasure.erasure")
    erasure = copy.deepcopy(dict(leaves["erasure"].content))
    erasure["erasure"]["records"] = list(reversed(erasure["erasure"]["records"]))
    _refused(validate_erasure_v2, erasure, "erasure.erasure.records")
    erasure = copy.deepcopy(dict(leaves["erasure"].content))
    erasure["erasure"]["reason"] = "cancelled"  # without naming what it cancels
    _refused(validate_erasure_v2, erasure, "erasure.erasure.cancels")
    report = copy.deepcopy(dict(leaves["report"].content))
    report["tenant"] = "acme"
    _refused(validate_report_v2, report, "report.tenant")
    report = copy.deepcopy(dict(leaves["report"].content))
    report["report"]["from"] = "yesterday"
    _refused(validate_report_v2, report, "report.report.from")


# Not times: a month 13, hour 99 (the right form, no such instant); digits of another
# script, which a str pattern's \d would take (Arabic-Indic 2026).
IMPOSSIBLE = "2026-13-45T99:99:99.999Z"
OTHER_DIGITS = "\u0662\u0660\u0662\u0666-12-02T00:00:00.000Z"


@pytest.mark.parametrize("time", [IMPOSSIBLE, OTHER_DIGITS, "2026-02-29T00:00:00.000Z",
                                  "2026-12-02T23:59:60.000Z"])
def test_a_leaf_time_is_a_real_instant_in_ascii_digits(time: str) -> None:
    from ledger.leaves.envelope import envelope_bytes, envelope_members, is_timestamp
    from ledger.leaves.report import build_report

    assert not is_timestamp(time)
    assert is_timestamp("2028-02-29T23:59:59.999Z")
    # The writer refuses it by the field, never with a UnicodeEncodeError.
    with pytest.raises(CanonicalFormError, match="envelope.created_at: must be RFC 3339"):
        envelope_bytes(REPORT_KIND, time, tenant_tag(ORIGIN, REPORT_TENANT), b"{}")
    report = {"origin": ORIGIN, "digest": "sha256:" + "0" * 64, "scope_tenant": None,
              "since": "2026-12-01T00:00:00.000Z", "until": "2026-12-02T00:00:00.000Z",
              "made_by": "cli:x", "file": "r.html",
              "leaf_id": "0192f0c0-0000-7000-8000-000000000009",
              "created_at": "2026-12-02T00:00:00.000Z"}
    with pytest.raises(CanonicalFormError, match="report.report.from: must be RFC 3339"):
        build_report(**{**report, "since": time})
    with pytest.raises(CanonicalFormError, match="report.created_at: must be RFC 3339"):
        build_report(**{**report, "created_at": time})
    # A log writer's leaf with that time in both envelope and body: the verifier refuses
    # it at the envelope (strict or not).
    content = json.loads(build_report(**report).body)
    content["created_at"] = content["report"]["from"] = time
    body = canonical_bytes(content)
    envelope = canonical_bytes(envelope_members(REPORT_KIND, time,
                                                tenant_tag(ORIGIN, REPORT_TENANT), body))
    for strict in (False, True):
        with pytest.raises(CanonicalFormError, match="envelope.created_at"):
            open_leaf(envelope, body, ORIGIN, strict=strict)
