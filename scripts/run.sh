#!/usr/bin/env bash
# The main job on the embedded default: one audited generate on the shipped model.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/audit-ledger generate --chat "${PROMPT:-What is the capital of France?}"
