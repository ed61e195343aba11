"""The top-N cache: TTL, one refresh in flight per key, bounded stale answers when Redis fails,
and keys that follow the live batch version."""

from __future__ import annotations

import threading
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from jobs.batch import run_batch
from leaderboard.lake import LandingWriter
from leaderboard.manifest import read_current
from leaderboard.redis_server import EmbeddedRedis
from leaderboard.schema import TIMESTAMP
from leaderboard.settings import Settings
from serving.cache import CacheUnavailable, TopCache
from serving.service import Leaderboards, QueryError
from speed_layer.ingest import Ingestor
from speed_layer.service import SpeedLayer

NOW = datetime(2026, 12, 1, 18, tzinfo=UTC)


class Clock:
    """A hand-driven monotonic clock."""

    def __init__(self) -> None:
        self.value = 1000.0

    def __call__(self) -> float:
        return self.value

    def advance(self, seconds: float) -> None:
        self.value += seconds


def at_once(threads: int, call):
    """`call()` from `threads` threads released together; their results or exceptions."""
    gate = threading.Barrier(threads)
    outcomes = []

    def run():
        gate.wait()
        try:
            outcomes.append(call())
        except Exception as exc:
            outcomes.append(exc)

    started = [threading.Thread(target=run) for _ in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join(10)
    return outcomes


# -- the generic cache ------------------------------------------------------------------------

def test_fresh_within_ttl_then_recomputed():
    clock = Clock()
    cache = TopCache(ttl=2.0, max_stale=60.0, clock=clock)
    calls = []

    def compute():
        calls.append(clock())
        return len(calls)

    assert cache.get("k", compute) == 1
    clock.advance(1.9)
    assert cache.get("k", compute) == 1
    clock.advance(0.2)
    assert cache.get("k", compute) == 2
    assert cache.get("other", compute) == 3  # keys are independent
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.stale) == (1, 3, 0)
    assert stats.hit_ratio == pytest.approx(1 / 4)


def test_answers_are_bounded_by_bytes_least_recently_used_first():
    """A client walking many keys of large pages: the kept answers stay under max_bytes."""
    cache = TopCache(ttl=2.0, max_stale=60.0, clock=Clock(), max_bytes=10_000)
    for i in range(1000):
        cache.get(("page", i), lambda: b"x" * 3_000)
        assert cache.stats().bytes <= 10_000
    cache.get(("page", 998), lambda: b"recomputed")  # fresh: a hit, moved to the end
    cache.get(("page", 1000), lambda: b"y" * 3_000)
    assert cache.get(("page", 998), lambda: b"again") == b"x" * 3_000
    stats = cache.stats()
    assert (stats.entries, stats.bytes) == (3, 9_000)
    cache.clear()
    assert (cache.stats().entries, cache.stats().bytes) == (0, 0)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="ttl"):
        TopCache(ttl=0)
    with pytest.raises(ValueError, match="max_stale"):
        TopCache(ttl=5, max_stale=1)


def test_stale_answers_for_a_bounded_time_when_redis_fails():
    clock = Clock()
    cache = TopCache(ttl=2.0, max_stale=10.0, clock=clock)
    assert cache.get("k", lambda: "v1") == "v1"
    clock.advance(3)

    def down():
        raise redis.ConnectionError("connection refused")

    assert cache.get("k", down) == "v1"  # stale, 3 s old
    clock.advance(6)
    assert cache.get("k", down) == "v1"  # 9 s old: still within 10 s
    clock.advance(2)
    with pytest.raises(CacheUnavailable, match="11 s old, past the 10 s limit"):
        cache.get("k", down)
    with pytest.raises(CacheUnavailable, match="never cached"):
        cache.get("cold", down)
    assert cache.stats().stale == 2
    # Back up: the next refresh succeeds and the answer is fresh again.
    assert cache.get("k", lambda: "v2") == "v2"


def test_other_errors_are_never_covered_by_a_stale_answer():
    clock = Clock()
    cache = TopCache(ttl=1.0, clock=clock)
    cache.get("k", lambda: "v1")
    clock.advance(2)

    def bad_query():
        raise QueryError("cursor is out of range")

    with pytest.raises(QueryError):
        cache.get("k", bad_query)


def test_a_cold_key_is_computed_once_for_many_threads():
    cache = TopCache(ttl=2.0)
    calls = []

    def compute():
        calls.append(threading.get_ident())
        time.sleep(0.2)  # long enough for every thread to arrive meanwhile
        return {"entries": [1, 2, 3]}

    results = at_once(16, lambda: cache.get(("tag", "global", "all-time", 10, ""), compute))
    assert len(calls) == 1
    assert len(results) == 16
    assert all(r is results[0] for r in results)
    stats = cache.stats()
    assert stats.misses == 1
    assert stats.coalesced + stats.hits == 15


def test_waiters_share_the_leaders_failure():
    cache = TopCache(ttl=2.0)

    def compute():
        time.sleep(0.1)
        raise redis.ConnectionError("down")

    outcomes = at_once(4, lambda: cache.get("k", compute))
    assert len(outcomes) == 4
    assert all(isinstance(o, CacheUnavailable) for o in outcomes)
    assert cache.stats().failures <= 2  # one leader (a late thread may lead a second try)


# -- on a real Redis ---------------------------------------------------------------------------

