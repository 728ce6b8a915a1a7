"""The ``report-record/v2`` body: an evidence pack's digest, appended by ``report``
(decision records 0020, 0043) so the report can be verified later like any record.

The digest is of the report's own file, which is made from disclosed facts only (counts,
times, fingerprints, SLOs): no prompt, output or subject is in it, so its plain SHA-256
lets whoever holds the file check it without any salt. The leaf belongs to the log's
reports tenant (``REPORT_TENANT``): reports may span tenants.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ledger.canonical import canonical_bytes
from ledger.errors import CanonicalFormError
from ledger.leaves import fields
from ledger.leaves.envelope import Leaf, is_timestamp, seal, tenant_tag
from ledger.report_record import REPORT_TENANT

REPORT_KIND = "report-record/v2"
REPORT_KEYS = frozenset(("digest", "from", "to", "scope_tenant", "made_by", "file"))
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}\Z")


def build_report(*, origin: str, digest: str, since: str, until: str,
                 scope_tenant: str | None, made_by: str, file: str, leaf_id: str,
                 created_at: str) -> Leaf:
    """A report's leaf (``since``/``until`` as RFC 3339 UTC text)."""
    content: dict[str, Any] = {
        "schema": REPORT_KIND, "record_id": leaf_id, "created_at": created_at,
        "tenant": REPORT_TENANT,
        "report": {"digest": digest, "from": since, "to": until,
                   "scope_tenant": scope_tenant, "made_by": made_by, "file": file},
    }
    validate_report_v2(content)
    return seal(REPORT_KIND, content, canonical_bytes(content),
                tenant_tag(origin, REPORT_TENANT))


def validate_report_v2(body: Mapping[str, Any]) -> None:
    """A ``report-record/v2`` body's rules."""
    fields.exact_members(body, frozenset(("schema", "record_id", "created_at", "tenant",
                                          "report")), "report")
    fields.common_members(body, REPORT_KIND, "report")
    if body["tenant"] != REPORT_TENANT:
        raise CanonicalFormError(f"must be {REPORT_TENANT!r}", field="report.tenant")
    report = fields.exact_members(body["report"], REPORT_KEYS, "report.report")
    if not isinstance(report["digest"], str) or not _DIGEST.match(report["digest"]):
        raise CanonicalFormError("must be 'sha256:<64 hex>'", field="report.report.digest")
    for key in ("from", "to"):
        if not is_timestamp(report[key]):
            raise CanonicalFormError("must be RFC 3339 UTC with milliseconds",
                                     field=f"report.report.{key}")
    fields.text(report["made_by"], "report.report.made_by", 256)
    fields.text(report["file"], "report.report.file", 256)
    scope = report["scope_tenant"]
    if scope is not None:
        fields.text(scope, "report.report.scope_tenant", 128)
