"""Write a regulator's evidence pack: one self-contained HTML report over a time range.

The pack holds the scope, the log's identity and the pinned key, the checkpoints and
anchors of the range (each checkpoint's signature checked under the pinned key), the
completeness result of ``audit`` for the range, counts per model, tenant and accelerator,
records per minute and the fingerprint-change timeline. ``report.html.sha256`` beside it
names the report's digest, and ``bundle.json`` is the evidence bundle of the same scope
(``audit-ledger verify --bundle``). The report holds an SLO compliance section (targets
from the same ``AUDIT_LEDGER_SLO_*`` settings as the service, measured from the records'
own timings and the readiness history of the range). Last, the report's digest is
appended to the log as a ``report-record/v2`` leaf; its id is printed and written to
``report.record.json``, and once the service has sealed it, ``audit-ledger verify <id>
--db ...`` proves the report existed unchanged. Exit 0 when the audit is complete and
every checkpoint in range verifies, 1 otherwise (the report is written either way and
says what failed).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from html import escape
from pathlib import Path
from typing import Any

from audit_cli.evidence import add_key_option, pinned_verifier
from audit_cli.filters import parse_time
from audit_cli.options import print_json
from audit_cli.report_pack import MANIFEST, write_manifest
from ledger.content_records import ERASURE_SCHEMA
from ledger.errors import BackendError, InvalidInputError, LedgerError
from ledger.leaves.content_leaves import ERASURE_KIND
from ledger.leaves.record_v2 import RECORD_KIND
from ledger.record import RECORD_SCHEMA

COUNTED = (("model", "model"), ("tenant", "tenant"), ("accelerator", "accelerator"))


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", required=True, help="ledger database URL")
    parser.add_argument("--from", dest="since", required=True, help="RFC 3339, inclusive")
    parser.add_argument("--to", dest="until", required=True, help="RFC 3339, exclusive")
    parser.add_argument("--tenant", help="count and plot only this tenant's records")
    parser.add_argument("--out", type=Path, required=True, help="folder to write the pack to")
    parser.add_argument("--pdf", action="store_true",
                        help="also print report.pdf with the Chromium on PATH")
    parser.add_argument("--paper", choices=("A4", "Letter"), default="A4",
                        help="the PDF's paper size (default A4)")
    parser.add_argument("--made-by", help="who makes the report, as the log will name "
                        "them (default local:<user>)")
    parser.add_argument("--no-log", action="store_true",
                        help="do not append the report's digest to the log (read-only use)")
    add_key_option(parser)


@dataclass
class SloSummary:
    """Targets against what the range shows (README "SLOs")."""

    p99_target_s: float
    jitter_target_s: float
    service_ms: list[float]
    availability: Any  # ledger.slo.Availability
    downtime_budget_min: float
    max_outage_s: float
    anchor_lag_target_s: float
    anchor_lags_s: list[float]
    ready_steps: list[tuple[datetime, float]] = field(default_factory=list)


@dataclass
class ReportData:
    """Everything the report shows, gathered before any HTML is written."""

    since: datetime
    until: datetime
    tenant: str | None
    generated_at: datetime
    database: str
    origin: str
    log_key: str
    log_size: int
    latest_size: int
    audit: Any  # ledger.audit.AuditReport
    checkpoints: list[tuple[int, str, datetime, str | None]] = field(default_factory=list)
    anchors: list[tuple[int, str, str, datetime]] = field(default_factory=list)
    counts: dict[str, Counter[str]] = field(default_factory=dict)
    points: list[Any] = field(default_factory=list)  # console_plots.Point
    slo: SloSummary | None = None
    service_ms: list[float] = field(default_factory=list)  # each record's phases summed
    other_leaves: Counter[str] = field(default_factory=Counter)  # by schema
    # Erasure leaves in scope: (leaf index, leaf id, created, records erased, reason).
    erasures: list[tuple[int, str, datetime, int, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.audit.ok) and all(c[3] is None for c in self.checkpoints)


def _naive_utc(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(tzinfo=None) if moment.tzinfo else moment


def _redacted(url: str) -> str:
    """The database URL without credentials: the report is handed to outsiders."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = rest.split("@", 1)[1]
    return f"{scheme}{sep}{rest}"


