#!/usr/bin/env bash
# Bootstrap and run the CPU test suite on Python 3.11 and 3.12 (3.12 through pyenv when it is not
# on PATH). Extra arguments go to pytest. Fails if either run fails or collects no tests.
# scripts/setup_browser.sh installs playwright for the HTML report's browser test and finds a
# headless Chromium (KILN_CHROMIUM tells the test where it is). It installs Chromium system-wide
# only when asked (KILN_INSTALL_BROWSER=1, as .ci/run does); without a browser that test is
# skipped with the reason, except under CI=true, where it fails.
set -uo pipefail
cd "$(dirname "$0")/.."

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

status=0
summary=()
for v in 3.11 3.12; do
    echo "=== Python $v ==="
    if ! exe="$(find_python "$v")"; then
        echo "no Python $v found (tried python$v and pyenv)" >&2
        summary+=("$v: NO PYTHON"); status=1; continue
    fi
    if ! venv_py="$(bash scripts/bootstrap.sh "$exe" | tail -1)"; then
        summary+=("$v: BOOTSTRAP FAILED"); status=1; continue
    fi
    if chromium="$(bash scripts/setup_browser.sh "$venv_py" | tail -1)"; then
        export KILN_CHROMIUM="$chromium"
    else
        echo "no headless Chromium: the report's browser test is skipped (KILN_INSTALL_BROWSER=1 installs one)" >&2
    fi
    echo "running tests with $("$venv_py" -VV | head -1) ($venv_py)"
    "$venv_py" -m pytest -q -m "not gpu" "$@"
    rc=$?
    if [[ $rc -eq 0 ]]; then
        summary+=("$v: passed")
    else
        [[ $rc -eq 5 ]] && echo "pytest collected no tests: that counts as a failure" >&2
        summary+=("$v: FAILED (pytest exit $rc)"); status=1
    fi
done
echo "=== summary ==="
printf '  %s\n' "${summary[@]}"
exit $status
