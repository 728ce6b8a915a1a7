#!/usr/bin/env bash
# The main job on the embedded default: the audited endpoint on 127.0.0.1, SQLite ledger,
# local checkpoints, the shipped SmolLM2-135M model. Prints first API keys on first start.
set -euo pipefail
cd "$(dirname "$0")/.."
# The log published as static tiles beside the database (README "Tiles").
: "${AUDIT_LEDGER_TILES_PUBLISH_TO:=${AUDIT_LEDGER_HOME:-$HOME/.cache/audit-ledger}/tiles}"
export AUDIT_LEDGER_TILES_PUBLISH_TO
exec .venv/bin/audit-ledger serve "$@"
