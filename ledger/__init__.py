"""The audit ledger: a pure core (canonical bytes, Merkle math, checkpoints, records)
with storage, anchors and clients at the edges."""
