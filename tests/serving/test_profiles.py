"""Display names in every listing: one HMGET per answer, reloaded from the lake when Redis
lost them, the latest write kept whatever order writes and reloads race in, and the top-N
cache forgetting the pages that list a renamed player."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest

from leaderboard.lake import LandingWriter
from leaderboard.profiles import PROFILES_KEY, Profile, write_profile
from leaderboard.schema import TIMESTAMP
from leaderboard.settings import Settings
from serving.cache import TopCache
from serving.profiles import ProfileCache
from serving.service import Leaderboards
from speed_layer.ingest import Ingestor
from speed_layer.service import SpeedLayer

pytestmark = pytest.mark.redis

NOW = datetime(2026, 12, 1, 18, tzinfo=UTC)


@pytest.fixture
def world(tmp_path, redis_client):
    """ann 9, bob 5, carol 3 on region:na (speed layer only); ann and carol named."""
    settings = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path)})
    speed = SpeedLayer(redis_client, settings.registry, settings.lake_dir)
    rows = [("ann", 9), ("bob", 5), ("carol", 3)]
    table = pa.table({
        "match_id": ["m1"] * 3, "player_id": [r[0] for r in rows],
        "points": pa.array([r[1] for r in rows], pa.int64()),
        "event_time": pa.array([NOW - timedelta(hours=2)] * 3, TIMESTAMP),
        "region": ["na"] * 3, "mode": ["ranked"] * 3, "server_id": ["s1"] * 3})
    with LandingWriter(settings.lake_dir, "t") as writer:
        Ingestor(settings.registry, writer, speed).ingest(table, now=NOW - timedelta(hours=1),
                                                          source="t")
    boards = Leaderboards(settings.lake_dir, settings.registry, redis_client, now=lambda: NOW)
    for player, name in (("ann", "Ann Lee"), ("carol", "대한민국")):
        boards.profiles.store([write_profile(settings.lake_dir, Profile(player, name), NOW,
                                             "s1")])
    assert boards.profiles.get("ann") is not None  # the first read loads the hash
    return boards


def _names(entries):
    return [(e["player_id"], e["display_name"]) for e in entries]


def _hmgets(client) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_hmget", {}).get("calls", 0))


def _lookups(client) -> int:
    """Every per-player profile lookup a listing might make instead of its one HMGET."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0))
               for c in ("hget", "hgetall", "hexists"))


def test_every_listing_carries_display_names_in_one_hmget(world, redis_client):
    ann, bob, carol = ("ann", "Ann Lee"), ("bob", None), ("carol", "대한민국")
    answers = {
        "top": lambda: world.top("region:na", 10)["entries"],
        "around": lambda: [a := world.around("region:na", "bob", 1), *a["above"], a["player"],
                           *a["below"]][1:],
        "friends": lambda: world.friends("region:na", ["carol", "ann", "bob"])["entries"],
        "player": lambda: [world.player("region:na", "carol")],
    }
    expected = {"top": [ann, bob, carol], "around": [ann, bob, carol],
                "friends": [ann, bob, carol], "player": [carol]}
    for name, ask in answers.items():
        hmgets, lookups = _hmgets(redis_client), _lookups(redis_client)
        assert _names(ask()) == expected[name], name
        assert _hmgets(redis_client) - hmgets == 1, name  # one batch per answer
        assert _lookups(redis_client) == lookups, name  # never one lookup per player
    unranked = world.player("region:na", "nobody")
    assert (unranked["status"], unranked["display_name"]) == ("unranked", None)


def test_after_redis_loses_the_profiles_they_are_reloaded_from_the_lake(world, redis_client):
    redis_client.delete(PROFILES_KEY)  # what a flush or a restart without AOF leaves
    assert _names(world.top("region:na", 10)["entries"]) == [
        ("ann", "Ann Lee"), ("bob", None), ("carol", "대한민국")]
    assert redis_client.hexists(PROFILES_KEY, "")  # marked loaded: the next read is one HMGET
    hmgets = _hmgets(redis_client)
    world.top("region:na", 10)
    assert _hmgets(redis_client) - hmgets == 1


def test_the_latest_write_wins_whatever_order_the_cache_sees(world, redis_client, tmp_path):
    lake = world.lake
    older = write_profile(lake, Profile("bob", "Bob v1"), NOW, "s1")
    newer = write_profile(lake, Profile("bob", "Bob v2", "BR"), NOW, "s2")
    cache = ProfileCache(redis_client, lake)
    assert cache.store([newer]) == 1
    assert cache.store([older]) == 0  # a slower writer's older write does not overwrite
    cache.reload()  # a reload from the lake (e.g. racing the write) keeps it too
    assert cache.get("bob") == {"player_id": "bob", "display_name": "Bob v2", "country": "BR",
                                "avatar_url": None, "updated_at": "2026-12-01T18:00:00Z"}
    assert cache.get("zed") is None


