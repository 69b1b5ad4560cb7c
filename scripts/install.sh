#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with torch and kforge (editable) installed.
# CPU hosts get the CPU build of torch 2.13.0 (not the multi-GB CUDA build pip would pick);
# a host that already has a CUDA torch (or nvidia-smi) keeps the torch it has.
#
# --wheelhouse DIR: no network; everything but torch comes from DIR, made by `kforge wheelhouse DIR` on a
#   machine with internet; torch must be the host's own (or its wheels must be in DIR).
# --requirements-only (with --wheelhouse): only DIR/kforge-requirements.txt, no torch check, no kforge.
# KFORGE_VENV=PATH: the environment's folder (default .venv in the checkout).
set -euo pipefail
WHEELHOUSE=""
REQUIREMENTS_ONLY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --wheelhouse)
      [ $# -ge 2 ] || { echo "error: --wheelhouse needs a folder (made by: kforge wheelhouse DIR)" >&2; exit 2; }
      WHEELHOUSE=$(cd "$2" 2>/dev/null && pwd) || { echo "error: --wheelhouse $2: no such folder" >&2; exit 2; }
      shift 2 ;;
    --requirements-only) REQUIREMENTS_ONLY=1; shift ;;
    *) echo "usage: $0 [--wheelhouse DIR [--requirements-only]]" >&2; exit 2 ;;
  esac
done
if [ "$REQUIREMENTS_ONLY" = 1 ] && [ -z "$WHEELHOUSE" ]; then
  echo "error: --requirements-only goes with --wheelhouse DIR" >&2; exit 2
fi
VENV=.venv
if [ -n "${KFORGE_VENV:-}" ]; then
  case "$KFORGE_VENV" in /*) VENV=$KFORGE_VENV ;; *) VENV=$PWD/$KFORGE_VENV ;; esac
fi
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
HOST_PYTHON=$(command -v "$PYTHON" || echo "$PYTHON")   # before the venv's python3 comes first on PATH

if [ ! -x "$VENV/bin/python" ]; then
  if nvidia-smi >/dev/null 2>&1; then
    "$PYTHON" -m venv --system-site-packages "$VENV"   # reuse the host's CUDA torch
  else
    "$PYTHON" -m venv "$VENV"
  fi
fi
. "$VENV/bin/activate"

if [ -n "$WHEELHOUSE" ]; then
  [ -f "$WHEELHOUSE/kforge-requirements.txt" ] || {
    echo "error: $WHEELHOUSE has no kforge-requirements.txt (make it with: kforge wheelhouse DIR)" >&2; exit 1; }
  offline=(python -m pip install -q --no-index --find-links "$WHEELHOUSE")
  if [ "$REQUIREMENTS_ONLY" = 0 ] && ! python -c "import torch" >/dev/null 2>&1; then
    # $PYTHON may itself be a venv holding the host's torch, which --system-site-packages does not reach: add its
    # site-packages after the venv's own.
    if "$HOST_PYTHON" -c "import torch" >/dev/null 2>&1 && grep -q "include-system-site-packages = true" "$VENV/pyvenv.cfg"; then
      "$HOST_PYTHON" -c "import site; print('\n'.join(site.getsitepackages()))" \
        >"$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/host-python.pth"
    fi
    if ! python -c "import torch" >/dev/null 2>&1; then
      if ls "$WHEELHOUSE"/torch-*.whl >/dev/null 2>&1; then
        "${offline[@]}" torch
      else
        echo "error: no torch in $VENV: install the host's CUDA torch for $PYTHON (or put torch's wheels in $WHEELHOUSE), then run this again" >&2
        exit 1
      fi
    fi
  fi
  "${offline[@]}" -r "$WHEELHOUSE/kforge-requirements.txt"
  if [ "$REQUIREMENTS_ONLY" = 1 ]; then
    echo "kforge's requirements installed from $WHEELHOUSE into $VENV"
    exit 0
  fi
  "${offline[@]}" --no-build-isolation -e ".[dev,llm]"
  python -c "import torch, prefect; print(f'kforge environment ready (offline): torch {torch.__version__}, prefect {prefect.__version__}')"
  exit 0
fi

python -m pip install -q --upgrade pip

if ! python -c "import torch" >/dev/null 2>&1; then
  python -m pip install -q "torch==2.13.0"
fi
python -m pip install -q -e ".[dev,llm]"
python -c "import torch, prefect; print(f'kforge environment ready: torch {torch.__version__}, prefect {prefect.__version__}')"
