"""The console's pages as text: templates, the evidence block, the verification code.

Pure and free of aiohttp, so that two servers render the same pages: the operator's
(``inference_wrapper.server.console``) and the auditor's own on loopback
(``audit-ledger console``, standard library only), whose verification code therefore
comes from the auditor's install, never from the operator (docs/decisions/0040).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from html import escape
from pathlib import Path
from string import Template
from typing import Any
from urllib.parse import quote

from ledger.checkpoint import Checkpoint
from ledger.errors import LedgerError
from ledger.verify import Evidence, LeafEvidence

ASSETS = Path(__file__).resolve().parent / "console"
STATIC_TYPES = {"verify.js": "text/javascript", "console.css": "text/css"}
SECURITY_HEADERS = {
    # Only the app's own script and style; the evidence block is data, not script.
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self'; connect-src 'self'; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
# Control and bidirectional-formatting characters (the same set as verify.js's visible()).
_INVISIBLE = re.compile("[\u0000-\u001f\u007f-\u009f\u061c\u200b-\u200f\u2028-\u202e"
                        "\u2060-\u2069\ufeff]")


def visible(value: object) -> str:
    """Untrusted text with control and bidi characters spelled ``<U+202E>``: a driver
    "U+202E 51.45.055" must not display as 550.54.15."""
    return _INVISIBLE.sub(lambda m: f"<U+{ord(m.group()):04X}>", str(value))


_SPELLED = re.compile(r"<U\+([0-9A-F]{4})>")


def invisible(text: str) -> str:
    """``visible`` undone, for the characters it spells only: what an auditor copies from
    the list (or picks from a pick-list) finds the record that holds the character."""
    def back(match: re.Match[str]) -> str:
        char = chr(int(match.group(1), 16))
        return char if _INVISIBLE.fullmatch(char) else match.group()
    return _SPELLED.sub(back, text)


def shown(value: object) -> str:
    """Untrusted text for HTML: control characters made visible, then escaped."""
    return escape(visible(value))


def template(name: str) -> Template:
    return Template((ASSETS / name).read_text(encoding="utf-8"))


def static_asset(name: str) -> tuple[bytes, str] | None:
    """A static file's bytes and type; only names on a fixed list reach the file system."""
    if name not in STATIC_TYPES:
        return None
    return (ASSETS / "static" / name).read_bytes(), STATIC_TYPES[name]


def verification_code_digest() -> str:
    """SHA-256 of verify.js as this install has it: compare the operator's with yours."""
    return "sha256:" + hashlib.sha256((ASSETS / "static" / "verify.js").read_bytes()).hexdigest()


def page_html(title: str, main: str, nav: str = "") -> str:
    return template("layout.html").substitute(title=escape(title), nav=nav, main=main)


def error_main(status: int, title: str, detail: str, field: str | None = None) -> str:
    field_html = (f' <span class="field">field: <code>{escape(field)}</code></span>'
                  if field else "")
    return (f'<section class="error" data-status="{status}" data-field="{escape(field or "")}">'
            f"<h1>{escape(title)}</h1><p>{shown(detail)}{field_html}</p></section>")


def evidence_dict(evidence: Evidence) -> dict[str, Any]:
    """What the browser needs to run checks 1-4 on one record."""
    try:
        tree_size: int | None = Checkpoint.peek(evidence.checkpoint_note).size
    except LedgerError:
        tree_size = None  # an unreadable checkpoint fails check 3 in the browser
    consistency, inclusion = evidence.anchor_consistency, evidence.inclusion_proof
    return {
        "record_id": evidence.record_id, "leaf_index": evidence.leaf_index,
        "canonical_base64": base64.b64encode(evidence.canonical).decode(),
        "log_leaf_hash": evidence.log_leaf_hash.hex() if evidence.log_leaf_hash else None,
        "tree_size": tree_size,
        "inclusion_proof": None if inclusion is None else [h.hex() for h in inclusion],
        "checkpoint": evidence.checkpoint_note.decode("utf-8", "replace"),
        "anchor_ref": evidence.anchor_ref,
        "anchored_checkpoint": (evidence.anchored_note.decode("utf-8", "replace")
                                if evidence.anchored_note else None),
        "anchor_consistency": None if consistency is None else [h.hex() for h in consistency],
        # A v2 leaf (decision 0026): its body, and the environment leaf a record names.
        **({} if evidence.body is None else {
            "body_base64": base64.b64encode(evidence.body).decode()}),
        **({} if evidence.environment is None else {
            "environment": _leaf_dict(evidence.environment)}),
        # A streamed v2 record's stream start leaf (decision 0050), checked as the CLI does.
        **({} if evidence.stream_start is None else {
            "stream_start": _leaf_dict(evidence.stream_start)}),
    }


