#!/usr/bin/env bash
# Run a command beside CPU burners, one per core by default (a busy host): `bash scripts/busy.sh [-n N] CMD...`.
# The integrity checks must hold there too: a check that fires on load is a defect (`make test-busy`).
set -euo pipefail
burners=$(nproc)
if [[ "${1:-}" == "-n" ]]; then burners=$2; shift 2; fi
pids=()
for _ in $(seq "$burners"); do
    python3 -c "while True: pass" &
    pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
echo "busy.sh: $burners CPU burners beside: $*" >&2
"$@"
