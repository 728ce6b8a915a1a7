"""Storage edge of the ledger: SQL journal, tree state, checkpoints and the auditors' mirror."""
