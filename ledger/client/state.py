"""The verifier's own memory: the last checkpoint it verified, per log key.

Like the checksum-database clients of Go modules, a verifier that remembers what it
saw cannot be shown one history today and another tomorrow without noticing.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ledger.checkpoint import NoteVerifier


def default_state_path(verifier: NoteVerifier) -> Path:
    home = Path(os.environ.get("AUDIT_LEDGER_HOME", Path.home() / ".cache" / "audit-ledger"))
    return home / "verifier" / f"{verifier.name.replace('/', '_')}-{verifier.key_hash.hex()}.note"


def load_seen(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def save_seen(path: Path, note: bytes) -> None:
    """Replace the state atomically (write, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
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
