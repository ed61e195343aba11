"""Shared fixtures and the hypothesis settings profiles for the whole suite.

Profiles (choose with HYPOTHESIS_PROFILE, default `dev`):
  dev  a quick local run (50 examples per property, no deadline)
  ci   HYPOTHESIS_MAX_EXAMPLES examples per property (default 200), no deadline, failing
       examples printed as reproducible blobs, no example database (CI workers are fresh)

Strategies live in tests/strategies.py, never here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, settings
from strategies import FIXED_NOW, base_registry_raw

from leaderboard.registry import Registry, load_registry, parse_registry
from leaderboard.schema import EVENT_SCHEMA, LANDED_SCHEMA

REPO_ROOT = Path(__file__).resolve().parent.parent
#: The shipped real data set: a clone needs nothing beside it.
FOOTBALL_RESULTS = REPO_ROOT / "datasets/football/international_results.csv"


def _max_examples() -> int:
    raw = os.environ.get("HYPOTHESIS_MAX_EXAMPLES", "200")
    try:
        value = int(raw)
    except ValueError:
        raise pytest.UsageError(
            f"HYPOTHESIS_MAX_EXAMPLES={raw!r} is not a whole number; unset it or use e.g. 500"
        ) from None
    if value < 1:
        raise pytest.UsageError(f"HYPOTHESIS_MAX_EXAMPLES={raw!r} must be at least 1")
    return value


settings.register_profile("dev", max_examples=50, deadline=None)
settings.register_profile(
    "ci",
    max_examples=_max_examples(),
    deadline=None,
    print_blob=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# debug: find a failure fast and print it, without the (slow, on these tests) shrinking.
settings.register_profile(
    "debug", max_examples=_max_examples(), deadline=None, database=None, print_blob=True,
    phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.too_slow],
)
_PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "dev")
if _PROFILE not in ("dev", "ci", "debug"):
    raise pytest.UsageError(
        f"HYPOTHESIS_PROFILE={_PROFILE!r} is not a profile; use dev, ci or debug")
settings.load_profile(_PROFILE)


# -- running on several workers (pytest-xdist) ---------------------------------------------

#: The test files that take longest (the CI log's --durations), in that order. With several
#: workers (.ci/run: `-n 2 --dist loadfile --no-loadscope-reorder`) each file runs whole on
#: one worker, taken in collection order; these go first, so that no long file is picked up
#: last and runs alone while the other workers idle.
LONGEST_FIRST = (
    "tests/operations/test_stateful_model.py",  # 409 s of 2353 s (a loaded box, 2026-12-03)
    "tests/serving/test_lambda_identity.py",  # 384 s
    "tests/app/test_openapi_contract.py",  # 280 s
    "tests/jobs/test_engine_parity.py",  # 250 s
    "tests/dags/test_nightly_standings.py",  # 206 s
    "tests/jobs/test_batch.py",  # 146 s
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # one process: the order stays as collected
        return
    first = {path: index for index, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: first.get(item.nodeid.partition("::")[0], len(first)))


# -- clocks and environment ----------------------------------------------------------------

@pytest.fixture
def now() -> datetime:
    """A fixed landing clock (never the wall clock in tests)."""
    return FIXED_NOW


_SETTINGS_VARS = ("LEADERBOARD_DATA", "LEADERBOARD_CONFIG", "REDIS_URL", "LEADERBOARD_ENGINE",
                  "LEADERBOARD_NOW", "LEADERBOARD_BASE_CACHE_BYTES")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No LEADERBOARD_* / REDIS_URL variables from the caller's shell leak into the test."""
    for name in _SETTINGS_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# -- registries ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def registry() -> Registry:
    """The shipped default registry."""
    return load_registry()


@pytest.fixture(scope="session")
def football_registry() -> Registry:
    return load_registry("football")


@pytest.fixture(scope="session")
def football_results() -> Path:
    """The real football results CSV shipped in the repository (datasets/football, CC0)."""
    return FOOTBALL_RESULTS


@pytest.fixture
def registry_raw() -> dict[str, Any]:
    """A fresh, mutable copy of the default registry as a dict."""
    return base_registry_raw()


@pytest.fixture
def make_registry() -> Callable[..., Registry]:
    """Build a registry from a dict (default: the shipped default), after `mutate(raw)`."""

    def make(raw: dict[str, Any] | None = None,
             mutate: Callable[[dict[str, Any]], None] | None = None) -> Registry:
        raw = base_registry_raw() if raw is None else raw
        if mutate is not None:
            mutate(raw)
        return parse_registry(raw, source="<test>")

    return make


@pytest.fixture
def no_all_time_registry(make_registry: Callable[..., Registry]) -> Registry:
    """The default registry without all-time windows, so that lateness can reject events."""
    return make_registry(mutate=lambda raw: raw["board_defaults"].update(
        windows=["daily", "weekly", "monthly", "season"]))


# -- tables and the lake -------------------------------------------------------------------


@pytest.fixture
def events_table() -> Callable[..., pa.Table]:
    """rows (dicts) -> a table of EVENT_SCHEMA, or LANDED_SCHEMA if rows carry ingested_at."""

    def make(rows: list[dict[str, Any]]) -> pa.Table:
        schema = LANDED_SCHEMA if rows and "ingested_at" in rows[0] else EVENT_SCHEMA
        return pa.Table.from_pylist(rows, schema=schema)

    return make


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    """An empty lake directory (tmp_path is removed by pytest)."""
    path = tmp_path / "data" / "lake"
    path.mkdir(parents=True)
    return path


