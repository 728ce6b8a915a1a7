"""Erase retained content by crypto-shredding: by data subject or by record ids.

  audit-ledger erase --tenant T --subject S
  audit-ledger erase --tenant T RECORD_ID [RECORD_ID ...]
  ... --legal-basis "GDPR Art. 17(1)(d), ticket 8812"   (records inside the minimum
      retention: required, and recorded in the erasure leaf; decision 39)

Appends erasure-record/v2 leaves (several for a large erasure), then destroys the
records' data keys. Every proof still verifies; the content can never be read again.
A legal hold refuses (exit 1, naming the hold).
"""

from __future__ import annotations

import argparse

from audit_cli.cmd_retention import add_vault_options, opened, operator_name
from audit_cli.options import print_json
from ledger.errors import InvalidInputError


def register(parser: argparse.ArgumentParser) -> None:
    add_vault_options(parser)
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--subject", default=None, help="the data-subject id")
    parser.add_argument("record_ids", nargs="*", help="records to erase")
    parser.add_argument("--legal-basis", default=None,
                        help="why records inside the minimum retention are erased now")
    parser.add_argument("--by", default=None,
                        help="who requests it, for the erasure leaf (default: local:<user>)")


def run(args: argparse.Namespace) -> int:
    if bool(args.record_ids) == (args.subject is not None):
        raise InvalidInputError("--subject", "give either --subject or record ids")
    with opened(args, ledger=True) as (vault, journal):
        erasure = vault.erase(journal, args.tenant, record_ids=args.record_ids,
                              subject=args.subject, requested_by=args.by or operator_name(),
                              legal_basis=args.legal_basis)
    if args.json:
        print_json(erasure.to_dict())
    elif not erasure.records:
        print(f"nothing to erase for tenant {args.tenant}: no retained content left")
    else:
        print(f"erased {len(erasure.records)} records of tenant {erasure.tenant} under "
              f"erasure record {erasure.erasure_record_id} (leaf {erasure.leaf_index})")
        for record_id, index in list(zip(erasure.erasure_record_ids,
                                         erasure.leaf_indexes, strict=True))[1:]:
            print(f"  and erasure record {record_id} (leaf {index})")
        for record_id in erasure.records:
            print(f"  {record_id}")
    return 0