def test_the_top_cache_forgets_pages_listing_a_renamed_player(world, redis_client):
    cache = TopCache(ttl=5.0, max_stale=60.0)
    page = cache.top(world, "region:na", 2)  # ann, bob
    other = cache.top(world, "region:eu", 2)  # lists neither
    assert _names(page["entries"]) == [("ann", "Ann Lee"), ("bob", None)]
    world.profiles.store([write_profile(world.lake, Profile("bob", "Robert"), NOW, "s1")])
    assert cache.top(world, "region:na", 2) is page  # within the TTL: the kept page
    assert cache.forget_players(["bob"]) == 1
    assert _names(cache.top(world, "region:na", 2)["entries"]) == [("ann", "Ann Lee"),
                                                                   ("bob", "Robert")]
    assert cache.top(world, "region:eu", 2) is other  # untouched: still the kept answer
    assert cache.forget_players(["carol"]) == 0


def test_names_are_found_by_prefix_and_a_rename_moves_the_entry(world, redis_client):
    profiles = world.profiles
    assert [p["player_id"] for p in profiles.find("ann")] == ["ann"]  # any case
    assert [p["player_id"] for p in profiles.find("ANN L")] == ["ann"]
    assert profiles.find("대한")[0]["display_name"] == "대한민국"
    profiles.store([write_profile(world.lake, Profile("bob", "Annika"), NOW, "s1")])
    assert [p["player_id"] for p in profiles.find("ann")] == ["ann", "bob"]  # by name
    assert [p["player_id"] for p in profiles.find("ann", limit=1)] == ["ann"]
    profiles.store([write_profile(world.lake, Profile("ann", "Zoe"), NOW, "s1")])
    assert [p["player_id"] for p in profiles.find("ann")] == ["bob"]  # the old name is gone
    assert profiles.find("") == []
    redis_client.flushall()  # the index goes with the hash, and comes back with it
    assert [p["player_id"] for p in profiles.find("z")] == ["ann"]


def test_forget_removes_the_profile_and_its_name(world, redis_client):
    from jobs.erase import erase_from_lake

    erase_from_lake(world.lake, world.registry, "ann", at=NOW)
    assert world.profiles.forget("ann")
    assert world.profiles.get("ann") is None
    assert world.profiles.find("ann") == []
    assert not world.profiles.forget("ann")
    redis_client.delete(PROFILES_KEY)  # a reload after a loss does not bring it back
    assert world.profiles.get("ann") is None
    assert world.profiles.get("carol")["display_name"] == "대한민국"


@pytest.mark.slow
def test_the_profile_cache_on_a_redis_cluster(redis_cluster, tmp_path):
    """The hash and its name index share a slot: the script, the reload, the search and
    forget run on a three-node cluster as on one server."""
    lake = tmp_path / "lake"
    cache = ProfileCache(redis_cluster.client, lake)
    stored = [write_profile(lake, Profile(f"p{i}", f"Player {i}"), NOW, "s") for i in range(5)]
    assert cache.store(stored) == 5
    assert cache.names(["p1", "p9", "p3"]) == ["Player 1", None, "Player 3"]
    assert [p["player_id"] for p in cache.find("player 1")] == ["p1"]
    assert cache.forget("p1")
    for node in redis_cluster.nodes:
        node.flushall()
    assert cache.names(["p0", "p1"]) == ["Player 0", "Player 1"]  # reloaded from the lake


@pytest.mark.parametrize("same_order", [False, True])
def test_orders_compare_as_bytes_on_a_redis_under_en_us(non_c_redis, tmp_path, same_order):
    """A cached profile is replaced only by a write of a greater order compared as bytes,
    as the lake log sorts orders, also on a Redis started under en_US.UTF-8 (whose collation
    puts 'a' before 'B'): 'a1' replaces 'B1', and 'B1' then does not replace 'a1'."""
    cache = ProfileCache(non_c_redis, tmp_path / "lake")
    older, newer = Profile("bob", "Bob v1", order="B1"), Profile("bob", "Bob v2", order="a1")
    assert cache.store([older], same_order=same_order) == 1
    assert cache.store([newer], same_order=same_order) == 1
    assert cache.store([older], same_order=same_order) == 0
    assert non_c_redis.hget(PROFILES_KEY, "bob").startswith(b"a1\n")
