"""The auditor's memory for ``audit`` and ``log fsck``: the state file ``verify`` keeps
(one signed checkpoint per log), read before and advanced after a clean run."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ledger import merkle
from ledger.checkpoint import Checkpoint, NoteVerifier
from ledger.errors import VerificationError
from ledger.remembered import FORK, Divergence, against_seen


def add_state_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state", type=Path, help="this auditor's state file (default: one "
                        "per log under $AUDIT_LEDGER_HOME/verifier, shared with verify)")
    parser.add_argument("--no-state", action="store_true",
                        help="neither read nor advance the state file")


class Memory:
    def __init__(self, args: argparse.Namespace, verifier: NoteVerifier) -> None:
        from ledger.client.state import default_state_path, load_seen

        self.verifier = verifier
        self.path: Path | None = None if args.no_state else (
            args.state or default_state_path(verifier, verifier.name))
        self.seen = load_seen(self.path) if self.path is not None else None

    def check(self, ledger: Any) -> Divergence | None:
        """How the log diverges from the checkpoint seen last, if it does."""
        if self.seen is None:
            return None
        seen = self.verifier.open_checkpoint(self.seen, self.verifier.name)
        stored = ledger.latest_checkpoint()
        try:
            latest = (self.verifier.open_checkpoint(stored.note, self.verifier.name)
                      if stored is not None else None)
        except VerificationError as exc:
            return Divergence(FORK, seen.size, f"fork: the log's newest checkpoint does not "
                              f"verify against the pinned key ({exc})")
        tree_size, _ = ledger.tree_head()
        return against_seen(seen, latest, tree_size, ledger.read_nodes)

    def check_tree(self, latest: Checkpoint, read: merkle.NodeReader) -> Divergence | None:
        """The same, for a tree read through its tiles (``latest`` already verified)."""
        if self.seen is None:
            return None
        seen = self.verifier.open_checkpoint(self.seen, self.verifier.name)
        return against_seen(seen, latest, latest.size, read)

    def advance(self, note: bytes | None) -> None:
        """Remember ``note`` (verified by the caller) unless a larger one is remembered."""
        from ledger.client.state import compare_and_swap

        if self.path is not None and note is not None:
            compare_and_swap(self.path, self.seen, note)