def _events(rows: list[tuple[str, str, int, str]]) -> pa.Table:
    """(match_id, player_id, points, region) rows played on 2026-11-30 10:00."""
    at = datetime(2026, 11, 30, 10, tzinfo=UTC)
    return pa.table({
        "match_id": [r[0] for r in rows], "player_id": [r[1] for r in rows],
        "points": pa.array([r[2] for r in rows], pa.int64()),
        "event_time": pa.array([at] * len(rows), TIMESTAMP),
        "region": [r[3] for r in rows], "mode": ["ranked"] * len(rows),
        "server_id": ["s1"] * len(rows)})


def _land(settings: Settings, speed: SpeedLayer, table: pa.Table, at: datetime) -> None:
    with LandingWriter(settings.lake_dir, "t") as writer:
        Ingestor(settings.registry, writer, speed).ingest(table, now=at, source="t")


@pytest.fixture
def own_redis():
    """A server of the test's own, which the test may kill."""
    with EmbeddedRedis() as server:
        yield server


@pytest.mark.redis
def test_stale_path_when_redis_is_killed(own_redis, tmp_path):
    settings = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path)})
    client = redis.Redis.from_url(own_redis.url, protocol=2, socket_timeout=1,
                                  socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    speed = SpeedLayer(client, settings.registry, settings.lake_dir)
    _land(settings, speed, _events([("m1", "ann", 5, "na"), ("m1", "bob", 3, "na")]),
          NOW - timedelta(hours=1))
    boards = Leaderboards(settings.lake_dir, settings.registry, client, now=lambda: NOW)
    clock = Clock()
    cache = TopCache(ttl=2.0, max_stale=30.0, clock=clock)
    first = cache.top(boards, "region:na", 10, "all-time")
    assert [e["player_id"] for e in first["entries"]] == ["ann", "bob"]

    own_redis.kill()
    assert cache.top(boards, "region:na", 10, "all-time") == first  # fresh hit, no Redis
    clock.advance(5)
    started = time.perf_counter()
    assert cache.top(boards, "region:na", 10, "all-time") == first  # stale
    assert cache.top(boards, "region:na", 10, "all-time") == first  # stale, no new attempt
    assert time.perf_counter() - started < 2.0
    assert cache.stats().stale == 2
    with pytest.raises(CacheUnavailable, match="never cached"):
        cache.top(boards, "region:na", 5, "all-time")  # another key was never cached
    clock.advance(30)
    with pytest.raises(CacheUnavailable, match="past the 30 s limit"):
        cache.top(boards, "region:na", 10, "all-time")
    with pytest.raises(QueryError):
        cache.top(boards, "region:moon", 10, "all-time")  # still checked, Redis or not
    client.close()


@pytest.mark.redis
def test_threads_on_a_cold_key_cause_one_computation(redis_client, tmp_path):
    settings = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path)})
    speed = SpeedLayer(redis_client, settings.registry, settings.lake_dir)
    _land(settings, speed, _events([("m1", f"p{i}", i, "eu") for i in range(20)]),
          NOW - timedelta(hours=1))
    boards = Leaderboards(settings.lake_dir, settings.registry, redis_client, now=lambda: NOW)
    computed = []
    real_top = boards.top

    def counting_top(*args, **kwargs):
        computed.append(args)
        time.sleep(0.2)
        return real_top(*args, **kwargs)

    boards.top = counting_top  # type: ignore[method-assign]
    cache = TopCache(ttl=5.0)
    answers = at_once(8, lambda: cache.top(boards, "region:eu", 5, "season"))
    assert len(computed) == 1
    assert len(answers) == 8
    assert [e["player_id"] for e in answers[0]["entries"]] == ["p19", "p18", "p17", "p16", "p15"]
    assert answers[0]["window"] == "season:2026-S4"
    assert all(a is answers[0] for a in answers)


@pytest.mark.redis
def test_a_rebase_is_a_new_key(redis_client, tmp_path):
    """The key carries the version tag: once the speed layer moves onto a new batch version,
    the cached answer of the old one is not served, even within the TTL."""
    settings = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path)})
    speed = SpeedLayer(redis_client, settings.registry, settings.lake_dir)
    _land(settings, speed, _events([("m1", "ann", 5, "na")]), datetime(2026, 11, 30, 12,
                                                                         tzinfo=UTC))
    boards = Leaderboards(settings.lake_dir, settings.registry, redis_client, now=lambda: NOW)
    cache = TopCache(ttl=5.0)
    before = cache.top(boards, "global", 10)
    run_batch(settings, date(2026, 11, 30))
    speed.rebase(read_current(settings.lake_dir))
    _land(settings, speed, _events([("m2", "bob", 9, "na")]), NOW - timedelta(hours=1))
    after = cache.top(boards, "global", 10)
    assert cache.stats().misses == 2
    assert [e["player_id"] for e in before["entries"]] == ["ann"]
    assert [e["player_id"] for e in after["entries"]] == ["bob", "ann"]


def test_unknown_board_is_not_cached(tmp_path):
    settings = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path)})
    client = redis.Redis(port=1)  # never contacted: the board is checked first
    boards = Leaderboards(Path(tmp_path), settings.registry, client, now=lambda: NOW)
    with pytest.raises(QueryError, match="unknown board"):
        TopCache().top(boards, "nope", 10)
