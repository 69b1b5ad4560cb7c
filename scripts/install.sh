#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with torch and kforge (editable) installed.
# CPU hosts get the CPU build of torch 2.13.0 (not the multi-GB CUDA build pip would pick);
# a host that already has a CUDA torch (or nvidia-smi) keeps the torch it has.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if [ ! -x .venv/bin/python ]; then
  if nvidia-smi >/dev/null 2>&1; then
    "$PYTHON" -m venv --system-site-packages .venv   # reuse the host's CUDA torch
  else
    "$PYTHON" -m venv .venv
  fi
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip

if ! python -c "import torch" >/dev/null 2>&1; then
  python -m pip install -q "torch==2.13.0"
fi
python -m pip install -q -e ".[dev,llm]"
python -c "import torch, prefect; print(f'kforge environment ready: torch {torch.__version__}, prefect {prefect.__version__}')"
