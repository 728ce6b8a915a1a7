"""The link from a streamed call's ``audit-record/v2`` to the ``audit-stream-start/v2``
leaf it names in ``stream.start_record_id`` (decisions 0043, 0050).

The start leaf was committed before the first token left the server; the record is
only evidence of that if the leaf it names is really there: a stream start, appended
before the record, of the same tenant, committing the same prompt (and stop strings and
user, when given) under the same salts. ``verify``, ``audit`` and ``log fsck`` all judge
the link by ``stream_start_problem``. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ledger.leaves.commitments import INPUT, STOP, USER
from ledger.leaves.envelope import Leaf
from ledger.leaves.stream_start import STREAM_START_KIND

# The commitments a start leaf holds; the completed record must hold the same values.
SHARED_LABELS = (INPUT, STOP, USER)


@dataclass(frozen=True, slots=True)
class StartFacts:
    """What the link is judged on, kept small: ``audit`` and ``fsck`` hold one per
    stream start not yet completed while they read the log."""

    leaf_index: int
    kind: str
    tenant: str | None
    commitments: tuple[str | None, ...]  # SHARED_LABELS' values, None where absent

    @classmethod
    def of(cls, leaf: Leaf, leaf_index: int) -> StartFacts:
        held = leaf.content.get("commitments")
        held = held if isinstance(held, Mapping) else {}
        return cls(leaf_index, leaf.kind, leaf.tenant,
                   tuple(None if held.get(label) is None else str(held[label])
                         for label in SHARED_LABELS))


def named_start(leaf: Leaf) -> str | None:
    """The start record id a v2 record names, or None (not streamed, or not a record)."""
    stream = leaf.content.get("stream")
    return str(stream["start_record_id"]) if isinstance(stream, Mapping) else None


def stream_start_problem(record: Leaf, record_index: int, start: StartFacts | None
                         ) -> str | None:
    """What is wrong with the start leaf ``record`` names (``start``: the leaf with that
    record id, None when the log has none), or None when the link holds or the record
    names none."""
    named = named_start(record)
    if named is None:
        return None
    where = f"the record names stream start {named}"
    if start is None:  # (audit and fsck let a start go once a record completed it)
        return (f"{where}, which is no {STREAM_START_KIND} leaf before it in the log "
                "that no other record completed")
    if start.kind != STREAM_START_KIND:
        return f"{where}, which is a {start.kind} leaf, not an {STREAM_START_KIND}"
    if start.leaf_index >= record_index:
        return (f"{where}, appended at leaf {start.leaf_index}, after the record at leaf "
                f"{record_index}")
    if start.tenant != record.tenant:
        return f"{where}, which is tenant {start.tenant!r}'s, not {record.tenant!r}'s"
    ours = StartFacts.of(record, record_index).commitments
    for label, theirs, mine in zip(SHARED_LABELS, start.commitments, ours, strict=True):
        if theirs != mine:
            return (f"{where}, whose {label} commitment is not the record's "
                    f"({theirs or 'none'} there, {mine or 'none'} here)")
    return None
