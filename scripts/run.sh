#!/usr/bin/env bash
# The main job on the embedded default: the audited endpoint on 127.0.0.1, SQLite ledger,
# local checkpoints, the shipped SmolLM2-135M model. Prints first API keys on first start.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/audit-ledger serve "$@"
