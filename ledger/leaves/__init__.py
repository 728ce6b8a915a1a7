"""Leaves of the v2 format: a small envelope in the tree, the body stored beside it.

- ``envelope``: ``audit-leaf/v2`` (kind, time, tenant tag, body digest) and opening a
  stored envelope with its body (check 1);
- ``commitments``: labelled HMAC commitments, the only form content takes in a body;
- ``record_v2``: the ``audit-record/v2`` body of one generate call;
- ``environment``: the ``environment/v1`` body an engine's records refer to.

Pure: no I/O. Decision record 0026 holds the format and its field table.
"""
