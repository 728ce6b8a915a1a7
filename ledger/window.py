"""Time windows as leaf ranges, proven complete (pure; docs/decisions/0037).

The rule (the lag rule): a leaf's ``created_at`` is never more than ``MAX_LAG`` older
than the newest ``created_at`` of any leaf before it. The log enforces it when it
appends; every reader of the tiles (a monitor reads them all) can check it; a window
verifier checks it on every leaf it reads. From it:

- if leaf ``k`` was created before ``since - MAX_LAG``, every leaf before ``k`` was
  created before ``since`` (else ``k`` would lag it by more than ``MAX_LAG``);
- if leaf ``j`` was created at or after ``until + MAX_LAG``, every leaf after ``j`` was
  created at or after ``until``.

So the window ``[since, until)`` lies inside the leaves ``[k, j]``: reading exactly those
(checked against a signed root, ``tiles.check_leaves``) and filtering locally proves the
answer complete. ``k`` may be 0; ``j`` must exist in the checkpoint, or the window is
still open (a later leaf may yet fall inside it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from ledger import merkle, tiles
from ledger.canonical import parse_strict
from ledger.checkpoint import Checkpoint
from ledger.errors import MalformedProofError, VerificationError

MAX_LAG = timedelta(minutes=5)


class WindowError(VerificationError):
    """The leaves read do not prove the window complete; the message names the check."""


_V1_TIME_AT = len(b'{"created_at":"')
_V2_TIME_AT = len(b'{"body":"sha256:') + 64 + len(b'","created_at":"')
_STAMP = re.compile(rb"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z\"")


def entry_time(entry: bytes) -> datetime:
    """A leaf's ``created_at`` (naive UTC), from a v1 record or a v2 envelope alike.

    Canonical JSON sorts keys, so in both the time sits at a fixed place; read there when
    the key occurs exactly once (no duplicate could give the leaf another meaning), else
    parse the whole leaf."""
    at = (_V1_TIME_AT if entry.startswith(b'{"created_at":"') else
          _V2_TIME_AT if entry[_V2_TIME_AT - 16:_V2_TIME_AT] == b'","created_at":"' else 0)
    if at and _STAMP.match(entry, at) and entry.count(b'"created_at"') == 1:
        return datetime.fromisoformat(entry[at:at + 23].decode())
    try:
        value = parse_strict(entry)  # refuses duplicate keys: one meaning per leaf
        return _naive(datetime.fromisoformat(value["created_at"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise MalformedProofError(f"a leaf has no created_at time: {exc}") from exc


def _naive(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(tzinfo=None) if moment.tzinfo else moment


def check_covers(proved: tuple[datetime, datetime], since: datetime | None,
                 until: datetime | None) -> None:
    """The window an auditor asked for lies within the one proved complete (times
    without a zone are UTC): a proof of another window proves nothing about it."""
    low, high = _naive(proved[0]), _naive(proved[1])
    if since is not None and _naive(since) < low:
        raise WindowError(f"the proved window starts at {low.isoformat()}Z, after the "
                          f"--since asked for ({_naive(since).isoformat()}Z)")
    if until is not None and _naive(until) > high:
        raise WindowError(f"the proved window ends at {high.isoformat()}Z, before the "
                          f"--until asked for ({_naive(until).isoformat()}Z)")


def before_window(moment: datetime, since: datetime, lag: timedelta = MAX_LAG) -> bool:
    """Whether a leaf of this time proves every earlier leaf is before ``since``."""
    return moment < _naive(since) - lag


def after_window(moment: datetime, until: datetime, lag: timedelta = MAX_LAG) -> bool:
    """Whether a leaf of this time proves every later leaf is at or after ``until``."""
    return moment >= _naive(until) + lag


@dataclass(frozen=True)
class ReadLeaves:
    """Leaves' hashes (``merkle.hash_leaf``) and ``created_at`` times (None: not read
    yet), worked out where the bytes arrive (a fetching thread), in the leaves' order."""

    hashes: list[bytes]
    times: list[datetime | None]

    @staticmethod
    def join(parts: Sequence[ReadLeaves], skip: int, count: int) -> ReadLeaves:
        """``count`` leaves from ``parts`` laid end to end, the first ``skip`` left out."""
        hashes = [h for part in parts for h in part.hashes][skip:skip + count]
        times = [t for part in parts for t in part.times][skip:skip + count]
        return ReadLeaves(hashes, times)


