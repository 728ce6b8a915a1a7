"""The leaf ``report-record/v1``: an evidence pack's own digest, appended to the log.

``audit-ledger report`` appends one after writing ``report.html``, so the report itself
can be verified later like any record (``audit-ledger verify <record id> --db ...``): its
digest, the range and tenant it covers, and who made it. Pure: bodies in, bodies out;
``ledger.record.LEAF_KINDS`` lists the validator.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ledger.errors import CanonicalFormError

REPORT_SCHEMA = "report-record/v1"
REPORT_KEYS = frozenset(("digest", "from", "to", "scope_tenant", "made_by", "file"))
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# The log's tenant of a report leaf: reports span tenants, so they get one of their own.
REPORT_TENANT = "_reports"


def validate_report(body: Mapping[str, Any]) -> None:
    """Shape of a ``report-record/v1`` leaf."""
    expected = {"schema", "record_id", "created_at", "tenant", "report"}
    if set(body) != expected:
        raise CanonicalFormError(f"must have exactly the keys {sorted(expected)}",
                                 field="record")
    report = body["report"]
    if not isinstance(report, Mapping) or set(report) != REPORT_KEYS:
        raise CanonicalFormError(f"must have exactly the keys {sorted(REPORT_KEYS)}",
                                 field="record.report")
    if not isinstance(report["digest"], str) or not _DIGEST.fullmatch(report["digest"]):
        raise CanonicalFormError("must be sha256: and 64 lowercase hex digits",
                                 field="record.report.digest")
    for key in ("from", "to", "made_by", "file"):
        value = report[key]
        if not isinstance(value, str) or not value or len(value) > 256:
            raise CanonicalFormError("must be a string of 1 to 256 characters",
                                     field=f"record.report.{key}")
    scope = report["scope_tenant"]
    if scope is not None and (not isinstance(scope, str) or not scope or len(scope) > 128):
        raise CanonicalFormError("must be null (all tenants) or a tenant name",
                                 field="record.report.scope_tenant")


def report_body(*, leaf_id: str, created_at: str, digest: str, since: str, until: str,
                scope_tenant: str | None, made_by: str,
                file: str = "report.html") -> dict[str, Any]:
    """The body of a report leaf (``since``/``until`` as RFC 3339 UTC text)."""
    body: dict[str, Any] = {
        "schema": REPORT_SCHEMA, "record_id": leaf_id, "created_at": created_at,
        "tenant": REPORT_TENANT,
        "report": {"digest": digest, "from": since, "to": until,
                   "scope_tenant": scope_tenant, "made_by": made_by, "file": file},
    }
    validate_report(body)
    return body
