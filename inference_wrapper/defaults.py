"""Where the shipped default model lives and how it is pinned."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PINNED_MANIFEST = Path(__file__).parent / "pinned" / "smollm2-135m-instruct.manifest.json"
DATA_HOME = Path(os.environ.get("AUDIT_LEDGER_HOME", Path.home() / ".cache" / "audit-ledger"))
DEFAULT_MODEL_DIR = DATA_HOME / "models" / "smollm2-135m-instruct"