def _leaf_dict(leaf: LeafEvidence) -> dict[str, Any]:
    """Another leaf a v2 record names, with its own inclusion proof."""
    return {"leaf_index": leaf.leaf_index,
            "envelope_base64": base64.b64encode(leaf.envelope).decode(),
            "body_base64": base64.b64encode(leaf.body).decode(),
            "inclusion_proof": [h.hex() for h in leaf.inclusion_proof]}


def evidence_script(evidence: dict[str, Any]) -> str:
    """The evidence as inert JSON inside the page; '<' escaped so no tag can close it."""
    text = json.dumps(evidence, sort_keys=True).replace("<", "\\u003c")
    return f'<script type="application/json" id="evidence">{text}</script>'


def operator_hosted_notice() -> str:
    """Every record page the operator serves says whose code checks it."""
    return ('<aside id="hosting" data-hosted-by="operator" class="warning"><p><b>This page '
            "and its verification code are served by the operator whose log it checks.</b> "
            "An operator could change the code that decides. For a verdict the operator "
            "cannot influence, run <code>audit-ledger console --server URL</code> on your "
            "own machine: it serves these pages and the code from your install and fetches "
            "only evidence from the operator. Digest of the verification code served here: "
            f'<code id="code-digest">{verification_code_digest()}</code> (compare it with '
            "<code>audit-ledger console --print-digest</code> from your install).</p></aside>")


def local_notice(server: str) -> str:
    return ('<aside id="hosting" data-hosted-by="auditor"><p>Served by your own install '
            "(<code>audit-ledger console</code>) on this machine; only the evidence comes "
            f"from <code>{shown(server)}</code>. Verification code "
            f'<code id="code-digest">{verification_code_digest()}</code>.</p></aside>')


def mirror_rows(pairs: list[tuple[str, object]]) -> str:
    return "".join(f"<tr><th>{shown(name)}</th><td><code>{shown(value)}</code></td></tr>"
                   for name, value in pairs)


def record_main(record_id: str, mirror: str, evidence: dict[str, Any], hosting: str) -> str:
    return template("record.html").substitute(
        record_id=shown(record_id), mirror=mirror, evidence=evidence_script(evidence),
        hosting=hosting)


def result_row(row: dict[str, Any]) -> str:
    """One search result (a mirror row as the API spells it) as a table row. The link
    names the leaf index too: the record page checks the bytes are the one asked for."""
    record_id = str(row.get("record_id"))
    href = f"/console/records/{quote(record_id, safe='')}?leaf={int(row['leaf_index'])}"
    created = str(row.get("created_at") or "").replace("T", " ").removesuffix("Z")[:19]
    cells = (row.get("model_name"), row.get("model_digest"),
             row.get("accelerator_model") or row.get("accelerator"),
             row.get("driver_version"), row.get("service_revision"))
    return (f"<tr><td>{int(row['leaf_index'])}</td>"
            f'<td><a class="record-link" href="{escape(href)}">{shown(record_id)}</a></td>'
            f"<td>{escape(created)} UTC</td><td>{shown(row.get('tenant'))}</td>"
            + "".join(f'<td class="digest"><code>{shown(v or "")}</code></td>' for v in cells)
            + "</tr>")
