"""Read a record's retained content (auditors), then open its commitments with it.

  audit-ledger content RECORD_ID --purpose "MiFID II review" --server URL --api-key KEY
  audit-ledger content RECORD_ID --purpose "..." --db URL [--keyring FILE]

Every read first appends an access-record/v1 leaf to the log (who, which record, why,
when) and waits until it is durable; only then is the content decrypted. The decrypted
prompt, output and salts are then checked against the record's commitments (check 5).
Exit 0 the content opens the commitments, 1 it does not / erased / not retained,
2 usage, 3 unreachable.
"""

from __future__ import annotations

import argparse
import base64
import os
import urllib.error
import urllib.parse
from pathlib import Path
from typing import Any

from audit_cli.cmd_retention import add_vault_options, opened, operator_name
from audit_cli.options import print_json
from ledger.canonical import parse_strict
from ledger.client import safe_http
from ledger.client.sources import MalformedAnswerError
from ledger.content_records import check_purpose
from ledger.errors import (
    BackendError,
    BackendUnavailableError,
    CanonicalFormError,
    InvalidInputError,
)
from ledger.vault_errors import ContentErasedError, ContentNotRetainedError
from ledger.verify import CHECK_NAMES, opens_commitment


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("record_id")
    parser.add_argument("--purpose", required=True, help="why you read it (logged)")
    parser.add_argument("--server", help="service base URL (with an auditor --api-key)")
    parser.add_argument("--api-key", default=os.environ.get("AUDIT_LEDGER_API_KEY"),
                        help="auditor bearer key for --server (or AUDIT_LEDGER_API_KEY)")
    add_vault_options(parser)
    parser.add_argument("--out", type=Path, default=None,
                        help="write prompt.txt and output.txt into this directory")


def _http(args: argparse.Namespace, path: str, **query: str) -> dict[str, Any]:
    url = args.server.rstrip("/") + path + ("?" + urllib.parse.urlencode(query) if query else "")
    headers = {"Authorization": f"Bearer {args.api_key}", "Accept": "application/json"}
    try:
        answer = parse_strict(safe_http.get(url, headers, timeout_s=60))
        if not isinstance(answer, dict):
            raise MalformedAnswerError(f"{path}: the server's answer is not a JSON object")
        return answer
    except CanonicalFormError as exc:
        raise MalformedAnswerError(f"{path}: the server's answer is not JSON ({exc})") from exc
    except urllib.error.HTTPError as exc:
        try:
            problem = parse_strict(exc.read(64 * 1024))
            problem = problem if isinstance(problem, dict) else {}
        except CanonicalFormError:
            problem = {}
        detail = str(problem.get("detail", exc.reason))
        if exc.code == 410:
            raise ContentErasedError(args.record_id, str(problem.get("erased_at")),
                                     problem.get("erasure_record_id")) from exc
        if exc.code == 404:
            raise ContentNotRetainedError(args.record_id) from exc
        if exc.code in (400, 401, 403, 422):
            raise InvalidInputError(str(problem.get("field") or "--api-key"), detail) from exc
        raise BackendError(f"{path}: HTTP {exc.code}: {detail}") from exc
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        raise BackendUnavailableError(f"cannot reach {args.server}: {exc}") from exc


def _read(args: argparse.Namespace, purpose: str) -> tuple[dict[str, Any], bytes]:
    """(content answer, the record's canonical bytes) from the server or the database."""
    if args.server:
        if not args.api_key:
            raise InvalidInputError("--api-key", "is required with --server")
        quoted = urllib.parse.quote(args.record_id, safe="")
        answer = _http(args, f"/v1/records/{quoted}/content", purpose=purpose)
        record = _http(args, f"/v1/records/{quoted}")
        try:
            for name in ("record_id", "tenant", "prompt", "output", "input_salt",
                         "output_salt", "access_record_id"):
                if not isinstance(answer[name], str):
                    raise TypeError(f"{name} is not a string")
            bytes.fromhex(answer["input_salt"]) + bytes.fromhex(answer["output_salt"])
            # A v2 record's commitments are in its body; a v1 record's bytes are it.
            return answer, base64.b64decode(record.get("body_base64")
                                            or record["canonical_base64"], validate=True)
        except (KeyError, TypeError, ValueError) as exc:
            raise MalformedAnswerError(f"the server's answer lacks a valid field "
                                       f"({type(exc).__name__}: {exc})") from exc
    from ledger.store.vault import Accessor

    with opened(args, ledger=True) as (vault, journal):
        result = vault.read_audited(journal, args.record_id,
                                    Accessor(operator_name(), "operator", "local"),
                                    purpose, "cli")
        row = journal.get_record(args.record_id)
    if row is None:
        raise ContentNotRetainedError(args.record_id)
    content = result.content
    return {"record_id": args.record_id, "tenant": result.row.tenant,
            "prompt": content.prompt, "output": content.output,
            "input_salt": content.input_salt.hex(), "output_salt": content.output_salt.hex(),
            "access_record_id": result.access_record_id,
            "access_leaf_index": result.access_leaf_index}, row.leaf_body


def run(args: argparse.Namespace) -> int:
    if bool(args.server) == bool(args.database_url):
        raise InvalidInputError("source", "give exactly one of --server, --db")
    purpose = check_purpose(args.purpose)
    answer, canonical = _read(args, purpose)
    # Check 5 (ledger.verify): the decrypted texts and salts open the record's commitments.
    body = parse_strict(canonical)
    opened_prompt = opens_commitment(body, "input_commitment",
                                     bytes.fromhex(answer["input_salt"]),
                                     answer["prompt"].encode("utf-8"))
    opened_output = opens_commitment(body, "output_commitment",
                                     bytes.fromhex(answer["output_salt"]),
                                     answer["output"].encode("utf-8"))
    ok = opened_prompt and opened_output
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "prompt.txt").write_text(answer["prompt"], encoding="utf-8")
        (args.out / "output.txt").write_text(answer["output"], encoding="utf-8")
    if args.json:
        print_json({**answer, "commitments_opened": ok,
                    "check_5": {"prompt": opened_prompt, "output": opened_output}})
    else:
        print(f"record {answer['record_id']} (tenant {answer['tenant']})")
        print(f"access logged first: access record {answer['access_record_id']} "
              f"at leaf {answer['access_leaf_index']}")
        print(f"--- prompt ---\n{answer['prompt']}\n--- output ---\n{answer['output']}")
        print(f"input salt {answer['input_salt']}\noutput salt {answer['output_salt']}")
        status = "PASS" if ok else "FAIL"
        why = ("prompt and output match the record" if ok else
               f"prompt {'opens' if opened_prompt else 'does NOT open'} input_commitment; "
               f"output {'opens' if opened_output else 'does NOT open'} output_commitment")
        print(f"[{status}] 5. {CHECK_NAMES[5]}: {why}")
    return 0 if ok else 1
