"""The fold and the door unchanged on a three-node Redis Cluster.

Every script call's keys share one hash tag (`{board|window}` for the fold, a bucket group
for the door), so each call stays in one slot; the global keys (`lb:current`, `lb:banned`,
`lb:<tag>:progress`, `lb:<tag>:windows`) are single-key commands. The merged state must
equal a single-node run of the same stream, and the reference standings.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
from lakes import EXOTIC, day, land, random_stream, registry_from
from oracle import reference_standings
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from leaderboard.lake import LandingWriter, landed_files
from leaderboard.redis_server import find_server_binary, free_port
from leaderboard.registry import Registry, load_registry
from leaderboard.schema import TIMESTAMP
from leaderboard.speed_keys import SpeedVersion
from speed_layer.fold import Folder
from speed_layer.ingest import Ingestor
from speed_layer.service import SpeedLayer

pytestmark = pytest.mark.redis

START = day("2026-11-28")
#: EXOTIC plus a `sum` board ranked ascending (the fold's ZINCRBY path with a negative sign).
MIXED = {**EXOTIC, "boards": [*EXOTIC["boards"],
                              {"scope": "global", "name": "fewest", "order": "asc"}]}
_SLOTS = 16384
_HOST = "127.0.0.1"


def merged(client: redis.Redis | RedisCluster, tag: str) -> dict[tuple[str, str], dict[str, int]]:
    """Every board-window's M of a version as {player: key}."""
    found = {}
    for raw in client.scan_iter(match=f"lb:{{*}}:{tag}:M", count=1000):
        name = raw.decode()
        board, window_id = name[name.index("{") + 1:name.index("}")].split("|", 1)
        found[(board, window_id)] = {p.decode(): int(s) for p, s in
                                     client.zrange(raw, 0, -1, withscores=True)}
    return found


def reference(lake: Path, registry: Registry) -> dict[tuple[str, str], dict[str, int]]:
    return {k: {r.player_id: r.sort_key for r in rows}
            for k, rows in reference_standings(lake, registry, None).items() if rows}


def batches(events: list[dict]) -> list[tuple]:
    """Hourly landing batches: [(landing time, table)]."""
    slots: dict = {}
    for event in events:
        slot = event["ingested_at"].replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
        slots.setdefault(slot, []).append(event)
    return [(slot, pa.table({
        "match_id": [r["match_id"] for r in rows], "player_id": [r["player_id"] for r in rows],
        "points": pa.array([r["points"] for r in rows], pa.int64()),
        "event_time": pa.array([r["event_time"] for r in rows], TIMESTAMP),
        "region": [r["region"] for r in rows], "mode": [r["mode"] for r in rows],
        "server_id": ["s1"] * len(rows)})) for slot, rows in sorted(slots.items())]


