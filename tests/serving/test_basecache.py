"""The base cache: least recently used first out, bounded by bytes, whatever a client walks."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pytest
from lakes import land, write_registry

from jobs.batch import run_batch
from leaderboard.manifest import read_current
from leaderboard.settings import Settings
from serving.base import BaseBoard
from serving.basecache import ENTRY_OVERHEAD, BaseCache
from serving.service import Leaderboards
from speed_layer.service import SpeedLayer


def _base(players: int) -> BaseBoard:
    keys = np.arange(players, 0, -1, dtype=np.int64)
    return BaseBoard.of(keys, pa.array([f"p{i:05d}" for i in range(players)], pa.string()))


def test_least_recently_used_leaves_first_and_bytes_stay_under_the_bound():
    size = _base(100).nbytes() + ENTRY_OVERHEAD
    cache = BaseCache(max_bytes=3 * size)
    loads: list[str] = []

    def loader(name: str):
        return lambda: loads.append(name) or _base(100)

    for name in "abc":
        cache.get(("v1", "global", name), loader(name))
    cache.get(("v1", "global", "a"), loader("a"))  # a is now the most recent
    cache.get(("v1", "global", "d"), loader("d"))  # b leaves
    assert loads == ["a", "b", "c", "d"]
    stats = cache.stats()
    assert (stats.entries, stats.bytes, stats.evictions) == (3, 3 * size, 1)
    cache.get(("v1", "global", "a"), loader("a"))
    cache.get(("v1", "global", "b"), loader("b"))  # reloaded
    assert loads == ["a", "b", "c", "d", "b"]


def test_a_base_larger_than_the_bound_is_served_not_kept(caplog):
    cache = BaseCache(max_bytes=ENTRY_OVERHEAD + 10)
    cache.get(("v1", "global", "small"), lambda: _base(0))
    big = cache.get(("v1", "global", "big"), lambda: _base(1000))
    assert big.size == 1000
    stats = cache.stats()
    assert (stats.entries, stats.bytes, stats.oversized, stats.evictions) == (
        1, ENTRY_OVERHEAD, 1, 0)
    assert "LEADERBOARD_BASE_CACHE_BYTES" in caplog.text


def test_empty_windows_count_too():
    """Thousands of empty windows cost the objects around their (empty) arrays."""
    cache = BaseCache(max_bytes=100 * ENTRY_OVERHEAD)
    for day in range(5000):
        cache.get(("v1", "global", f"daily:{day}"), lambda: _base(0))
    stats = cache.stats()
    assert (stats.entries, stats.evictions) == (100, 4900)


def test_a_new_version_drops_the_old_ones_entries():
    cache = BaseCache()
    cache.get(("v1", "global", "all-time"), lambda: _base(10))
    cache.get(("v2", "global", "all-time"), lambda: _base(20))
    cache.keep_version("v2")
    stats = cache.stats()
    assert (stats.entries, stats.bytes, stats.evictions) == (
        1, _base(20).nbytes() + ENTRY_OVERHEAD, 0)


# -- a client walking every daily window of five years, on a published lake ------------------

_DAYS = 5 * 365
_START = datetime(2021, 12, 1, tzinfo=UTC)


@pytest.mark.redis
def test_walking_thousands_of_windows_stays_under_the_bound(redis_client, tmp_path):
    """Every daily window of five years (1,825 ids with standings, and 400 before any data),
    with a bound of ~60 windows: the cache never holds more than the bound, evicts, and every
    answer equals the day's standings computed from the events."""
    rng = random.Random(11)
    events, expected = [], defaultdict(lambda: defaultdict(int))
    for number in range(_DAYS):
        at = _START + timedelta(days=number, hours=rng.randrange(20))
        for player in rng.sample(range(40), rng.randint(1, 12)):
            points = rng.randrange(0, 50)
            events.append({"match_id": f"m{number}", "player_id": f"p{player:02d}",
                           "points": points, "event_time": at, "region": "na",
                           "mode": "ranked", "server_id": "s1",
                           # late by up to six days: within grace, so one file a week
                           "ingested_at": at.replace(hour=23) + timedelta(
                               days=6 - at.weekday())})
            expected[f"daily:{at.date().isoformat()}"][f"p{player:02d}"] += points
    raw = {"regions": ["na"], "modes": ["ranked"], "limits": {"grace": "8d"},
           "board_defaults": {"windows": ["daily", "all-time"], "max_points": 100},
           "boards": [{"scope": "global"}]}
    write_registry(tmp_path / "registry.toml", raw)
    settings = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path),
                                  "LEADERBOARD_CONFIG": str(tmp_path / "registry.toml"),
                                  "LEADERBOARD_BASE_CACHE_BYTES": "96KiB"})
    land(settings.lake_dir, settings.registry, events, batch_minutes=60)
    last = (_START + timedelta(days=_DAYS + 7)).date()
    run_batch(settings, last)
    redis_client.flushall()
    SpeedLayer(redis_client, settings.registry, settings.lake_dir).rebase(
        read_current(settings.lake_dir))
    boards = Leaderboards(settings.lake_dir, settings.registry, redis_client,
                          now=lambda: datetime.combine(last, datetime.min.time(), UTC),
                          base_cache_bytes=settings.base_cache_bytes)
    bound = settings.base_cache_bytes
    peak = 0
    first = _START.date() - timedelta(days=400)
    ids = [f"daily:{first + timedelta(days=d)}" for d in range(400 + _DAYS)]
    for window_id in ids + random.Random(3).sample(ids, 200):  # then some again, reloaded
        answer = boards.top("global", 50, window_id)
        scores = expected.get(window_id, {})
        want = sorted(scores.items(), key=lambda item: (-item[1], item[0]))
        assert [(e["player_id"], e["score"]) for e in answer["entries"]] == want, window_id
        stats = boards.bases.stats()
        assert stats.bytes <= bound
        peak = max(peak, stats.bytes)
    stats = boards.bases.stats()
    assert stats.evictions > len(ids) - stats.entries - 1
    assert 30 < stats.entries < 200
    assert peak > bound // 2
