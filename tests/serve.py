"""`leaderboard serve` as a real process for tests: started on a free port, waited for until
it answers, stopped after. One copy of the start-and-wait loop the uvicorn tests share."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from leaderboard.redis_server import free_port

__all__ = ["serving"]


@contextmanager
def serving(data: Path, env: dict[str, str], *serve_args: str,
            timeout: float = 60) -> Iterator[str]:
    """Run `leaderboard --data DATA serve --port P --log-level warning SERVE_ARGS` with the
    environment without any LEADERBOARD_* variable, plus `env`; yield its base URL once
    /healthz answers (with any status), and terminate it after. A server that exits or
    does not answer within `timeout` seconds fails the test with its output."""
    port = free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LEADERBOARD_")}
    environ.update(env)
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "--data", str(data), "serve", "--port", str(port),
         "--log-level", "warning", *serve_args],
        env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                httpx.get(f"{base}/healthz", timeout=2)
                break
            except httpx.TransportError:
                if process.poll() is not None or time.monotonic() > deadline:
                    assert process.stdout is not None
                    raise AssertionError(process.stdout.read().decode()) from None
                time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        process.wait(15)