def gather(args: argparse.Namespace) -> ReportData:
    from sqlalchemy import select

    from inference_wrapper.server.console_plots import Point
    from ledger.audit import MirrorRow, audit_range
    from ledger.store.schema import anchors
    from ledger.store.sql import SqlLedger

    verifier = pinned_verifier(args)
    since, until = parse_time(args.since, "--from"), parse_time(args.until, "--to")
    assert since is not None and until is not None
    since, until = _naive_utc(since), _naive_utc(until)
    if until <= since:
        raise InvalidInputError("--to", "must be later than --from")
    with SqlLedger(args.db) as ledger:
        latest = ledger.latest_checkpoint()
        if latest is None:
            raise InvalidInputError("--db", "the log has no checkpoint yet")
        trusted = verifier.open_checkpoint(latest.note, verifier.name)
        log_size, _ = ledger.tree_head()
        rows = (MirrorRow(r.leaf_index, r.record_id, r.created_at, r.canonical,
                          dict(r.columns, tenant=r.tenant,
                               environment_index=r.environment_index), r.body)
                for r in ledger.iter_records())
        audit = audit_range(rows, trusted, since, until, log_size=log_size,
                            environments=ledger.mirror.environments())
        data = ReportData(since, until, args.tenant, datetime.now(UTC).replace(tzinfo=None),
                          _redacted(args.db), verifier.name, verifier.encode(), log_size,
                          latest.size, audit)
        for stored in ledger.iter_checkpoints():
            if since <= stored.sealed_at < until:
                try:
                    verifier.open_checkpoint(stored.note, verifier.name)
                    problem = None
                except LedgerError as exc:
                    problem = str(exc)
                data.checkpoints.append((stored.size, stored.root.hex(), stored.sealed_at,
                                         problem))
        with ledger.engine.connect() as conn:
            for row in conn.execute(select(anchors).where(anchors.c.anchored_at >= since,
                                                          anchors.c.anchored_at < until)
                                    .order_by(anchors.c.size)):
                data.anchors.append((int(row.size), row.kind, row.ref, row.anchored_at))
        data.counts = {name: Counter() for name, _ in COUNTED}
        cursor: str | None = None
        while True:
            page, cursor = ledger.mirror.query(since=since, until=until, limit=5000, cursor=cursor,
                                               tenant=args.tenant)
            for r in page:
                body = json.loads(r.leaf_body)
                if body.get("schema") in (ERASURE_SCHEMA, ERASURE_KIND):
                    section = body.get("erasure") or {}
                    data.erasures.append((r.leaf_index, r.record_id, r.created_at,
                                          len(section.get("records") or []),
                                          str(section.get("reason") or "")))
                if body.get("schema") not in (RECORD_SCHEMA, RECORD_KIND):
                    # Access, erasure, stream-start and report leaves have no inference
                    # fingerprints: counted apart, or they would read as fingerprint changes.
                    data.other_leaves[str(body.get("schema"))] += 1
                    continue
                data.points.append(Point.from_record(r.created_at, r.columns, body))
                data.service_ms.append(sum(data.points[-1].timings_ms.values()))
                model = f"{r.columns.get('model_name')} ({r.columns.get('model_digest')})"
                data.counts["model"][model] += 1
                data.counts["tenant"][r.tenant] += 1
                data.counts["accelerator"][str(r.columns.get("accelerator_model")
                                               or r.columns.get("accelerator"))] += 1
            if cursor is None:
                break
        data.slo = gather_slo(ledger, data)
    return data


def gather_slo(ledger: Any, data: ReportData) -> SloSummary:
    """SLO targets from the service's settings; measured values from the range itself.

    Records do not name their route, so every record's service time (the sum of its
    phase timings) is held to the tightest latency target configured for any route.
    """
    from inference_wrapper.server.settings import Settings
    from ledger import slo
    from ledger.store.readiness import spans_between

    settings = Settings.from_env()
    targets = slo.parse_latency_targets(settings.slo_latency)
    p99 = min((t.p99_s for t in targets.values()), default=float("inf"))
    jitter = min((t.jitter_s for t in targets.values()), default=float("inf"))
    # The future is not downtime: measure up to now at most.
    until = min(data.until, data.generated_at)
    spans = spans_between(ledger.engine, data.since, until)
    measured = slo.availability(spans, data.since, until)
    sealed = {size: at for size, _, at, _ in data.checkpoints}
    lags = [max(0.0, (anchored - sealed[size]).total_seconds())
            for size, _, _, anchored in data.anchors if size in sealed]
    return SloSummary(
        p99, jitter, data.service_ms, measured,
        settings.slo_downtime_min_per_month * measured.observed_s / slo.MONTH_S,
        settings.slo_max_outage_s, settings.anchor_lag_slo_s, lags,
        slo.ready_steps(spans, data.since, until) if spans else [])


