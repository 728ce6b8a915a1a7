"""Retention of content: policies per tenant, legal holds, expiry, key rotation.

  audit-ledger retention set --tenant T --mode content --days 365
  audit-ledger retention show [--tenant T]
  audit-ledger retention hold --tenant T [--record ID] --reason "litigation 17"
  audit-ledger retention release HOLD_ID
  audit-ledger retention expire [--now 2027-06-01T00:00:00Z]
  audit-ledger retention rotate-key --tenant T
  audit-ledger retention report --tenant T --subject S
"""

from __future__ import annotations

import argparse
import getpass
import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from audit_cli.options import print_json
from ledger.errors import InvalidInputError


def add_vault_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", dest="database_url", default=None,
                        help="ledger database URL (default: the service's)")
    parser.add_argument("--keyring", type=Path, default=None,
                        help="the keyring file (default: vault.keyring in AUDIT_LEDGER_HOME)")


def operator_name() -> str:
    """Who an operator's command acts as, in the leaves it appends."""
    try:
        return f"local:{getpass.getuser()}"
    except (KeyError, OSError):
        return "local:operator"


@contextmanager
def opened(args: argparse.Namespace, ledger: bool = False) -> Iterator[tuple[Any, Any]]:
    """(vault, ledger or None) over the configured database, migrated first."""
    from inference_wrapper.server.settings import Settings
    from ledger.store.keyring import load_keks
    from ledger.store.migrate import upgrade
    from ledger.store.sql import SqlLedger
    from ledger.store.vault import ContentVault

    settings = Settings.from_env()
    url = args.database_url or settings.database_url
    upgrade(url)
    vault = ContentVault(url, load_keks(args.keyring or settings.keyring_path,
                                        settings.kek_provider),
                         default_mode=settings.retention_default_mode,
                         default_days=settings.retention_default_days,
                         minimum_days=settings.retention_minimum_days, policy_cache_s=0.0)
    journal = SqlLedger(url).start() if ledger else None
    try:
        yield vault, journal
    finally:
        if journal is not None:
            journal.close()
        vault.close()


def register(parser: argparse.ArgumentParser) -> None:
    add_vault_options(parser)
    actions = parser.add_subparsers(dest="action", required=True)
    set_ = actions.add_parser("set", help="set a tenant's policy")
    set_.add_argument("--tenant", required=True)
    set_.add_argument("--mode", required=True, choices=("commitments", "content"))
    set_.add_argument("--days", type=int, default=None,
                      help="retention period for mode content (at least the minimum)")
    show = actions.add_parser("show", help="policies and active legal holds")
    show.add_argument("--tenant", default=None)
    hold = actions.add_parser("hold", help="place a legal hold (blocks erasure and expiry)")
    hold.add_argument("--tenant", required=True)
    hold.add_argument("--record", default=None, help="one record (default: the whole tenant)")
    hold.add_argument("--reason", required=True)
    release = actions.add_parser("release", help="release a legal hold")
    release.add_argument("hold_id")
    expire = actions.add_parser("expire", help="erase content whose retention period ended")
    expire.add_argument("--now", default=None, help="RFC 3339 time to expire at (default: now)")
    rotate = actions.add_parser("rotate-key", help="new key-encryption key for a tenant; "
                                "re-wraps data keys, retires the old key")
    rotate.add_argument("--tenant", required=True)
    report = actions.add_parser("report", help="a data subject's records: kept, erased, "
                                "and every logged read of them")
    report.add_argument("--tenant", required=True)
    report.add_argument("--subject", required=True)


