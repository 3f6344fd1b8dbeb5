#!/usr/bin/env bash
# The whole test suite on a CUDA machine with real Triton kernels (docs/testing.md).
#
#   bash scripts/test_cuda.sh [LOG_DIR] [pytest args...]
#
# KILN_TEST_DEVICE=cuda (the default where CUDA is available): every test under the stage folders
# that compares compiled results with eager runs on the GPU. One pytest process per test file,
# PARALLEL at a time (default 4), because a CUDA fault (illegal memory access, device assert)
# poisons its process: a fault then costs one file, not the rest of the suite. Logs per file go
# to LOG_DIR (default cuda_test_logs/); the last lines are the totals and the failing files.
# TEST_FILES="a.py b.py" runs a subset. Needs pytest; pytest-timeout is optional (addopts is emptied, PER_FILE_TIMEOUT bounds a file).
set -uo pipefail
cd "$(dirname "$0")/.."
logs="${1:-cuda_test_logs}"
shift || true
mkdir -p "$logs"
export KILN_TEST_DEVICE="${KILN_TEST_DEVICE:-cuda}"
parallel="${PARALLEL:-4}"
per_file="${PER_FILE_TIMEOUT:-480}"
python="${PYTHON:-python3}"

run_file() {  # $1: test file; writes $logs/<file>.log
    local log="$logs/$(echo "$1" | tr '/' '_').log"
    timeout "$per_file" $python -m pytest -q -p no:cacheprovider -o addopts="" -rfE "$1" \
        "${@:2}" > "$log" 2>&1
    echo "exit=$?" >> "$log"
}
export -f run_file
export logs per_file python

files="${TEST_FILES:-$(find tests -name 'test_*.py' | sort)}"  # TEST_FILES: a subset
tr ' ' '\n' <<< "$files" | grep . | xargs -P "$parallel" -I{} bash -c 'run_file "$@"' _ {} "$@"

passed=0 failed=0 errors=0 skipped=0
for log in "$logs"/*.log; do
    line="$(grep -E '^(=+ )?[0-9]+ (passed|failed|error|skipped)|no tests ran' "$log" | tail -1)"
    for kind in passed failed skipped; do
        n="$(grep -oE "[0-9]+ $kind" <<< "$line" | grep -oE '^[0-9]+')"
        printf -v "$kind" '%d' "$(( ${!kind} + ${n:-0} ))"
    done
    n="$(grep -oE '[0-9]+ errors?' <<< "$line" | grep -oE '^[0-9]+')"
    errors=$(( errors + ${n:-0} ))
    if ! grep -q '^exit=0$' "$log"; then
        echo "FAILED FILE: $log ($(tail -1 "$log")): ${line:-no summary (crash or timeout)}"
    fi
done
echo "CUDA suite (KILN_TEST_DEVICE=$KILN_TEST_DEVICE): $passed passed, $failed failed, $errors errors, $skipped skipped"
