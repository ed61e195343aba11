"""top_score(y) on the merged board (docs/design.md section 6) against an independent oracle.

The oracle knows nothing of sort keys, Redis or counting: it lists the merged board's scores
best first (higher first on `desc` boards, lower first on `asc`) and reads the score at
position ceil(y/100 * total). Boards are built straight from scores: a base (the batch's
standings) and a speed state (M, T) written the way the speed layer keeps it, on real Redis.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lakes import EXOTIC, land, write_registry
from strategies import percentile_boards

from jobs.batch import run_batch
from leaderboard.manifest import read_current
from leaderboard.percentile import position_for, top_percent
from leaderboard.registry import load_registry
from leaderboard.settings import Settings
from leaderboard.sortkey import encode
from leaderboard.speed_keys import BoardWindowKeys
from serving.base import BaseBoard
from serving.merge import MergedBoard
from serving.percentiles import FANOUT, keys_at
from serving.service import Leaderboards, QueryError
from speed_layer.service import SpeedLayer

pytestmark = pytest.mark.redis

_BITS = 8
_PERCENTS = [Decimal(y) for y in (1, 2, 10, 25, 33, 34, 50, 66, 67, 99, 100)] + [
    Decimal("0.1"), Decimal("0.5"), Decimal("12.5"), Decimal("99.9")]


def oracle_top_score(scores: list[int], order: str, percent: Decimal) -> int | None:
    """The score at position ceil(percent/100 * n) of the scores listed best first."""
    if not scores:
        return None
    listed = sorted(scores, reverse=order == "desc")
    position = math.ceil(percent * len(listed) / 100)
    return listed[position - 1]


class World:
    """A board-window from plain scores: base {player: score}, speed {player: score or None
    (removed, e.g. banned)}; the merged board is base overridden by speed."""

    def __init__(self, client, order: str, ties: str, base: dict[str, int],
                 speed: dict[str, int | None], seed: int = 0) -> None:
        rng = random.Random(seed)
        times = {p: rng.randrange(1 << _BITS) for p in {*base, *speed}}
        bits = _BITS if ties == "earliest" else 0

        def key(player: str, score: int) -> int:
            return encode(score, order=order, ties=ties, t=times[player], time_bits=bits)

        registry = load_registry()
        board = dataclasses.replace(registry.board("global"), order=order, ties=ties)
        window = registry.calendar.resolve("all-time", datetime(2026, 12, 3, tzinfo=UTC))
        listed = sorted(((key(p, s), p) for p, s in base.items()), key=lambda e: (-e[0], e[1]))
        keys = np.array([k for k, _ in listed], dtype=np.int64)
        ids = pa.array([p for _, p in listed], pa.string())
        self.redis_keys = BoardWindowKeys(board.name, window.id, f"test-{seed}")
        client.delete(*self.redis_keys.all())
        merged = {p: key(p, s) for p, s in speed.items() if s is not None}
        touched = {p: key(p, base[p]) for p in speed if p in base}
        if merged:
            client.zadd(self.redis_keys.merged, merged)
        if touched:
            client.zadd(self.redis_keys.touched, touched)
        self.board = MergedBoard(board, window, bits,
                                 BaseBoard.of(keys, ids, ordinal=ties == "earliest"),
                                 client, self.redis_keys)
        self.order = order
        final = {**base, **speed}
        self.scores = [s for s in final.values() if s is not None]

    def check(self, percents: list[Decimal]) -> None:
        total, keys = keys_at(self.board, percents)
        assert total == len(self.scores)
        got = [None if k is None else self.board.score_of(k) for k in keys]
        want = [oracle_top_score(self.scores, self.order, p) for p in percents]
        assert got == want, list(zip(percents, got, want, strict=True))


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=percentile_boards(), percents=st.lists(
    st.decimals(min_value=Decimal("0.01"), max_value=100, places=2), max_size=6))
def test_top_score_equals_the_oracle_on_small_boards(redis_client, drawn, percents):
    world = World(redis_client, drawn["order"], drawn["ties"], drawn["base"], drawn["speed"])
    world.check(_PERCENTS + percents)


def _large(order: str, ties: str, base_size: int, speed_size: int, seed: int
           ) -> tuple[dict[str, int], dict[str, int | None]]:
    rng = random.Random(seed)
    base = {f"b{i:06d}": rng.randrange(0, 500) for i in range(base_size)}
    names = list(base)
    speed: dict[str, int | None] = {}
    for i in range(speed_size):
        if names and rng.random() < 0.5:
            player = rng.choice(names)  # a base player moves (or leaves)
            speed[player] = None if rng.random() < 0.1 else rng.randrange(0, 700)
        else:
            speed[f"s{i:06d}"] = rng.randrange(-100, 700)
    return base, speed


@pytest.mark.parametrize("order", ["desc", "asc"])
@pytest.mark.parametrize("ties", ["shared", "earliest"])
@pytest.mark.parametrize(("base_size", "speed_size"), [(20_000, 0), (0, 5_000), (20_000, 3_000)],
                         ids=["base-only", "speed-only", "both"])
def test_top_score_equals_the_oracle_on_large_boards(redis_client, order, ties, base_size,
                                                     speed_size):
    base, speed = _large(order, ties, base_size, speed_size, seed=base_size + speed_size)
    world = World(redis_client, order, ties, base, speed, seed=1)
    world.check([Decimal(y) for y in range(1, 101)] + _PERCENTS)


def test_the_search_narrows_in_few_round_trips(redis_client, monkeypatch):
    """2 + ceil(log_9(|M| + |T| + 1)) round trips, whatever the base's size."""
    base, speed = _large("desc", "shared", 50_000, 4_000, seed=3)
    world = World(redis_client, "desc", "shared", base, speed)
    calls = {"n": 0}
    send = redis.connection.Connection.send_packed_command

    def counted(self, *args, **kwargs):  # one send per round trip (a pipeline sends once)
        calls["n"] += 1
        return send(self, *args, **kwargs)

    world.check([Decimal(1)])  # the scripts are loaded once per client, not counted here
    monkeypatch.setattr(redis.connection.Connection, "send_packed_command", counted)
    world.check([Decimal(y) for y in range(1, 101)])
    changed = sum(1 for p in speed if p in base) + sum(1 for s in speed.values() if s is not None)
    assert 2 < calls["n"] <= 2 + math.ceil(math.log(changed + 1, FANOUT + 1))


