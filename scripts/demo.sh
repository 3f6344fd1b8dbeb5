#!/usr/bin/env bash
# Bootstrap (Python 3.11) and run kiln's demo: the seed's TransformerBlock captured by kiln, its
# explain report and a per-call overhead table (GPU if present, else a small CPU size).
set -euo pipefail
cd "$(dirname "$0")/.."
venv_py="$(bash scripts/bootstrap.sh "${KILN_PYTHON:-}" | tail -1)"
"$venv_py" -m kiln demo "$@"
echo "== per-call overhead: eager vs kiln vs torch.compile (backend=eager), same run =="
exec "$venv_py" benchmarks/overhead.py
