#!/usr/bin/env bash
# kiln's main job: bootstrap (Python 3.11), then the seed's TransformerBlock benchmarked eager vs
# kiln vs torch.compile (accuracy vs eager and fp64, median time, compile times, graphs/breaks),
# the HTML report (graph breaks, recompiles, fusion, per-kernel roofline, compile-time breakdown)
# and kiln's explain report. Full size on a GPU, a small size on the CPU. Extra arguments go to
# `kiln bench` (e.g. --train, --dtype bfloat16, --mode max-autotune, --models all).
set -euo pipefail
cd "$(dirname "$0")/.."
venv_py="$(bash scripts/bootstrap.sh "${KILN_PYTHON:-}" | tail -1)"
out="${KILN_BENCH_OUT:-bench_out}"
"$venv_py" -m kiln bench --models seed_block --compare torch --report --out "$out" "$@"
echo "== kiln explain: the seed block's graphs, breaks, guards and compile times =="
"$venv_py" -m kiln explain suite:seed_block
echo "open $out/report.html for the report"
