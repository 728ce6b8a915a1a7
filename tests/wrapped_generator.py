"""A test's own hooks around the tiny generator.

Everything a subclass does not override is the inner generator's. ``gate`` holds back
whichever step the subclass makes wait (``wait_for_gate``), so a test decides when that
step may go on instead of sleeping and hoping.
"""

from __future__ import annotations

import threading
from typing import Any


class WrappedGenerator:
    def __init__(self, inner: Any, *, gate_open: bool = False) -> None:
        self.inner = inner
        self.gate = threading.Event()
        if gate_open:
            self.gate.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def wait_for_gate(self) -> None:
        assert self.gate.wait(120), "the test never opened the gate"
