#!/usr/bin/env bash
# Build NVIDIA kvpress's own environment (kvpress 0.5.5 needs transformers < 5.3; kvcert
# runs there too, docs/kvpress.md) and write the golden fixtures of its token selection:
#   scripts/kvpress_goldens.sh [VENV_DIR]      (default .venv-kvpress)
# tests/test_kvpress_goldens.py compares kvcert's kvpress-matched method configs with them.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-kvpress}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q torch==2.13.0          # the CPU build first, as for kvcert
    "$VENV/bin/pip" install -q kvpress==0.5.5
fi
"$VENV/bin/python" scripts/kvpress_goldens.py