def test_position_is_the_ceiling_of_an_exact_decimal():
    assert position_for(top_percent(0.1), 1000) == 1  # not 2 (0.1 as a binary float)
    assert position_for(top_percent(34), 3) == 2
    assert position_for(top_percent(1), 200) == 2
    assert position_for(top_percent(100), 7) == 7
    assert position_for(top_percent("0.01"), 7) == 1
    for bad in (0, -1, 100.5, "nan", "inf", "x"):
        with pytest.raises(ValueError, match="top percent"):
            top_percent(bad)


# -- the reported symptoms, through the batch, the speed layer and the service ---------------

_TODAY = datetime(2026, 12, 3, 12, tzinfo=UTC)


def _event(player: str, points: int, at: datetime, region: str = "na") -> dict:
    return {"match_id": f"m-{player}-{at:%d%H%M}", "player_id": player, "points": points,
            "event_time": at, "region": region, "mode": "ranked", "server_id": "s1",
            "ingested_at": at + timedelta(minutes=5)}


@pytest.fixture
def product(redis_client, tmp_path):
    """A lake published up to yesterday (2026-12-02) and a speed layer on that version; `add`
    lands events (folded into the speed layer once `live`)."""
    raw = copy.deepcopy(EXOTIC)
    raw["board_defaults"] = {"min_points": -50, "max_points": 1000}
    write_registry(tmp_path / "registry.toml", raw)
    settings = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path),
                                  "LEADERBOARD_CONFIG": str(tmp_path / "registry.toml")})
    registry = settings.registry
    redis_client.flushall()
    speed = SpeedLayer(redis_client, registry, settings.lake_dir)

    class Product:
        boards = Leaderboards(settings.lake_dir, registry, redis_client, now=lambda: _TODAY)

        @staticmethod
        def add(events: list[dict], *, live: bool = False) -> None:
            land(settings.lake_dir, registry, events, speed=speed if live else None)

        @staticmethod
        def publish() -> None:
            run_batch(settings, date(2026, 12, 2))
            speed.rebase(read_current(settings.lake_dir))

    return Product


