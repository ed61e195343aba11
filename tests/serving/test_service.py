"""Leaderboards' version pointer: read on every query by default, reused briefly on demand."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest
from lakes import day, land, random_stream

from jobs.batch import run_batch
from leaderboard.manifest import read_current
from leaderboard.registry import load_registry
from leaderboard.settings import Settings
from serving.service import Leaderboards
from speed_layer.service import SpeedLayer

pytestmark = pytest.mark.redis


def test_a_reused_pointer_lags_a_rebase_by_at_most_its_ttl(redis_client, tmp_path):
    registry = load_registry()
    settings = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path)})
    lake = settings.lake_dir
    land(lake, registry, random_stream(5, start=day("2026-11-28"), days=3))
    speed = SpeedLayer(redis_client, registry, lake)
    run_batch(settings, date(2026, 11, 28))
    first = speed.rebase(read_current(lake))
    clock = {"now": 100.0}
    now = lambda: datetime(2026, 12, 1, tzinfo=UTC)  # noqa: E731
    fresh = Leaderboards(lake, registry, redis_client, now=now)
    reused = Leaderboards(lake, registry, redis_client, now=now, pointer_ttl=1.0)
    reused._clock = lambda: clock["now"]
    assert fresh.version().version.tag == reused.version().version.tag == first.tag
    run_batch(settings, date(2026, 11, 29))
    second = speed.rebase(read_current(lake))
    assert second.tag != first.tag
    assert fresh.version().version.tag == second.tag  # at once
    clock["now"] += 0.5
    assert reused.version().version.tag == first.tag  # within the TTL: the old version
    assert reused.player("global", "nobody")["status"] == "unranked"  # still answerable
    clock["now"] += 0.6
    assert reused.version().version.tag == second.tag
