"""Manage API keys: create, list, revoke."""

from __future__ import annotations

import argparse

from audit_cli.options import print_json


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", dest="database_url", default=None)
    actions = parser.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="create a key (printed once)")
    create.add_argument("--tenant", required=True)
    create.add_argument("--role", required=True, choices=("client", "auditor", "admin"))
    create.add_argument("--all-tenants", action="store_true",
                        help="admin only: read every tenant's records (without it an admin "
                        "key reads only its own tenant)")
    actions.add_parser("list", help="list keys (never their secrets)")
    revoke = actions.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("key_id")


def run(args: argparse.Namespace) -> int:
    from inference_wrapper.server.settings import Settings
    from ledger.store.apikeys import ApiKeyStore
    from ledger.store.migrate import upgrade
    from ledger.store.sql import make_engine

    url = args.database_url or Settings.from_env().database_url
    upgrade(url)
    engine = make_engine(url)
    keys = ApiKeyStore(engine)
    try:
        if args.action == "create":
            token, key = keys.create(args.tenant, args.role, all_tenants=args.all_tenants)
            if args.json:
                print_json({"key_id": key.key_id, "tenant": key.tenant, "role": key.role,
                            "all_tenants": key.all_tenants, "token": token})
            else:
                scope = "; reads all tenants" if key.all_tenants else ""
                print(f"{token}\n(key id {key.key_id}, tenant {key.tenant}, role {key.role}"
                      f"{scope}; the token is shown only now)")
        elif args.action == "list":
            rows = [{"key_id": k.key_id, "tenant": k.tenant, "role": k.role,
                     "all_tenants": k.all_tenants,
                     "created_at": k.created_at.isoformat() + "Z",
                     "revoked_at": k.revoked_at.isoformat() + "Z" if k.revoked_at else None}
                    for k in keys.list()]
            if args.json:
                print_json(rows)
            else:
                for row in rows:
                    status = "revoked" if row["revoked_at"] else "active"
                    scope = "all tenants" if row["all_tenants"] else ""
                    print(f"{row['key_id']}  {row['role']:8} {row['tenant']:20} {status}"
                          f"  {scope}".rstrip())
        else:
            if not keys.revoke(args.key_id):
                print(f"no active key {args.key_id}")
                return 1
            print(f"revoked {args.key_id}")
    finally:
        engine.dispose()
    return 0
