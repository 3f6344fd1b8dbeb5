#!/usr/bin/env bash
# Install what the HTML report's browser test needs, for the venv python given as $1:
#   - playwright (PyPI) into that venv, stamped so re-runs are instant;
#   - a headless Chromium: $KILN_CHROMIUM if set, else one already on PATH, else -- only when
#     KILN_INSTALL_BROWSER=1 asks for it -- Debian's chromium-headless-shell package (apt-get, as
#     root or through sudo; ~10 s and ~290 MB, once per machine; its output goes to
#     $venv/browser-install.log, not to the test log). Without that consent nothing system-wide is
#     installed and the script exits non-zero with the command that would install it.
#     Playwright's own browser download is not used: its CDN is not reachable from these machines.
# Prints the Chromium executable's path as the last line of stdout; exits non-zero (with the
# reason on stderr) when either part cannot be installed.
set -euo pipefail
cd "$(dirname "$0")/.."

venv_py="${1:?usage: setup_browser.sh VENV_PYTHON}"
playwright_spec="${KILN_PLAYWRIGHT_SPEC:-playwright==1.65.2}"
venv_dir="$(dirname "$(dirname "$venv_py")")"
stamp="$venv_dir/.kiln-browser-stamp"

log() { echo "[setup_browser] $*" >&2; }

if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$playwright_spec" ]] || ! "$venv_py" -c 'import playwright' 2>/dev/null; then
    start=$SECONDS
    log "installing $playwright_spec into $venv_dir"
    "$venv_py" -m pip install -q "$playwright_spec" 2>&1 | { grep -v "is ignored: it is neither a file" || true; } >&2
    "$venv_py" -c 'import playwright.sync_api' >&2
    echo "$playwright_spec" > "$stamp"
    log "playwright installed in $((SECONDS - start)) s"
fi

find_chromium() {
    if [[ -n "${KILN_CHROMIUM:-}" && -x "$KILN_CHROMIUM" ]]; then echo "$KILN_CHROMIUM"; return; fi
    local name
    for name in chromium-headless-shell chromium chromium-browser google-chrome; do
        if command -v "$name" >/dev/null 2>&1; then command -v "$name"; return; fi
    done
    return 1
}

if chromium="$(find_chromium)"; then
    echo "$chromium"
    exit 0
fi

if [[ "${KILN_INSTALL_BROWSER:-0}" != 1 ]]; then
    log "no headless Chromium found; the report's browser test will be skipped"
    log "hint: KILN_INSTALL_BROWSER=1 bash scripts/test.sh installs Debian's chromium-headless-shell"
    log "      (apt-get, system-wide, ~290 MB), or set KILN_CHROMIUM=/path/to/chromium"
    exit 1
fi

sudo_cmd=()
if [[ "$(id -u)" != 0 ]]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo_cmd=(sudo -n)
    else
        log "no Chromium found and cannot install one: not root and no password-less sudo"
        log "hint: install chromium-headless-shell (Debian/Ubuntu) or set KILN_CHROMIUM=/path/to/chromium"
        exit 1
    fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
    log "no Chromium found and no apt-get to install one; set KILN_CHROMIUM=/path/to/chromium"
    exit 1
fi
start=$SECONDS
apt_log="$venv_dir/browser-install.log"
log "installing chromium-headless-shell with apt-get (once per machine; log: $apt_log)"
apt_install() {
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends \
        chromium-headless-shell >>"$apt_log" 2>&1
}
if ! apt_install; then
    log "apt-get install failed; running apt-get update and trying again"
    "${sudo_cmd[@]}" apt-get update -q >>"$apt_log" 2>&1
    apt_install || { log "apt-get install failed: see $apt_log"; exit 1; }
fi
chromium="$(find_chromium)" || { log "chromium-headless-shell installed but not on PATH"; exit 1; }
log "Chromium installed in $((SECONDS - start)) s: $("$chromium" --version 2>/dev/null || echo "$chromium")"
echo "$chromium"
