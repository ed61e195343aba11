"""A void night after retention (jobs.revoid): a void of a result the live version absorbed
leaves every board-window, as a full recompute of an untouched lake would publish."""

from __future__ import annotations

import shutil
from datetime import date, timedelta
from pathlib import Path

import pytest
from lakes import day, land, random_stream
from views import published_standings

from jobs.batch import run_batch
from jobs.compact import SpeedWatermark
from jobs.retention import apply_retention, deleted_through
from leaderboard.registry import load_registry
from leaderboard.retained import kept_after
from leaderboard.settings import Settings
from leaderboard.voids import write_void

START = day("2026-11-20")
D = date(2026, 11, 20)
NO_SPEED = SpeedWatermark(present=False)


def settings_for(data: Path) -> Settings:
    return Settings.from_env({"LEADERBOARD_DATA": str(data)})


def _matches_on(events: list[dict], when: date) -> list[str]:
    """Matches whose every event falls on event date `when` and landed by D+5."""
    by_match: dict[str, set[date]] = {}
    for event in events:
        landed = event["ingested_at"].date() <= D + timedelta(days=5)
        by_match.setdefault(event["match_id"], set()).add(
            event["event_time"].date() if landed else date.max)
    return sorted(m for m, days in by_match.items() if days == {when})


@pytest.fixture
def world(tmp_path):
    """Six days landed and published night by night, then copied untouched (`control`);
    retention (3 days at D+5) deletes the raw partitions of D and D+1 in `data` only."""
    data = tmp_path / "data"
    events = random_stream(9, start=START, days=6, matches=120, duplicate_share=0.0,
                           late_share=0.15)
    land(data / "lake", load_registry(), events)
    for night in range(6):
        run_batch(settings_for(data), D + timedelta(days=night))
    control = tmp_path / "control"
    shutil.copytree(data, control)
    report = apply_retention(data / "lake", D + timedelta(days=5), 3, speed=NO_SPEED,
                             registry=load_registry())
    assert report.deleted
    return data, control, events


def test_a_void_of_an_absorbed_result_after_retention_leaves_every_window(world):
    """Fails on the old batch: once retention ran, a void of a result the live version had
    absorbed applied nowhere (the night stayed incremental on the base's rollups)."""
    data, control, events = world
    lake = data / "lake"
    assert deleted_through(lake) == D + timedelta(days=1)
    line = kept_after(lake, load_registry())
    assert line == D + timedelta(days=3)  # future_skew 5m: one day, plus a day's margin
    whole = _matches_on(events, D + timedelta(days=4))[0]
    single = _matches_on(events, D + timedelta(days=5))[0]
    player = next(e["player_id"] for e in events if e["match_id"] == single)
    at = day("2026-11-26T00:30:00")  # after the live version's watermark
    for root in (data, control):
        write_void(root / "lake", whole, None, at, "exploit")
        write_void(root / "lake", single, player, at, "wrong score")
    before = published_standings(lake)
    told: list[str] = []
    ours = run_batch(settings_for(data), D + timedelta(days=6), step=told.append)
    theirs = run_batch(settings_for(control), D + timedelta(days=6))
    assert (ours.mode, theirs.mode) == ("incremental", "full")
    after = published_standings(lake)
    assert after != before
    assert after == published_standings(control / "lake")
    assert any("recomputing the rollups of" in m for m in told), told
    assert ours.manifest.inputs["events"] == theirs.manifest.inputs["events"]
    # The next nights (incremental, carried forward on both sides) stay equal.
    for night in (7, 8):
        run_batch(settings_for(data), D + timedelta(days=night))
        run_batch(settings_for(control), D + timedelta(days=night))
        assert published_standings(lake) == published_standings(control / "lake")


def test_a_void_of_a_result_whose_raw_events_are_gone_keeps_the_limit(world, tmp_path):
    """A void of a result whose raw events retention deleted changes nothing in the batch
    (the documented limit): the night publishes what it would without the void."""
    data, _control, events = world
    lake = data / "lake"
    twin = tmp_path / "twin"
    shutil.copytree(data, twin)
    write_void(lake, _matches_on(events, D)[0], None, day("2026-11-26T00:30:00"), "exploit")
    told: list[str] = []
    result = run_batch(settings_for(data), D + timedelta(days=6), step=told.append)
    run_batch(settings_for(twin), D + timedelta(days=6))
    assert result.mode == "incremental"
    assert not any("recomputing the rollups" in m for m in told)
    assert published_standings(lake) == published_standings(twin / "lake")