def _wait(check, what: str, timeout: float = 20.0) -> None:
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
def cluster(tmp_path: Path) -> Iterator[RedisCluster]:
    """Three primaries on free ports, no replicas, no persistence; slots split in thirds
    with CLUSTER ADDSLOTSRANGE and the nodes joined with CLUSTER MEET."""
    binary = find_server_binary()
    ports = [free_port() for _ in range(3)]
    # The cluster bus defaults to port + 10000, which may be taken or past 65535: pick it.
    bus_ports = [free_port() for _ in range(3)]
    processes: list[subprocess.Popen[bytes]] = []
    nodes: list[redis.Redis] = []
    client = None
    try:
        for port, bus_port in zip(ports, bus_ports, strict=True):
            node_dir = tmp_path / f"node-{port}"
            node_dir.mkdir()
            processes.append(subprocess.Popen(
                [binary, "--port", str(port), "--bind", _HOST, "--dir", str(node_dir),
                 "--save", "", "--appendonly", "no", "--cluster-enabled", "yes",
                 "--cluster-config-file", f"nodes-{port}.conf",
                 "--cluster-port", str(bus_port), "--cluster-node-timeout", "5000",
                 "--logfile", str(node_dir / "log")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            node = redis.Redis(host=_HOST, port=port, protocol=2,
                               retry=Retry(NoBackoff(), 0))
            nodes.append(node)
            process = processes[-1]

            def up(node: redis.Redis = node, process: subprocess.Popen[bytes] = process,
                   log: Path = node_dir / "log") -> bool:
                if process.poll() is not None:
                    raise RuntimeError(f"{binary} exited: {log.read_text()[-2000:]}")
                return bool(node.ping())

            _wait(up, f"node {port} answers PING")
        bounds = [0, _SLOTS // 3, 2 * _SLOTS // 3, _SLOTS]
        for number, node in enumerate(nodes):
            node.execute_command("CLUSTER ADDSLOTSRANGE", bounds[number],
                                 bounds[number + 1] - 1)
        for port, bus_port in zip(ports[1:], bus_ports[1:], strict=True):
            nodes[0].execute_command("CLUSTER MEET", _HOST, port, bus_port)

        def ready() -> bool:
            infos = [n.cluster("INFO") for n in nodes]
            return all(i["cluster_state"] == "ok" and int(i["cluster_known_nodes"]) == 3
                       for i in infos)

        _wait(ready, "all three nodes agree the cluster is ok")
        client = RedisCluster(host=_HOST, port=ports[0], protocol=2)
        yield client
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


def _nodes_holding(client: RedisCluster, pattern: str) -> set[str]:
    """The primaries holding at least one key matching pattern."""
    found = set()
    for node in client.get_primaries():
        if next(node.redis_connection.scan_iter(match=pattern, count=1000), None) is not None:
            found.add(node.name)
    return found


@pytest.mark.parametrize("registry_name", ["default", "mixed"])
def test_fold_on_a_cluster_equals_a_single_node(cluster, redis_client, tmp_path,
                                                registry_name):
    registry = load_registry() if registry_name == "default" else registry_from(MIXED)
    lake = tmp_path / "lake"
    land(lake, registry, random_stream(31, start=START, duplicate_share=0.0,
                                       points=(-5, 0, 3, 3, 7, 20, 20)
                                       if registry_name == "mixed" else (0, 1, 3, 5, 5, 10)))
    version = SpeedVersion(None, None)
    files = len(landed_files(lake))
    assert Folder(cluster, registry, lake).catch_up(version) == files
    assert Folder(redis_client, registry, lake).catch_up(version) == files
    on_cluster = merged(cluster, version.tag)
    assert on_cluster == merged(redis_client, version.tag)
    assert on_cluster == reference(lake, registry)
    # The board-windows really are spread over the nodes, and folding again is a no-op.
    assert len(_nodes_holding(cluster, f"lb:{{*}}:{version.tag}:M")) > 1
    folder = Folder(cluster, registry, lake)
    for landed in landed_files(lake):
        assert folder.fold(version, landed.writer, landed.seq, pq.read_table(landed.path)) == 0
    assert merged(cluster, version.tag) == on_cluster


def test_ingest_with_the_door_on_a_cluster(cluster, redis_client, tmp_path):
    registry = load_registry()
    events = random_stream(32, start=START, duplicate_share=0.0)
    runs = {}
    for name, client in (("cluster", cluster), ("single", redis_client)):
        lake = tmp_path / name / "lake"
        speed = SpeedLayer(client, registry, lake)
        retries = 0
        with LandingWriter(lake, "w") as writer:
            ingestor = Ingestor(registry, writer, speed)
            for at, table in batches(events):
                for _ in range(2):  # every batch delivered twice: the door drops the retry
                    retries += ingestor.ingest(table, now=at, source="t").retries
        assert retries == len(events)
        runs[name] = merged(client, "none")
        assert runs[name] == reference(lake, registry)
        used, ids = speed.door.memory()
        assert ids == len(events)
        assert used > 0
    assert runs["cluster"] == runs["single"]
    assert len(_nodes_holding(cluster, "lb:ids:*")) > 1
