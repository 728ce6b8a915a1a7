"""``audit-ledger``: the command line, the composition root for people."""