def _now(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise InvalidInputError("--now", "must be an RFC 3339 timestamp") from exc


def run(args: argparse.Namespace) -> int:
    with opened(args, ledger=args.action in ("expire", "report")) as (vault, journal):
        if args.action == "set":
            policy = vault.set_policy(args.tenant, args.mode, args.days)
            _show(args, policy.to_dict(), f"tenant {policy.tenant}: {policy.mode}"
                  + (f", {policy.days} days" if policy.days else ""))
        elif args.action == "show":
            tenants = [args.tenant] if args.tenant else [p.tenant for p in vault.policies()]
            policies = [vault.policy(t).to_dict() for t in tenants]
            holds = [h.to_dict() for h in vault.holds(args.tenant)]
            if args.json:
                print_json({"default_mode": vault.default_mode,
                            "minimum_days": vault.minimum_days, "policies": policies,
                            "holds": holds})
            else:
                print(f"default: {vault.default_mode}; minimum {vault.minimum_days} days")
                for p in policies:
                    days = f", {p['days']} days" if p["days"] else ""
                    origin = "" if p["explicit"] else " (default)"
                    print(f"  {p['tenant']}: {p['mode']}{days}{origin}")
                for h in holds:
                    scope = f"record {h['record_id']}" if h["record_id"] else "whole tenant"
                    print(f"  hold {h['hold_id']} on {h['tenant']} ({scope}): {h['reason']}")
        elif args.action == "hold":
            hold = vault.hold(args.tenant, args.reason, record_id=args.record)
            _show(args, hold.to_dict(), f"legal hold {hold.hold_id} on {hold.scope}")
        elif args.action == "release":
            hold = vault.release(args.hold_id)
            _show(args, hold.to_dict(), f"released legal hold {hold.hold_id} on {hold.scope}")
        elif args.action == "expire":
            erasures, held = vault.expire(journal, now=_now(args.now))
            failed = vault.expiry_failures
            if args.json:
                print_json({"erasures": [e.to_dict() for e in erasures],
                            "held_by": [h.to_dict() for h in held],
                            "failed": [{"tenant": t, "error": c} for t, c in failed.items()]})
            else:
                for e in erasures:
                    print(f"tenant {e.tenant}: erased {len(e.records)} expired records "
                          f"(erasure record {e.erasure_record_id}, leaf {e.leaf_index}"
                          + (f", and {len(e.leaf_indexes) - 1} more leaves)"
                             if len(e.leaf_indexes) > 1 else ")"))
                for h in held:
                    print(f"kept past expiry by legal hold {h.hold_id} on {h.scope}")
                for tenant, error in failed.items():
                    print(f"tenant {tenant}: expiry failed ({error}); left for the next run")
                if not erasures and not held and not failed:
                    print("nothing has expired")
            if failed:  # the run was not whole: a check that did not hold (exit 1)
                return 1
        elif args.action == "report":
            _report(args, vault, journal)
        else:
            kek, count, retired = vault.rotate(args.tenant)
            _show(args, {"tenant": args.tenant, "kek_id": kek, "rewrapped": count,
                         "retired": retired},
                  f"tenant {args.tenant}: new key-encryption key {kek}; {count} data keys "
                  f"re-wrapped; retired {', '.join(retired) or 'none'}")
    return 0


def _report(args: argparse.Namespace, vault: Any, journal: Any) -> None:
    """Per subject: its records (from the vault's keyed hashes) and the access and erasure
    leaves about them (from the tenant's mirror rows)."""
    from ledger.content_records import ACCESS_SCHEMA, ERASURE_SCHEMA
    from ledger.leaves.content_leaves import ACCESS_KIND, ERASURE_KIND

    rows = vault.rows(args.tenant, args.subject)
    ids = {r.record_id for r in rows}
    reads: list[dict[str, Any]] = []
    erasures: list[dict[str, Any]] = []
    cursor = None
    while ids:
        page, cursor = journal.mirror.query(tenant=args.tenant, limit=1000, cursor=cursor)
        for row in page:
            body = json.loads(row.leaf_body)  # both formats: v1 and v2 share these members
            if body["schema"] in (ACCESS_SCHEMA, ACCESS_KIND) \
                    and body["access"]["record_id"] in ids:
                reads.append({"leaf_index": row.leaf_index, "at": body["created_at"],
                              "record_id": body["access"]["record_id"],
                              "purpose": body["access"]["purpose"],
                              "by": body["access"]["accessor"]})
            elif body["schema"] in (ERASURE_SCHEMA, ERASURE_KIND) \
                    and ids & set(body["erasure"]["records"]):
                erasures.append({"leaf_index": row.leaf_index, "at": body["created_at"],
                                 "erasure_record_id": body["record_id"],
                                 "reason": body["erasure"]["reason"]})
        if cursor is None:
            break
    records = [{"record_id": r.record_id, "created_at": r.created_at.isoformat() + "Z",
                "retained_until": r.expires_at.isoformat() + "Z",
                "erased_at": r.erased_at.isoformat() + "Z" if r.erased_at else None,
                "erasure_record_id": r.erasure_record_id} for r in rows]
    if args.json:
        print_json({"tenant": args.tenant, "records": records, "reads": reads,
                    "erasures": erasures})
        return
    print(f"tenant {args.tenant}: {len(records)} records of this subject")
    for r in records:
        state = (f"erased {r['erased_at']} ({r['erasure_record_id']})" if r["erased_at"]
                 else f"kept until {r['retained_until']}")
        print(f"  {r['record_id']}  {state}")
    for read in reads:
        print(f"  read {read['at']} {read['record_id']} by {read['by']['key_id']} "
              f"({read['by']['role']}, {read['by']['tenant']}): {read['purpose']}")
    for erasure in erasures:
        print(f"  erasure {erasure['at']} {erasure['erasure_record_id']} ({erasure['reason']})")


def _show(args: argparse.Namespace, value: dict[str, Any], text: str) -> None:
    if args.json:
        print_json(value)
    else:
        print(text)
