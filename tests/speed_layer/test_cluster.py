"""The fold and the door unchanged on a three-node Redis Cluster.

Every script call's keys share one hash tag (`{board|window}` for the fold, a bucket group
for the door), so each call stays in one slot; the global keys (`lb:current`, `lb:banned`,
`lb:<tag>:progress`, `lb:<tag>:windows`) are single-key commands. The merged state must
equal a single-node run of the same stream, and the reference standings.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
from lakes import EXOTIC, day, land, random_stream, registry_from
from oracle import reference_standings
from redis.cluster import RedisCluster

from leaderboard.lake import LandingWriter, landed_files
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


@pytest.fixture
def cluster(redis_cluster: Any) -> RedisCluster:
    """The cluster client of tests/conftest.py's three-node cluster."""
    return redis_cluster.client


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


def test_rows_in_flight_at_a_dead_writer_land_once_on_a_cluster(cluster, tmp_path):
    """The claim script reads the group's holders hash and the holder's in-flight key (same
    hash tag, so the same slot): a copy is held back while the holder is landing, and lands
    once the holder is dead (its landing lock free)."""
    registry = load_registry()
    lake = tmp_path / "lake"
    speed = SpeedLayer(cluster, registry, lake)
    at, table = batches(random_stream(33, start=START, duplicate_share=0.0))[0]
    with LandingWriter(lake, "b") as b:
        ingestor = Ingestor(registry, b, speed)
        with LandingWriter(lake, "a") as a, a.landing():
            speed.claim(table, at, "a", a.next_seq)  # a claimed, then dies before landing
            held = ingestor.ingest(table, now=at, source="t")
            assert (held.accepted, held.in_flight) == (0, table.num_rows)
        landed = ingestor.ingest(table, now=at, source="t")
        assert (landed.accepted, landed.retries, landed.in_flight) == (table.num_rows, 0, 0)
    assert speed.door.writers_in_flight() == set()


def test_ban_unban_and_rebuild_on_a_cluster_restore_exactly(cluster, tmp_path):
    """An unban replays the player's folded rows in one MULTI per board-window: on a cluster
    that MULTI holds EVALSHA calls (redis-py's cluster pipeline refused `.evalsha`)."""
    registry = load_registry()
    lake = tmp_path / "lake"
    speed = SpeedLayer(cluster, registry, lake)
    land(lake, registry, random_stream(33, start=START, duplicate_share=0.0), speed=speed)
    version = speed.current()
    before = merged(cluster, version.tag)
    player = max(before[("global", "all-time")].items(), key=lambda item: item[1])[0]
    at = START + timedelta(days=5)
    assert speed.ban(player, at) > 0
    assert all(player not in board for board in merged(cluster, version.tag).values())
    assert speed.unban(player, at + timedelta(minutes=1)) > 0
    assert merged(cluster, version.tag) == before
    # A rebuild over a live state deletes its keys (one DEL over many slots, split by the
    # client) before folding the lake again: the same state, under a new epoch.
    assert speed.rebuild(at + timedelta(minutes=2)) == len(landed_files(lake))
    assert speed.current().epoch != version.epoch
    assert merged(cluster, version.tag) == before


def test_voids_on_a_cluster_equal_a_single_node(cluster, redis_client, tmp_path):
    """A void recomputes each voided player's board-windows in one MULTI per board-window
    (audit of issue 12: voids had no cluster test). A whole match's void and one player's
    void of another match leave the cluster's merged state equal to a single node's run
    of the same stream and voids, and to the reference standings of the lake with them."""
    registry = registry_from(MIXED)
    events = random_stream(34, start=START, duplicate_share=0.0)
    states = []
    for name, client in (("cluster", cluster), ("single", redis_client)):
        lake = tmp_path / name / "lake"
        speed = SpeedLayer(client, registry, lake)
        land(lake, registry, events, speed=speed)
        whole, other = sorted({e["match_id"] for e in events})[:2]
        player = next(e["player_id"] for e in events if e["match_id"] == other)
        at = START + timedelta(days=5)
        assert speed.void(whole, None, at, "exploit")
        assert speed.void(other, player, at, "typo") == [player]
        states.append(merged(client, speed.current().tag))
    assert states[0] == states[1]
    assert states[0] == reference(tmp_path / "cluster" / "lake", registry)
