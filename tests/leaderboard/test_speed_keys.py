"""`connect`: the one Redis client builder every layer uses, always with timeouts.

Regression: the CLI, jobs and DAG built their clients without timeouts (a Redis that accepted
the connection and then said nothing hung them for ever), the HTTP app its own way with them.
"""

from __future__ import annotations

import socket

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from leaderboard.settings import Settings
from leaderboard.speed_keys import COMMAND_TIMEOUT, CONNECT_TIMEOUT, connect


@pytest.mark.redis
def test_a_url_client_has_timeouts_and_answers(redis_server, tmp_path):
    settings = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path),
                                  "REDIS_URL": redis_server.url})
    client = connect(settings)
    try:
        options = client.connection_pool.connection_kwargs
        assert options["socket_timeout"] == COMMAND_TIMEOUT
        assert options["socket_connect_timeout"] == CONNECT_TIMEOUT
        assert options["protocol"] == 2
        assert client.ping()
        client.set("k", "v")
        assert client.get("k") == b"v"  # bytes: the layers decode themselves
    finally:
        client.close()


@pytest.mark.timeout(30)
def test_a_silent_server_times_out_instead_of_hanging(tmp_path):
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)  # the kernel accepts; nobody ever answers
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        settings = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path), "REDIS_URL": url})
        client = connect(settings, timeout=0.3, retry=Retry(NoBackoff(), 0))
        with pytest.raises(redis.TimeoutError):
            client.ping()
        client.close()