# --- HTML ------------------------------------------------------------------------------

def page_style(paper: str) -> str:
    """Print layout: the paper size, margins and a page number in each page's footer;
    wide tables wrap within the page instead of running off it."""
    return (f"@page {{ size: {paper}; margin: 16mm 14mm 18mm; "
            "@bottom-center { content: 'page ' counter(page) ' of ' counter(pages); "
            "font: 9px system-ui, sans-serif; color: #555; } }\n"
            "@media print { body { max-width: none; margin: 0; } "
            "table { width: 100%; table-layout: fixed; } "
            "th, td { overflow-wrap: anywhere; word-break: break-word; } "
            "tr, svg { break-inside: avoid; } svg { max-width: 100%; height: auto; } "
            "h2 { break-after: avoid; } }\n")


STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1000px; margin: 2em auto; color: #1d1d1d; }
table { border-collapse: collapse; font-size: .9em; margin: .5em 0 1.5em; }
th, td { border-bottom: 1px solid #ddd; padding: .25em .6em; text-align: left; }
code { word-break: break-all; }
.ok { color: #1e6b40; font-weight: 700; } .bad { color: #a3261a; font-weight: 700; }
svg { border: 1px solid #ddd; font-size: 11px; } .plot-title { font-weight: 700; }
"""


def obligations(data: ReportData) -> list[tuple[str, str, str, str]]:
    """Which part of this pack speaks to which obligation, and what it found: every row is
    derived from the checks' results, so a NOT COMPLETE audit never reads as complete. A
    pointer to evidence, not legal advice: whether it suffices is the regulated firm's and
    its counsel's call. Rows: (obligation, what it asks, status, what this pack shows)."""
    audit = data.audit
    bad_checkpoints = [c for c in data.checkpoints if c[3] is not None]
    if audit.ok:
        art12 = ("shown", f"One record per inference call with its fingerprints; the audit "
                 f"found all {audit.in_range} records of the range present and unaltered "
                 "against the signed checkpoint.")
    else:
        art12 = ("NOT shown", f"The audit is NOT COMPLETE ({len(audit.findings)} "
                 "findings above): records of the range are missing, altered or unproven; "
                 "this pack cannot show the log is complete.")
    if bad_checkpoints:
        art19 = ("NOT shown", f"{len(bad_checkpoints)} checkpoint(s) in range do not verify "
                 "under the pinned key.")
    elif not data.checkpoints or not data.anchors:
        missing = " and ".join(w for w, n in (("no checkpoint was sealed", data.checkpoints),
                                              ("no anchor was made", data.anchors)) if not n)
        art19 = ("partly shown", f"In this range {missing}; the records are held by later "
                 "checkpoints only (see the audit above).")
    else:
        art19 = ("shown", f"{len(data.checkpoints)} signed checkpoints and "
                 f"{len(data.anchors)} anchors in range; bundle.json re-checks each record "
                 "offline against the pinned key.")
    changes = len(data.points) and "the fingerprint-change timeline dates each change"
    sr117 = ("shown" if data.points else "nothing in range",
             f"Counts per model digest ({len(data.counts.get('model', {}))} models); "
             + (f"{changes} of model, driver, torch and service revision, with the records "
                "on each side." if changes else "no inference record in range."))
    sec = (("shown" if audit.ok and not bad_checkpoints else "NOT shown"),
           ("Merkle log with signed checkpoints: " + (
               "the audit found no edit, removal or insertion in range" if audit.ok else
               "the audit found changes in range (see the findings)")
            + "; the pack's digest (report.pack.sha256) is appended to the log. Detecting a "
            "change is not preserving the original: the storage must still meet the rule."))
    erased = sum(e[3] for e in data.erasures)
    gdpr = (("shown" if data.erasures else "none in range"),
            (f"{len(data.erasures)} erasure leaves in range covering {erased} records' "
             "retained content (leaves " + ", ".join(str(e[0]) for e in data.erasures[:20])
             + (" ..." if len(data.erasures) > 20 else "") + "); their records' commitments "
             "stay, the content is crypto-shredded.") if data.erasures else
            "No erasure was requested in this range.")
    return [
        ("EU AI Act Art. 12 (record-keeping)", "High-risk systems log events automatically "
         "over their lifetime, for traceability.", *art12),
        ("EU AI Act Art. 19 (keeping the logs)", "Providers keep the automatically generated "
         "logs for a period fit for purpose (at least six months).", *art19),
        ("SR 11-7 (model risk management)", "Inventory of models in use, change control and "
         "ongoing monitoring.", *sr117),
        ("SEC 17a-4(f) (electronic records)", "Records kept non-rewriteable and non-erasable, "
         "or with an audit trail that can recreate an altered or deleted original.", *sec),
        ("GDPR Art. 17 (right to erasure)", "Personal data erased without undue delay when "
         "a data subject asks and no exception applies.", *gdpr),
    ]


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]], empty: str) -> str:
    from inference_wrapper.server.console_pages import visible

    if not rows:
        return f"<p>{escape(empty)}</p>"
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    thead = f"<thead><tr>{head}</tr></thead>" if head else ""
    # Cells come from the records: control and bidi characters are spelled out.
    body = "".join("<tr>" + "".join(f"<td>{escape(visible(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table>{thead}<tbody>{body}</tbody></table>"


def _counts(counts: Mapping[str, Counter[str]]) -> str:
    return "".join(
        f"<h3>per {escape(label)}</h3>"
        + _table((label, "records"), counts[name].most_common(), "no records")
        for name, label in COUNTED)


def _other_leaves(counts: Counter[str]) -> str:
    if not counts:
        return ""
    return ("<p>Other leaves in scope (not inference records, not counted above):</p>"
            + _table(("kind", "leaves"), sorted(counts.items()), ""))


def _verdict(ok: bool | None) -> str:
    return "no data" if ok is None else ("met" if ok else "MISSED")


def _slo_section(summary: SloSummary | None) -> str:
    from inference_wrapper.server.console_plots import line_chart_svg
    from ledger import slo

    if summary is None:
        return "<p>No SLO data.</p>"
    p50 = slo.exact_quantile(summary.service_ms, 0.5)
    p99 = slo.exact_quantile(summary.service_ms, 0.99)
    have = bool(summary.service_ms)
    spread = p99 - p50
    avail = summary.availability
    observed = avail.observed_s > 0
    lag_max = max(summary.anchor_lags_s, default=None)
    rows = [
        ("latency p99 (records' service time)", f"{summary.p99_target_s * 1000:g} ms",
         f"{p99:.3f} ms" if have else "-",
         _verdict(p99 <= summary.p99_target_s * 1000 if have else None)),
        ("jitter p99 - p50", f"{summary.jitter_target_s * 1000:g} ms",
         f"{spread:.3f} ms" if have else "-",
         _verdict(spread <= summary.jitter_target_s * 1000 if have else None)),
        ("unplanned downtime (target prorated to the range observed)",
         f"{summary.downtime_budget_min:.3f} min",
         f"{avail.downtime_min:.3f} min in {avail.outages} outage(s)" if observed else "-",
         _verdict(avail.downtime_min <= summary.downtime_budget_min if observed else None)),
        ("longest single outage", f"{summary.max_outage_s:g} s",
         f"{avail.longest_outage_s:.1f} s" if observed else "-",
         _verdict(avail.longest_outage_s <= summary.max_outage_s if observed else None)),
        ("anchoring lag (seal to anchor, worst)", f"{summary.anchor_lag_target_s:g} s",
         f"{lag_max:.1f} s" if lag_max is not None else "-",
         _verdict(lag_max <= summary.anchor_lag_target_s if lag_max is not None else None)),
    ]
    return ('<p>Targets are the service\'s <code>AUDIT_LEDGER_SLO_*</code> settings. '
            "Latency is each record's own phase timings summed (records do not name their "
            "route, so the tightest route target applies); availability is the service's "
            "readiness history (time no replica was ready, clean shutdowns excepted).</p>"
            + _table(("SLO", "target", "measured", "verdict"), rows, "")
            .replace("<table>", '<table id="slo-table">', 1)
            + line_chart_svg({"replicas ready": summary.ready_steps},
                             title="replicas ready (readiness history)", unit=""))


def render(data: ReportData, paper: str = "A4") -> str:
    from inference_wrapper.server.console_plots import (
        TIMELINE_FIELDS,
        bar_chart_svg,
        fingerprint_changes,
        line_chart_svg,
        mean_batch_size,
        per_minute,
        phase_charts_svg,
        timeline_svg,
    )

    audit = data.audit
    verdict = (f'<p class="{"ok" if audit.ok else "bad"}" id="audit-verdict">'
               f'{"COMPLETE" if audit.ok else "NOT COMPLETE"}: {audit.in_range} records in '
               f"range against the signed checkpoint of size {audit.checkpoint_size}; "
               f"{audit.rows_checked} mirror rows checked column by column"
               f"{f'; {audit.uncovered} newer records not yet covered' if audit.uncovered else ''}"
               "</p>")
    findings = _table(("kind", "leaf", "record", "column", "message"),
                      [(f.kind, f.leaf_index, f.record_id, f.column, f.message)
                       for f in audit.findings], "No findings.")
    checkpoints = _table(
        ("size", "root (hex)", "sealed (UTC)", "signature under the pinned key"),
        [(size, root, f"{sealed:%Y-%m-%d %H:%M:%S}", problem or "valid")
         for size, root, sealed, problem in data.checkpoints], "No checkpoint sealed in range.")
    anchors = _table(("size", "kind", "reference", "anchored (UTC)"),
                     [(s, k, r, f"{a:%Y-%m-%d %H:%M:%S}") for s, k, r, a in data.anchors],
                     "No anchor in range.")
    sealed = {size: at for size, _, at, _ in data.checkpoints}
    lag = [(anchored, max(0.0, (anchored - sealed[size]).total_seconds()))
           for size, _, _, anchored in data.anchors if size in sealed]
    changes = fingerprint_changes(data.points)
    labels = dict(TIMELINE_FIELDS)
    change_table = _table(
        ("when (UTC)", "what", "before", "records before", "after", "records after"),
        [(f"{c.at:%Y-%m-%d %H:%M:%S}", labels[c.field], c.before, c.records_before, c.after,
          c.records_after) for c in changes], "No fingerprint changed in range.")
    scope = _table((), [
        ("from (inclusive, UTC)", f"{data.since:%Y-%m-%d %H:%M:%S}"),
        ("to (exclusive, UTC)", f"{data.until:%Y-%m-%d %H:%M:%S}"),
        ("tenant", data.tenant or "all tenants"),
        ("database", data.database),
        ("generated (UTC)", f"{data.generated_at:%Y-%m-%d %H:%M:%S}"),
    ], "")
    identity = _table((), [
        ("origin", data.origin), ("pinned log key", data.log_key),
        ("log size now", data.log_size), ("latest signed checkpoint", data.latest_size),
    ], "")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>Evidence pack {data.since:%Y-%m-%d} to {data.until:%Y-%m-%d}</title>
<style>{STYLE}{page_style(paper)}</style></head><body>
<h1>Audit evidence pack</h1>
<p>Generated by <code>audit-ledger report</code> from the ledger's database, checked against
the pinned log key. The machine-verifiable evidence of the same scope is
<code>bundle.json</code> beside this file: <code>audit-ledger verify --bundle bundle.json
--log-key KEY</code> checks every record in it offline.</p>
<h2>Scope</h2>{scope}
<h2>Log identity</h2>{identity}
<h2>Audit completeness</h2>
<p>The mirror rows of the range, in the whole log (all tenants), rehashed to the signed root
and every typed column recomputed from the record bytes.</p>
{verdict}{findings}
<h2>Checkpoints sealed in range</h2>{checkpoints}
<h2>Anchors in range</h2>{anchors}
<h2>Records</h2>
<p id="record-count">{len(data.points)} records in scope.</p>
{_other_leaves(data.other_leaves)}
{_counts(data.counts)}
<h2>SLO compliance</h2>
{_slo_section(data.slo)}
<h2>Records per minute</h2>
{bar_chart_svg(per_minute(data.points), title="records (requests) per minute")}
<h2>Latency per phase (from the records' timings)</h2>
{phase_charts_svg(data.points, title="p50 and p99 per minute")}
<h2>Batch sizes</h2>
{line_chart_svg({"mean batch size": mean_batch_size(data.points)},
                title="mean batch size per minute", unit="")}
<h2>Anchoring lag</h2>
{line_chart_svg({"seal to anchor": lag}, title="seconds from sealing to anchoring",
                unit="s")}
<h2>Fingerprint changes</h2>
{timeline_svg(data.points, changes)}
{change_table}
<h2>Obligations and where this pack holds evidence for them</h2>
<p>A map for the reader, not legal advice.</p>
{_table(("obligation", "what it asks", "status", "what this pack shows"), obligations(data),
         "").replace("<table>", '<table id="obligations">', 1)}
</body></html>
"""


def print_pdf(html: Path, pdf: Path) -> None:
    """Print the report with a headless Chromium (the one a browser test drives too)."""
    import shutil
    import subprocess
    import tempfile

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise InvalidInputError("--pdf", "needs Chromium on PATH (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile:
        result = subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--disable-component-update",
             "--no-first-run", "--disable-sync", f"--user-data-dir={profile}",
             "--no-pdf-header-footer", f"--print-to-pdf={pdf}", html.resolve().as_uri()],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            timeout=300, check=False)
    if result.returncode != 0 or not pdf.is_file():
        tail = result.stderr.decode(errors="replace").strip().splitlines()[-1:]
        raise BackendError(f"Chromium could not print the PDF (exit {result.returncode}"
                           f"{': ' + tail[0] if tail else ''})")


def _rfc3339(moment: datetime) -> str:
    from ledger.record import utc_timestamp

    return utc_timestamp(moment.replace(tzinfo=UTC))


def log_report(args: argparse.Namespace, data: ReportData, digest: str) -> dict[str, Any]:
    """Append the report's digest as a ``report-record/v2`` leaf, through the normal
    ledger append; write its id beside the digest. The service's integrator seals it."""
    from audit_cli.cmd_retention import operator_name
    from ledger.leaves.report import build_report
    from ledger.record import new_record_id, utc_timestamp
    from ledger.store.log_origin import stored_origin
    from ledger.store.sql import SqlLedger

    with SqlLedger(args.db) as ledger:
        with ledger.engine.connect() as conn:
            origin = stored_origin(conn)  # the report leaf's tenant tag is of this log
        record = build_report(
            origin=origin, leaf_id=new_record_id(), created_at=utc_timestamp(),
            digest=digest, since=_rfc3339(data.since), until=_rfc3339(data.until),
            scope_tenant=data.tenant, made_by=args.made_by or operator_name(),
            file=MANIFEST)
        receipt = ledger.append(record)
    logged = {"record_id": receipt.record_id, "leaf_index": receipt.leaf_index,
              "digest": digest, "leaf_hash": receipt.leaf_hash.hex()}
    (args.out / "report.record.json").write_text(json.dumps(logged, indent=2) + "\n")
    return logged


def run(args: argparse.Namespace) -> int:
    if args.pdf:  # before the work: fail fast when there is no printer
        import shutil

        if not (shutil.which("chromium") or shutil.which("chromium-browser")):
            raise InvalidInputError("--pdf", "needs Chromium on PATH (apt-get install "
                                    "chromium)")
    data = gather(args)
    html = render(data, args.paper).encode("utf-8")
    args.out.mkdir(parents=True, exist_ok=True)
    report = args.out / "report.html"
    report.write_bytes(html)
    digest = "sha256:" + hashlib.sha256(html).hexdigest()
    (args.out / "report.html.sha256").write_text(f"{digest}  report.html\n")
    # Beside the report, the machine-verifiable evidence of the same scope.
    from ledger.client.exporter import export_from_log
    from ledger.store.sql import SqlLedger

    with SqlLedger(args.db) as ledger:
        bundle = export_from_log(ledger, data.since, data.until,
                                 {"tenant": args.tenant} if args.tenant else {})
    (args.out / "bundle.json").write_text(bundle.dumps())
    if args.pdf:
        print_pdf(report, args.out / "report.pdf")
    elif (args.out / "report.pdf").exists():  # an older print would not match this pack
        (args.out / "report.pdf").unlink()
    pack = write_manifest(args.out)
    logged = None if args.no_log else log_report(args, data, pack)
    failed = [size for size, _, _, problem in data.checkpoints if problem]
    if args.json:
        print_json({"report": str(report), "digest": digest, "pack_digest": pack,
                    "complete": data.audit.ok,
                    "bundle": str(args.out / "bundle.json"), "bundled": len(bundle.entries),
                    "records": len(data.points), "checkpoints": len(data.checkpoints),
                    "checkpoints_failing": failed, "anchors": len(data.anchors),
                    "report_record": logged})
    else:
        print(f"wrote {report} ({digest}) and {args.out / 'bundle.json'} "
              f"({len(bundle.entries)} records); pack digest {pack} ({MANIFEST})")
        print(f"{'COMPLETE' if data.audit.ok else 'NOT COMPLETE'}: {len(data.points)} records "
              f"in scope, {len(data.checkpoints)} checkpoints ({len(failed)} failing), "
              f"{len(data.anchors)} anchors in range")
        if logged is not None:
            print(f"report record {logged['record_id']} (leaf {logged['leaf_index']}) "
                  f"appended; verify it once sealed: audit-ledger verify "
                  f"{logged['record_id']} --db ...")
    return 0 if data.ok else 1
