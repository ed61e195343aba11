#!/usr/bin/env bash
# Make headless Chromium and its WebDriver available for the console's browser test
# (tests/app/test_console_browser.py) and print their paths.
#
# Usage: scripts/ensure_browser.sh
#
# Debian's `chromium` and `chromium-driver` packages, installed with apt-get when running
# as root; otherwise only reports what is missing (the browser test then skips, unless
# LEADERBOARD_REQUIRE_BROWSER=1 as in CI). Selenium is pointed at these two binaries
# explicitly, so Selenium Manager never downloads a browser or driver.
# Idempotent: a second run finds the first run's binaries and prints only their paths.
set -euo pipefail

browser=/usr/bin/chromium
driver=/usr/bin/chromedriver

if [ -x "$browser" ] && [ -x "$driver" ]; then
    echo "$browser"
    echo "$driver"
    exit 0
fi

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "ensure_browser: installing Debian's chromium and chromium-driver" >&2
    if { apt-get update -qq \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            chromium chromium-driver; } >/dev/null; then
        echo "$browser"
        echo "$driver"
        exit 0
    fi
    echo "ensure_browser: apt-get install chromium chromium-driver failed" >&2
    exit 1
fi

echo "ensure_browser: $browser or $driver is missing and this is not a root shell with" \
     "apt-get; install Debian's chromium and chromium-driver to run the browser test" >&2
exit 0