def read_leaves(entries: Sequence[bytes]) -> ReadLeaves:
    """Each entry's leaf hash and time (None where the time is not plainly there:
    ``check_window`` then reads it after the root check, and says what is wrong)."""
    hash_leaf = merkle.hash_leaf
    times: list[datetime | None] = []
    for entry in entries:
        try:
            times.append(entry_time(entry))
        except MalformedProofError:
            times.append(None)
    return ReadLeaves([hash_leaf(e) for e in entries], times)


@dataclass(frozen=True)
class WindowAnswer:
    start: int  # leaves [start, end) were read and checked
    end: int
    tree_size: int
    in_window: int  # leaves created in [since, until)
    matched: list[int] = field(default_factory=list)  # their indices that the filter kept

    def summary(self) -> str:
        return (f"complete: every leaf in [{self.start}, {self.end}) read and checked, "
                f"{len(self.matched)} matched")


def check_window(checkpoint: Checkpoint, since: datetime, until: datetime, start: int,
                 entries: Sequence[bytes], outside: Callable[[int, int], bytes],
                 keep: Callable[[int, bytes], bool] = lambda index, entry: True,
                 lag: timedelta = MAX_LAG, *, read: ReadLeaves | None = None
                 ) -> WindowAnswer:
    """Prove ``entries`` (leaves ``[start, start + len)``) hold the whole window.

    ``checkpoint`` must already be verified (pinned key, witnesses or anchor);
    ``outside(level, idx)`` gives the tree's other perfect subtrees (its tiles);
    ``keep`` is the caller's filter, applied to every leaf created in the window.
    ``read``: the entries' hashes and times as the caller worked them out while fetching
    (``read_leaves`` of the same bytes); without it they are worked out here."""
    since, until = _naive(since), _naive(until)
    if not since < until:
        raise WindowError("the window is empty: since must be before until")
    end = start + len(entries)
    if not entries:
        raise WindowError("no leaves given")
    if read is None:
        read = read_leaves(entries)
    elif len(read.hashes) != len(entries) or len(read.times) != len(entries):
        raise ValueError("the hashes and times read are not one per entry")
    tiles.check_leaves(checkpoint.size, checkpoint.root, start, end, read.hashes, outside)
    # A leaf whose time could not be read quickly is read (or refused) now, once the root
    # proved it is the log's: a tampered leaf is named by the root check first.
    times = [entry_time(e) if t is None else t
             for t, e in zip(read.times, entries, strict=True)]
    if start != 0 and not before_window(times[0], since, lag):
        raise WindowError(f"leaf {start}, the first read, was created at {times[0]}, not "
                          f"before {since - lag} (since - max lag): earlier leaves may "
                          "belong to the window")
    if not after_window(times[-1], until, lag):
        raise WindowError(f"the window is still open: leaf {end - 1}, the last read, was "
                          f"created at {times[-1]}, not at or after {until + lag} "
                          "(until + max lag)")
    newest = times[0]
    matched, in_window = [], 0
    for offset, (moment, entry) in enumerate(zip(times, entries, strict=True)):
        if moment < newest - lag:
            raise WindowError(f"lag rule broken at leaf {start + offset}: created at "
                              f"{moment}, more than {lag} before {newest}, created earlier")
        newest = max(newest, moment)
        if since <= moment < until:
            in_window += 1
            if keep(start + offset, entry):
                matched.append(start + offset)
    return WindowAnswer(start, end, checkpoint.size, in_window, matched)


def check_lag(previous_newest: datetime | None, created_at: datetime,
              lag: timedelta = MAX_LAG) -> None:
    """Refuse an append that would break the lag rule (the log's side of it)."""
    if previous_newest is not None and _naive(created_at) < _naive(previous_newest) - lag:
        raise WindowError(f"created_at {created_at} is more than {lag} before the newest "
                          f"leaf's ({previous_newest}): the log keeps windows provable")
