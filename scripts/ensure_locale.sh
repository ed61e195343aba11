#!/usr/bin/env bash
# Make the en_US.UTF-8 locale available (the tests start Redis servers under it).
#
# Usage: scripts/ensure_locale.sh
#
# Redis takes its collation from its environment, and Lua's string comparison follows it:
# the tests run the speed layer's scripts on a server under en_US.UTF-8 to show that none of
# them depends on it (CI runs every test server so: LEADERBOARD_TEST_REDIS_LOCALE in .ci/run).
# Debian ships only C, C.UTF-8 and POSIX compiled: as root with apt-get, this installs the
# `locales` package if its sources are missing and compiles the one locale with localedef.
# Elsewhere it only says what is missing (the tests that need it then skip). Idempotent.
set -euo pipefail

locale_name="en_US.UTF-8"

installed() {
    # grep reads the whole list (no -q): under pipefail, an early exit could SIGPIPE locale.
    locale -a 2>/dev/null | grep -ix 'en_US\.utf-\?8' >/dev/null
}

if installed; then
    exit 0
fi

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure_locale: $locale_name is not installed and this is not root with apt-get;" \
         "the tests that start Redis under it will skip" >&2
    exit 0
fi

if ! command -v localedef >/dev/null 2>&1 || [ ! -e /usr/share/i18n/locales/en_US ]; then
    echo "ensure_locale: installing Debian's locales" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends locales \
        >/dev/null
fi

echo "ensure_locale: compiling $locale_name" >&2
localedef -i en_US -f UTF-8 "$locale_name"
installed || { echo "ensure_locale: $locale_name still missing after localedef" >&2; exit 1; }
