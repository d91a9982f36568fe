#!/usr/bin/env bash
# Install headless Chromium for the report's browser test (tests/report).
#
# Idempotent: does nothing when /usr/bin/chromium already exists. Needs root
# and a working apt (Debian/Ubuntu). When it cannot install, it says why and
# exits 0 so that setup scripts keep going; the browser test then skips with
# that reason.
set -u

BROWSER=/usr/bin/chromium

if [ -x "$BROWSER" ]; then
    echo "install_browser: $BROWSER already present"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_browser: no apt-get on this system; install Chromium by hand (browser test will be skipped)"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO="sudo -n"
    else
        echo "install_browser: not root and no password-less sudo; run 'apt-get install chromium' as root (browser test will be skipped)"
        exit 0
    fi
else
    SUDO=""
fi

export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get update -qq >/dev/null 2>&1; then
    echo "install_browser: 'apt-get update' failed (offline?); browser test will be skipped"
    exit 0
fi
if ! $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1; then
    echo "install_browser: 'apt-get install chromium' failed; browser test will be skipped"
    exit 0
fi

if [ -x "$BROWSER" ]; then
    echo "install_browser: installed $($BROWSER --version 2>/dev/null || echo chromium)"
else
    echo "install_browser: apt reported success but $BROWSER is missing; browser test will be skipped"
fi
exit 0