def test_asc_board_answers_the_threshold_not_the_best_score(product):
    """200 players with min scores 1..200 on an asc board: the top 1% is scores 1 and 2, so
    the score needed is 2 (it answered 1, the bucket's best)."""
    yesterday = datetime(2026, 12, 2, 10, tzinfo=UTC)
    product.add([_event(f"p{i:03d}", i + 1, yesterday) for i in range(200)])
    product.publish()
    assert product.boards.score_for_percentile("worst:na", 1) == 2
    table = product.boards.percentiles("worst:na")["top_percent"]
    assert table[0] == {"top_percent": 1, "score": 2, "players": 2}
    assert table[49] == {"top_percent": 50, "score": 100, "players": 100}


def test_every_percent_answers_on_a_three_player_board(product):
    """It answered only where an equal-depth bucket began (34%, 67%), null elsewhere."""
    yesterday = datetime(2026, 12, 2, 10, tzinfo=UTC)
    product.add([_event("a", 30, yesterday), _event("b", 20, yesterday),
                 _event("c", 10, yesterday)])
    product.publish()
    answers = {y: product.boards.score_for_percentile("global", y) for y in (10, 34, 50, 100)}
    assert answers == {10: 30, 34: 20, 50: 20, 100: 10}
    table = product.boards.percentiles("global")["top_percent"]
    assert len(table) == 100
    assert [r["score"] for r in table] == [30] * 33 + [20] * 33 + [10] * 34
    some = product.boards.percentiles("global", tops=["0.1", 66.7, 100])["top_percent"]
    assert some == [{"top_percent": 0.1, "score": 30, "players": 1},
                    {"top_percent": 66.7, "score": 10, "players": 3},
                    {"top_percent": 100, "score": 10, "players": 3}]
    for bad in (0, 100.01, "many"):
        with pytest.raises(QueryError, match="top percent"):
            product.boards.score_for_percentile("global", bad)


def test_speed_players_move_the_threshold(product):
    """50 players scoring 1000 today, after a base of 200 (scores 1..200): the top 20% now
    takes 1000 (the base-only answer was unchanged)."""
    yesterday = datetime(2026, 12, 2, 10, tzinfo=UTC)
    product.add([_event(f"p{i:03d}", i + 1, yesterday) for i in range(200)])
    product.publish()
    before = product.boards.score_for_percentile("global", 20)
    assert before == 161
    product.add([_event(f"new{i:02d}", 1000, _TODAY - timedelta(hours=2)) for i in range(50)],
                live=True)
    assert product.boards.score_for_percentile("global", 20) == 1000
    assert product.boards.score_for_percentile("global", 21) == 198
    assert product.boards.percentiles("global")["total"] == 250


def test_todays_daily_window_answers_from_the_speed_layer(product):
    """Today's daily window has no base yet: it answered []."""
    yesterday = datetime(2026, 12, 2, 10, tzinfo=UTC)
    product.add([_event("old", 5, yesterday)])
    product.publish()
    scores = [7, 3, 3, 9, 1, 12, 5]
    product.add([_event(f"t{i}", s, _TODAY - timedelta(hours=3)) for i, s in enumerate(scores)],
                live=True)
    answer = product.boards.percentiles("global", "daily")
    assert answer["window"] == "daily:2026-12-03"
    assert answer["total"] == len(scores)
    assert [r["score"] for r in answer["top_percent"]] == [
        oracle_top_score(scores, "desc", Decimal(y)) for y in range(1, 101)]
    asc = product.boards.percentiles("speedrun", "daily")  # min, asc, earliest ties
    assert [r["score"] for r in asc["top_percent"]] == [
        oracle_top_score(scores, "asc", Decimal(y)) for y in range(1, 101)]
    assert product.boards.score_for_percentile("worst:eu", 50, "daily") is None  # nobody
    assert product.boards.percentiles("worst:eu", "daily")["top_percent"] == []
