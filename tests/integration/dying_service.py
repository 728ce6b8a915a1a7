"""``audit-ledger`` with a bug injected into the batching task, so that the task dies on
its first batch: a real service process whose worker dies (supervision tests)."""

from __future__ import annotations

import sys
from typing import Any

from audit_cli.main import main
from inference_wrapper.audit.batcher import Batcher


def _broken(self: Any) -> Any:
    raise RuntimeError("injected bug in the batching task")


Batcher._take_batch = _broken  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main())
