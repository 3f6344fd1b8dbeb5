#!/usr/bin/env bash
# Bootstrap and run the CPU test suite on Python 3.11, 3.12 and 3.13 (through pyenv when one is
# not on PATH). Extra arguments go to pytest. Fails if any run fails or collects no tests.
#
# The versions run side by side, not one after another: one pytest process is mostly one core,
# and three in a row would take CI past its 30 minutes. Each version's output goes to
# test_logs/<version>.log and is printed whole once all are done, then a summary.
# KILN_TEST_PYTHONS="3.11 3.12" picks the versions.
#
# scripts/setup_browser.sh installs playwright for the HTML report's browser test and finds a
# headless Chromium (KILN_CHROMIUM tells the test where it is). It installs Chromium system-wide
# only when asked (KILN_INSTALL_BROWSER=1, as .ci/run does); without a browser that test is
# skipped with the reason, except under CI=true, where it fails.
set -uo pipefail
cd "$(dirname "$0")/.."

versions=(${KILN_TEST_PYTHONS:-3.11 3.12 3.13})
logs=test_logs
mkdir -p "$logs"

# Print the absolute path of an interpreter for major.minor $1, or fail.
find_python() {
    local v="$1" pv
    if "python$v" -c '' 2>/dev/null; then
        "python$v" -c 'import sys; print(sys.executable)'
        return
    fi
    pv="$(pyenv versions --bare 2>/dev/null | grep -E "^$v\.[0-9]+$" | sort -V | tail -1)"
    [[ -n "$pv" ]] && PYENV_VERSION="$pv" "python$v" -c 'import sys; print(sys.executable)'
}

# Build the venv of version $1 (output to its log); its python is written to $logs/$1.python.
bootstrap() {
    local v="$1" exe venv_py
    if ! exe="$(find_python "$v")"; then
        echo "no Python $v found (tried python$v and pyenv)"
        echo "NO PYTHON" > "$logs/$v.status"; return 1
    fi
    if ! venv_py="$(bash scripts/bootstrap.sh "$exe" | tail -1)" || [[ ! -x "$venv_py" ]]; then
        echo "BOOTSTRAP FAILED" > "$logs/$v.status"; return 1
    fi
    echo "$venv_py" > "$logs/$v.python"
}

# Run the suite with version $1's venv; exit status to $logs/$1.status.
run_tests() {
    local v="$1" venv_py rc
    venv_py="$(cat "$logs/$v.python")"
    echo "running tests with $("$venv_py" -VV | head -1) ($venv_py)"
    "$venv_py" -m pytest -q -m "not gpu" "${@:2}"
    rc=$?
    if [[ $rc -eq 0 ]]; then
        echo "passed" > "$logs/$v.status"
    else
        [[ $rc -eq 5 ]] && echo "pytest collected no tests: that counts as a failure"
        echo "FAILED (pytest exit $rc)" > "$logs/$v.status"
    fi
}

start=$SECONDS
rm -f "$logs"/*.log "$logs"/*.status "$logs"/*.python
for v in "${versions[@]}"; do
    bootstrap "$v" > "$logs/$v.log" 2>&1 &
done
wait
echo "venvs ready in $((SECONDS - start)) s"

# One at a time: the first may install Chromium system-wide (apt takes a lock).
for v in "${versions[@]}"; do
    [[ -f "$logs/$v.python" ]] || continue
    if chromium="$(bash scripts/setup_browser.sh "$(cat "$logs/$v.python")" 2>>"$logs/$v.log" | tail -1)"; then
        export KILN_CHROMIUM="$chromium"
    else
        echo "no headless Chromium: the report's browser test is skipped (KILN_INSTALL_BROWSER=1 installs one)" >> "$logs/$v.log"
    fi
done

# Side by side, the versions share the cores: torch's own intra-op threads on top oversubscribe
# them, and OpenMP's spinning waits then cost more than the threads gain on the suite's small
# tensors (measured on 2 cores, three runs of tests/lower: 101 s with torch's default of 2
# threads each, 82 s with 1). An OMP_NUM_THREADS set by the caller wins.
cores="$(nproc 2>/dev/null || echo 1)"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( cores / ${#versions[@]} > 1 ? cores / ${#versions[@]} : 1 ))}"
echo "OMP_NUM_THREADS=$OMP_NUM_THREADS (${#versions[@]} versions on $cores cores)"

for v in "${versions[@]}"; do
    [[ -f "$logs/$v.python" ]] && run_tests "$v" "$@" >> "$logs/$v.log" 2>&1 &
done
wait

status=0
for v in "${versions[@]}"; do
    echo "=== Python $v ==="
    cat "$logs/$v.log"
    [[ "$(cat "$logs/$v.status" 2>/dev/null)" == "passed" ]] || status=1
done
echo "=== summary ($((SECONDS - start)) s) ==="
for v in "${versions[@]}"; do
    echo "  $v: $(cat "$logs/$v.status" 2>/dev/null || echo "NO RESULT")"
done
exit $status
