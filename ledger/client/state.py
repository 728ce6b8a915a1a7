"""The verifier's own memory: the last checkpoint it verified, per log (origin and key).

Like the checksum-database clients of Go modules, a verifier that remembers what it
saw cannot be shown one history today and another tomorrow without noticing. Every
checkpoint the verifier is shown, online or in a bundle, is held against this state
(check 4), and a successful verification advances it.

Updates are a compare-and-swap under an exclusive ``fcntl`` lock on a side file: the
state moves only from the note the caller verified against to a larger one, so two
verifiers running at once never move it backwards (the loser re-verifies against what
the winner stored).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ledger.checkpoint import Checkpoint, NoteVerifier


def default_state_path(verifier: NoteVerifier, origin: str | None = None,
                       home: Path | None = None) -> Path:
    """``$AUDIT_LEDGER_HOME/verifier/<origin>-<key hash>.note`` (one file per log)."""
    if home is None:
        home = Path(os.environ.get("AUDIT_LEDGER_HOME", Path.home() / ".cache" / "audit-ledger"))
    origin = origin or verifier.name
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in origin)[:80]
    if safe != origin:  # keep distinct origins in distinct files
        safe += "-" + hashlib.sha256(origin.encode()).hexdigest()[:8]
    return home / "verifier" / f"{safe}-{verifier.key_hash.hex()}.note"


def load_seen(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def compare_and_swap(path: Path, expected: bytes | None, note: bytes) -> bool:
    """Store ``note`` if the state still holds ``expected``; True when the state now holds
    what the caller verified against or better.

    Returns False (and writes nothing) when another verifier changed the state since the
    caller read it: the caller must verify again against the new state. Never replaces a
    state by a smaller or equal-size checkpoint.
    """
    with _locked(path):
        current = load_seen(path)
        if current != expected:
            return False
        if current is not None and Checkpoint.peek(note).size <= Checkpoint.peek(current).size:
            return True
        _write(path, note)
        return True


def save_seen(path: Path, note: bytes) -> None:
    """Replace the state unconditionally (under the lock); tests and tools only."""
    with _locked(path):
        _write(path, note)


def _write(path: Path, note: bytes) -> None:
    """Replace the state atomically (write, fsync, rename)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".state-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(note)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
