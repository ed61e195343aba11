"""Local Redis servers: throwaway ones for tests, the CLI's persistent daemon."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis_locale import NON_C_LOCALE, collates_as_bytes

from leaderboard.redis_server import (
    LOCALE_VAR,
    EmbeddedRedis,
    _pid_alive,
    ensure_local_server,
    find_server_binary,
    free_port,
    local_server_client,
    stop_local_server,
)

pytestmark = pytest.mark.redis


def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, protocol=3, decode_responses=True)


def _wait_for_aof_write(client: redis.Redis) -> None:
    """Wait until the AOF holds every write so far (a write can be postponed while a
    background fsync runs); a SIGKILL after this loses nothing."""
    deadline = time.monotonic() + 5
    while client.info("persistence")["aof_pending_bio_fsync"] != 0:
        assert time.monotonic() < deadline, "the AOF fsync never finished"
        time.sleep(0.01)
    client.ping()  # one more event-loop turn: a postponed write happens before this reply


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie main thread is not enough: the sockets close with the last thread.
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    return "\nState:\tZ" in status and threads == [str(pid)]


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    """A data dir whose local server, if a test starts one, is stopped afterwards."""
    yield tmp_path
    stop_local_server(tmp_path)


def test_find_server_binary_is_executable() -> None:
    binary = find_server_binary()
    assert os.access(binary, os.X_OK), binary


def test_free_port_is_bindable() -> None:
    assert 0 < free_port() < 65536


def test_start_serves_and_stop_ends_the_process(tmp_path: Path) -> None:
    server = EmbeddedRedis(dir=tmp_path)
    with server:
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        client = _client(server.url)
        client.set("k", "v")
        assert client.get("k") == "v"
        pid = server.pid
        assert pid is not None
        client.close()
    assert not server.running
    assert _pid_gone(pid)
    with pytest.raises(redis.exceptions.ConnectionError):
        _client(server.url).ping()
    assert (tmp_path / "redis-server.log").exists()


def test_restart_without_appendonly_starts_empty(tmp_path: Path) -> None:
    server = EmbeddedRedis(dir=tmp_path)
    with server:
        _client(server.url).set("k", "v")
    with server:
        assert _client(server.url).get("k") is None


def test_appendonly_data_survives_a_restart_on_the_same_port(tmp_path: Path) -> None:
    server = EmbeddedRedis(dir=tmp_path, appendonly=True)
    with server:
        port = server.port
        _client(server.url).zadd("z", {"alice": 3, "bob": 5})
    with server:
        assert server.port == port
        assert _client(server.url).zrange("z", 0, -1, withscores=True) == [
            ["alice", 3.0],
            ["bob", 5.0],
        ]


def test_kill_is_a_crash_that_keeps_what_reached_the_aof(tmp_path: Path) -> None:
    server = EmbeddedRedis(dir=tmp_path, appendonly=True)
    with server:
        client = _client(server.url)
        client.incrby("n", 7)
        _wait_for_aof_write(client)
        pid = server.pid
        assert pid is not None
        server.kill()
        assert not server.running
        assert _pid_gone(pid)
        server.start()
        assert _client(server.url).get("n") == "7"


def test_without_dir_a_temporary_dir_is_used() -> None:
    with EmbeddedRedis() as server:
        assert server.dir.is_dir()
        assert _client(server.url).ping()


def test_start_fails_clearly_when_the_server_cannot_start(tmp_path: Path) -> None:
    server = EmbeddedRedis(dir=tmp_path, extra_args=["--no-such-option", "x"])
    with pytest.raises(RuntimeError, match="exited with code") as excinfo:
        server.start()
    assert "no-such-option" in str(excinfo.value)  # the log tail names the bad argument
    assert not server.running


def test_a_taken_fixed_port_is_an_error(tmp_path: Path) -> None:
    with EmbeddedRedis(dir=tmp_path / "a") as first:
        second = EmbeddedRedis(port=first.port, dir=tmp_path / "b")
        with pytest.raises(RuntimeError, match="in use"):
            second.start()


def test_ensure_local_server_reuses_a_live_server(data_dir: Path) -> None:
    url = ensure_local_server(data_dir)
    state = json.loads((data_dir / "redis" / "server.json").read_text())
    assert url == f"redis://127.0.0.1:{state['port']}/0"
    _client(url).set("k", "v")

    assert ensure_local_server(data_dir) == url
    again = json.loads((data_dir / "redis" / "server.json").read_text())
    assert again["pid"] == state["pid"]
    assert _client(url).get("k") == "v"


def test_stop_local_server_then_ensure_restarts_with_the_data(data_dir: Path) -> None:
    url = ensure_local_server(data_dir)
    pid = json.loads((data_dir / "redis" / "server.json").read_text())["pid"]
    _client(url).hset("h", mapping={"a": "1"})

    assert stop_local_server(data_dir) is True
    assert _pid_gone(pid)
    assert not (data_dir / "redis" / "server.json").exists()
    assert stop_local_server(data_dir) is False

    url = ensure_local_server(data_dir)
    assert _client(url).hgetall("h") == {"a": "1"}
    assert (data_dir / "redis" / "appendonlydir").is_dir()


def test_a_relative_data_dir_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    try:
        url = ensure_local_server(Path("data"))
        assert _client(url).ping()
        assert (tmp_path / "data" / "redis" / "redis-server.log").exists()
        with EmbeddedRedis(dir="embedded", appendonly=True) as server:
            assert _client(server.url).ping()
        assert (tmp_path / "embedded" / "appendonlydir").is_dir()
    finally:
        assert stop_local_server(Path("data"))


def test_ensure_local_server_recovers_from_a_crashed_daemon(data_dir: Path) -> None:
    url = ensure_local_server(data_dir)
    client = _client(url)
    client.set("k", "v")
    _wait_for_aof_write(client)
    pid = json.loads((data_dir / "redis" / "server.json").read_text())["pid"]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while not _pid_gone(pid):
        assert time.monotonic() < deadline
        time.sleep(0.01)

    url = ensure_local_server(data_dir)
    assert json.loads((data_dir / "redis" / "server.json").read_text())["pid"] != pid
    assert _client(url).get("k") == "v"


def test_the_local_server_outlives_its_starter(data_dir: Path) -> None:
    """A CLI process exits; the daemon it started keeps serving the next one."""
    code = (
        "import sys; from pathlib import Path; "
        "from leaderboard.redis_server import ensure_local_server; "
        "print(ensure_local_server(Path(sys.argv[1])))"
    )
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    first = subprocess.run(
        [sys.executable, "-c", code, str(data_dir)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=60,
    )
    url = first.stdout.strip()
    assert _client(url).ping()
    assert ensure_local_server(data_dir) == url


def _kill_recorded_server(data_dir: Path) -> int:
    """kill -9 the data dir's local server (as a crash would) and wait until it is gone."""
    state = json.loads((data_dir / "redis" / "server.json").read_text())
    os.kill(state["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 5
    while not _pid_gone(state["pid"]):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    port: int = state["port"]
    return port


def test_a_killed_server_comes_back_on_its_port(data_dir: Path) -> None:
    """Connections the dead server held sit in TIME_WAIT on its port; the restart still binds
    it (as Redis does, with SO_REUSEADDR), so every client's URL stays right."""
    url = ensure_local_server(data_dir)
    clients = [_client(url) for _ in range(3)]
    for client in clients:
        client.ping()
    _kill_recorded_server(data_dir)
    assert ensure_local_server(data_dir) == url
    for client in clients:
        client.close()


def test_the_following_client_finds_a_server_restarted_on_another_port(data_dir: Path) -> None:
    client = local_server_client(data_dir, retry=Retry(NoBackoff(), 1))
    client.set("k", "v")
    _wait_for_aof_write(client)
    old_port = _kill_recorded_server(data_dir)
    with socket.socket() as squatter:  # the old port is taken: the restart must move
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", old_port))
        squatter.listen()
        url = ensure_local_server(data_dir)
        assert not url.endswith(f":{old_port}/0")
        assert client.get("k") == b"v"
    client.close()


def test_servers_started_here_collate_as_bytes_under_a_callers_non_c_locale(
        data_dir: Path, monkeypatch: pytest.MonkeyPatch, non_c_redis_server: EmbeddedRedis
) -> None:
    """A caller whose locale is en_US.UTF-8 (an operator's shell) still gets servers, the
    tests' and the CLI's daemon, that compare text in Lua as bytes: they run with LC_ALL=C
    unless LEADERBOARD_TEST_REDIS_LOCALE names another locale."""
    monkeypatch.delenv(LOCALE_VAR, raising=False)
    monkeypatch.setenv("LC_ALL", NON_C_LOCALE)
    monkeypatch.setenv("LANG", NON_C_LOCALE)
    with EmbeddedRedis() as server:
        assert collates_as_bytes(_client(server.url))
    client = _client(ensure_local_server(data_dir))
    try:
        assert collates_as_bytes(client)
    finally:
        stop_local_server(data_dir)
    monkeypatch.setenv(LOCALE_VAR, NON_C_LOCALE)
    with EmbeddedRedis() as server:
        assert not collates_as_bytes(_client(server.url))


_MAIN_THREAD_EXITS_FIRST = r'''
import ctypes, platform, sys, threading, time
threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
print("ready", flush=True)
# exit(2) of the main thread alone (not exit_group): it turns zombie, the other thread runs on
ctypes.CDLL(None).syscall({"x86_64": 60, "aarch64": 93}[platform.machine()], 0)
'''


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
def test_a_server_whose_main_thread_exited_first_is_still_running() -> None:
    """A process whose main thread is a zombie while another thread runs (a Redis shutting
    down, its AOF fsync thread still at work) counts as running: `stop_local_server` waits
    for the last thread, when the server's files and port are free."""
    child = subprocess.Popen([sys.executable, "-c", _MAIN_THREAD_EXITS_FIRST],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        deadline = time.monotonic() + 30
        while "\nState:\tZ" not in Path(f"/proc/{child.pid}/status").read_text():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert len(os.listdir(f"/proc/{child.pid}/task")) == 2
        assert _pid_alive(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not _pid_alive(child.pid)
