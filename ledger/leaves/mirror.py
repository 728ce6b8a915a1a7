"""The mirror's typed columns of a v2 leaf (the one definition: the writer fills them,
``audit`` and ``log fsck`` recompute them from the leaf's bytes).

A v2 record's own row holds its id, time, tenant and the index of its environment; the
model, accelerator, driver, torch and service revision are its environment's, kept once
in the ``environments`` table (``environment_columns``) and found through that index.
The commitments stay in the body: no column repeats them.
"""

from __future__ import annotations

from typing import Any

from ledger.leaves.envelope import Leaf
from ledger.leaves.environment import ENVIRONMENT_COLUMNS, ENVIRONMENT_KIND, environment_columns

LOG_WIDE_TENANT = ""  # the mirror's tenant column for a log-wide leaf (no tenant named "")


def leaf_columns(leaf: Leaf) -> dict[str, Any]:
    """The row's own typed columns (``created_at`` as the RFC 3339 text)."""
    content = leaf.content
    environment = content.get("environment")
    return {
        "record_id": leaf.record_id,
        "created_at": leaf.created_at,
        "tenant": leaf.tenant if leaf.tenant is not None else LOG_WIDE_TENANT,
        **dict.fromkeys(ENVIRONMENT_COLUMNS),
        "input_commitment": None,
        "output_commitment": None,
        "environment_index": environment["leaf_index"] if environment else None,
    }


def environment_row(leaf: Leaf) -> dict[str, Any] | None:
    """The ``environments`` row of an environment leaf (None for other kinds)."""
    if leaf.kind != ENVIRONMENT_KIND:
        return None
    return environment_columns(leaf.content)