@pytest.fixture
def python_subprocess_env() -> dict[str, str]:
    """Environment for `python -c` children: the repo on sys.path, nothing else changed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


@pytest.fixture(scope="session")
def python() -> str:
    return sys.executable


@pytest.fixture(scope="session")
def redis_server() -> Any:
    """One real Redis-compatible server for the session, on a free port, no persistence,
    under the locale LEADERBOARD_TEST_REDIS_LOCALE names (C if unset)."""
    from redis_locale import start_checked

    server = start_checked(None)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def non_c_redis_server() -> Any:
    """A real Redis started under en_US.UTF-8, whatever LEADERBOARD_TEST_REDIS_LOCALE says:
    its Lua orders text by that locale's collation. Skipped where the locale is not installed
    (scripts/ensure_locale.sh installs it); failed then instead when LEADERBOARD_TEST_REDIS_LOCALE
    is set (CI), whose run promises a non-C locale."""
    from redis_locale import NON_C_LOCALE, start_checked

    from leaderboard.redis_server import LOCALE_VAR

    try:
        server = start_checked(NON_C_LOCALE)
    except RuntimeError as error:
        if os.environ.get(LOCALE_VAR):
            raise
        pytest.skip(str(error))
    yield server
    server.stop()


def _flushed_client(server: Any) -> Any:
    """A RESP2 client on a flushed server; flushed again afterwards."""
    import redis

    client = redis.Redis.from_url(server.url, protocol=2)
    client.flushall()
    yield client
    client.flushall()
    client.close()


@pytest.fixture
def redis_client(redis_server: Any) -> Any:
    """A RESP2 client on the session's server, flushed before and after."""
    yield from _flushed_client(redis_server)


@pytest.fixture
def non_c_redis(non_c_redis_server: Any) -> Any:
    """A RESP2 client on the en_US.UTF-8 server, flushed before and after."""
    yield from _flushed_client(non_c_redis_server)


def _wait_for(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    import time

    import redis

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (redis.exceptions.ConnectionError, redis.exceptions.ResponseError):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"Redis Cluster: {what} within {timeout} s")


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Any:
    """A real three-primary Redis Cluster on free ports (no replicas, no persistence): slots
    split in thirds with CLUSTER ADDSLOTSRANGE, nodes joined with CLUSTER MEET. Yields
    (client: a RedisCluster, url: its `redis+cluster://` REDIS_URL, nodes: a plain client
    per node, for FLUSHALL and per-node checks)."""
    import subprocess
    from types import SimpleNamespace

    import redis
    from redis.backoff import NoBackoff
    from redis.cluster import RedisCluster
    from redis.retry import Retry

    from leaderboard.redis_server import find_server_binary, free_port, server_env

    host, slots = "127.0.0.1", 16384
    binary = find_server_binary()
    ports = [free_port() for _ in range(3)]
    # The cluster bus defaults to port + 10000, which may be taken or past 65535: pick it.
    bus_ports = [free_port() for _ in range(3)]
    processes: list[subprocess.Popen[bytes]] = []
    nodes: list[redis.Redis] = []
    client = None
    try:
        for port, bus_port in zip(ports, bus_ports, strict=True):
            node_dir = tmp_path / f"cluster-node-{port}"
            node_dir.mkdir()
            processes.append(subprocess.Popen(
                [binary, "--port", str(port), "--bind", host, "--dir", str(node_dir),
                 "--save", "", "--appendonly", "no", "--cluster-enabled", "yes",
                 "--cluster-config-file", f"nodes-{port}.conf",
                 "--cluster-port", str(bus_port), "--cluster-node-timeout", "5000",
                 "--logfile", str(node_dir / "log")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=server_env()))
            node = redis.Redis(host=host, port=port, protocol=2, retry=Retry(NoBackoff(), 0))
            nodes.append(node)
            process = processes[-1]

            def up(node: redis.Redis = node, process: subprocess.Popen[bytes] = process,
                   log: Path = node_dir / "log") -> bool:
                if process.poll() is not None:
                    raise RuntimeError(f"{binary} exited: {log.read_text()[-2000:]}")
                return bool(node.ping())

            _wait_for(up, f"node {port} answers PING")
        bounds = [0, slots // 3, 2 * slots // 3, slots]
        for number, node in enumerate(nodes):
            node.execute_command("CLUSTER ADDSLOTSRANGE", bounds[number], bounds[number + 1] - 1)
        for port, bus_port in zip(ports[1:], bus_ports[1:], strict=True):
            nodes[0].execute_command("CLUSTER MEET", host, port, bus_port)

        def ready() -> bool:
            infos = [n.cluster("INFO") for n in nodes]
            return all(i["cluster_state"] == "ok" and int(i["cluster_known_nodes"]) == 3
                       for i in infos)

        _wait_for(ready, "all three nodes agree the cluster is ok")
        client = RedisCluster(host=host, port=ports[0], protocol=2)
        yield SimpleNamespace(client=client, url=f"redis+cluster://{host}:{ports[0]}",
                              nodes=nodes)
    finally:
        if client is not None:
            client.close()
        for node in nodes:
            node.close()
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
