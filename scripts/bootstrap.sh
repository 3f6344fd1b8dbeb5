#!/usr/bin/env bash
# Create or reuse the venv .venv-<major.minor> for PYTHON (default: python3.11, else python3),
# install torch 2.13.0 first (the CPU wheel where pip's find-links has one, e.g. /opt/wheels),
# then kiln in editable mode with [dev]. Re-runs are instant while pyproject.toml, this script and
# the interpreter are unchanged (a stamp file in the venv records their hash).
# Prints the venv's python path as the last line of stdout.
# Env: KILN_TORCH_SPEC (default "torch==2.13.0") picks the torch to install.
set -euo pipefail
cd "$(dirname "$0")/.."

py="${1:-}"
if [[ -z "$py" ]]; then
    if python3.11 -c '' 2>/dev/null; then py=python3.11; else py=python3; fi
fi
py_exe="$("$py" -c 'import sys; print(sys.executable)')"
ver="$("$py_exe" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
venv=".venv-$ver"
torch_spec="${KILN_TORCH_SPEC:-torch==2.13.0}"
stamp="$venv/.kiln-stamp"
want="$(cat pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16) $py_exe $torch_spec"

log() { echo "[bootstrap $ver] $*" >&2; }
# pip warns about missing local index folders of this machine's pip config: harmless noise.
pip_q() { "$venv/bin/python" -m pip "$@" 2>&1 | { grep -v "is ignored: it is neither a file" || true; } >&2; }

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && "$venv/bin/python" -c 'import torch, kiln' 2>/dev/null; then
    log "up to date: $venv"
    echo "$PWD/$venv/bin/python"
    exit 0
fi

start=$SECONDS
if [[ ! -x "$venv/bin/python" ]]; then
    log "creating $venv with $py_exe"
    "$py_exe" -m venv "$venv"
fi
rm -f "$stamp"
log "installing $torch_spec"
pip_q install -q "$torch_spec"
log "installing kiln (editable) with [dev]"
pip_q install -q -e ".[dev]"
"$venv/bin/python" -c 'import torch, triton, bytecode, kiln' >&2
echo "$want" > "$stamp"
log "done in $((SECONDS - start)) s: $("$venv/bin/python" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)')"
echo "$PWD/$venv/bin/python"
