"""Carrying the long windows forward (issue 13 goal 1): a night built from the previous
version's standings plus its new rollups publishes exactly what a full recompute does.

Two lakes get the same landings and tombstones night after night. One runs as the DAG does
(an incremental night, then compaction of the day and retention of old raw partitions); the
other recomputes every night in full from raw events it never loses. Every standings and
histogram row of every board-window must be equal, after bans, unbans, late events, trusted
backfills, re-deliveries and voids of the previous night's results (absorbed, after
retention: jobs.revoid) across nights.
"""

from __future__ import annotations

import os
import random
import shutil
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from hypothesis import example, given, settings
from hypothesis import strategies as st
from lakes import EXOTIC, land, random_stream, registry_from, write_registry

from jobs.batch import plan_windows, run_batch
from jobs.compact import SpeedWatermark, compact_partition
from jobs.retention import apply_retention
from leaderboard.bans import write_tombstone
from leaderboard.lake import LandingWriter
from leaderboard.manifest import read_current
from leaderboard.schema import TIMESTAMP
from leaderboard.settings import Settings
from leaderboard.voids import write_void
from speed_layer.ingest import Ingestor

#: Drawn sequences of nights per run, beside the explicit one; CI may raise it (each takes
#: 10-20 s).
CARRY_EXAMPLES = int(os.environ.get("CARRY_EXAMPLES", "1"))

START = date(2026, 11, 26)  # a Thursday: the nights cross a week and a month
#: EXOTIC (every aggregation, both orders and tie policies, short graces, seasons) with raw
#: events kept two days, so retention deletes partitions the carried totals came from.
RAW = {**EXOTIC, "limits": {**EXOTIC["limits"], "retention_days": 2}}
QUIET = SpeedWatermark(present=False)


def _settings(data: Path, config: Path) -> Settings:
    return Settings.from_env({"LEADERBOARD_DATA": str(data), "LEADERBOARD_CONFIG": str(config)})


def _published(lake: Path) -> dict[tuple[str, str, str], pa.Table]:
    """Every published standings and histogram table, by (kind, board, window_id)."""
    manifest = read_current(lake)
    assert manifest is not None
    index = manifest.standings(lake)
    files: dict[str, pa.Table] = {}
    out = {}
    for row in index.to_pylist():
        for kind, path in (("standings", row["path"]), ("histogram", row["histogram"])):
            if path not in files:
                files[path] = pq.read_table(lake / path)
            table = files[path]
            out[(kind, row["board"], row["window_id"])] = table.filter(
                pc.equal(table.column("window_id"), row["window_id"]))
    return out


def _backfill(lake: Path, registry, seed: int, day: date, landed_at: datetime) -> None:
    rng = random.Random(seed)
    rows = 6
    table = pa.table({
        "match_id": [f"history-{seed}-{i}" for i in range(rows)],
        "player_id": [f"p{rng.randrange(25):03d}" for _ in range(rows)],
        "points": pa.array([rng.randrange(-50, 100) for _ in range(rows)], pa.int64()),
        "event_time": pa.array([datetime.combine(day, time(i + 1), UTC) for i in range(rows)],
                               TIMESTAMP),
        "region": [rng.choice(["na", "eu"]) for _ in range(rows)],
        "mode": [rng.choice(["ranked", "casual"]) for _ in range(rows)],
        "server_id": ["import"] * rows})
    with LandingWriter(lake, "history") as writer:
        Ingestor(registry, writer).ingest(table, now=landed_at, source="history",
                                          backfill=True)


night_plans = st.lists(st.fixed_dictionaries({
    "seed": st.integers(0, 10_000),
    "ban": st.sampled_from([None, "ban", "unban"]),
    "player": st.integers(0, 24),
    "backfill": st.booleans(),
    "void": st.booleans(),
}), min_size=3, max_size=5)


def _plan(seed: int, ban: str | None = None, player: int = 0, backfill: bool = False,
          void: bool = False) -> dict:
    return {"seed": seed, "ban": ban, "player": player, "backfill": backfill, "void": void}


@settings(max_examples=CARRY_EXAMPLES, deadline=None)
@given(plans=night_plans)
# Every case in one sequence: a ban, a backfill of the first day, a night with a ban and
# an unban in force (rebuilt from rollups), then carried nights after it; voids of the
# previous night's matches once retention ran (their windows recomputed, not carried).
@example(plans=[_plan(1), _plan(2, "ban", 3), _plan(3, backfill=True), _plan(4, "unban"),
                _plan(5, "ban", 7, backfill=True, void=True), _plan(6, void=True)])
def test_carried_nights_equal_full_recomputes(tmp_path_factory, plans):
    root = tmp_path_factory.mktemp("carry")
    config = root / "registry.toml"
    write_registry(config, RAW)
    registry = registry_from(RAW)
    nightly, full = root / "nightly", root / "full"
    carried_windows = 0
    banned: set[str] = set()
    previous: list[dict] = []
    for number, plan in enumerate(plans):
        day = START + timedelta(days=number)
        midnight = datetime.combine(day, time(), UTC)
        # Late arrivals, re-deliveries up to two days on and ties, landed by ingested_at;
        # what lands after this night's watermark waits in later partitions.
        events = random_stream(plan["seed"], start=midnight, days=1, matches=25)
        player = f"p{plan['player']:03d}"
        for data in (nightly, full):
            lake = data / "lake"
            land(lake, registry, events, writer=f"w{number}")
            if plan["backfill"]:
                _backfill(lake, registry, plan["seed"], START,
                          midnight + timedelta(hours=20))
            if plan["ban"] == "ban" or (plan["ban"] == "unban" and banned):
                target = player if plan["ban"] == "ban" else sorted(banned)[0]
                write_tombstone(lake, target, plan["ban"], midnight + timedelta(hours=12))
            if plan["void"] and previous:
                write_void(lake, previous[0]["match_id"], None,
                           midnight + timedelta(hours=13), "exploit")
                write_void(lake, previous[-1]["match_id"], previous[-1]["player_id"],
                           midnight + timedelta(hours=13), "wrong score")
        previous = events
        if plan["ban"] == "ban":
            banned.add(player)
        elif plan["ban"] == "unban" and banned:
            banned.discard(sorted(banned)[0])
        steps: list[str] = []
        result = run_batch(_settings(nightly, config), day, step=steps.append)
        assert result.mode == ("full" if number == 0 else "incremental")
        carried_windows += sum(int(s.split(", ")[1].split()[0]) for s in steps
                               if "carried forward" in s)
        run_batch(_settings(full, config), day, full=True)
        got, want = _published(nightly / "lake"), _published(full / "lake")
        assert set(got) == set(want), f"night {day}: other board-windows published"
        for key, table in want.items():
            assert got[key].equals(table), f"night {day}: {key} differs from a full recompute"
        compact_partition(nightly / "lake", day, speed=QUIET)
        apply_retention(nightly / "lake", day, registry.retention_days, speed=QUIET,
                        registry=registry)
    assert carried_windows > 0  # the nights did carry windows forward
    shutil.rmtree(root)


def test_a_total_at_the_saturation_limit_is_recomputed_not_carried(tmp_path):
    """A saturated sum has lost its true total, so its window is rebuilt from rollups, not
    carried. (The registry keeps a board of mixed signs from ever saturating, so a carried
    limit could not come back down; the guard keeps the carried state exact regardless.)"""
    top = 2**20 - 1  # all-time with earliest ties: |score| <= 2^20 - 1
    raw = {"regions": ["na"], "modes": ["ranked"],
           "board_defaults": {"max_points": top, "ties": "earliest",
                              "windows": ["daily", "all-time"]},
           "boards": [{"scope": "global"}]}
    registry = registry_from(raw)
    assert registry.layout("global", "all-time").limit == top
    config = tmp_path / "r.toml"
    write_registry(config, raw)
    first = datetime.combine(START, time(1), UTC)

    def event(number: int, player: str, points: int, at: datetime) -> dict:
        return {"match_id": f"m{number}", "player_id": player, "points": points,
                "event_time": at, "region": "na", "mode": "ranked", "server_id": "s",
                "ingested_at": at}

    land(tmp_path / "lake", registry, [
        event(0, "a", top, first), event(1, "a", top, first + timedelta(hours=1)),
        event(2, "b", 5, first)])
    settings_ = _settings(tmp_path, config)
    run_batch(settings_, START)
    land(tmp_path / "lake", registry, [event(3, "b", 7, first + timedelta(days=1))],
         writer="u")
    steps: list[str] = []
    assert run_batch(settings_, START + timedelta(days=1), step=steps.append).mode == (
        "incremental")
    assert any(", 0 carried forward" in s for s in steps), steps
    standings = _published(tmp_path / "lake")[("standings", "global", "all-time")]
    assert dict(zip(standings.column("player_id").to_pylist(),
                    standings.column("score").to_pylist(), strict=True)) == {"a": top, "b": 12}


def test_a_ban_rebuilds_only_the_windows_of_the_players_dates(tmp_path):
    """A changed ban set rebuilt every window of every date (a night read every rollup);
    now only the windows of the dates where a newly banned player has rows, and they
    still equal a full recompute."""
    config = tmp_path / "registry.toml"
    write_registry(config, RAW)
    registry = registry_from(RAW)
    nightly, full = tmp_path / "nightly", tmp_path / "full"
    first = datetime.combine(START, time(), UTC)
    events = random_stream(7, start=first, days=3, matches=30, late_share=0, duplicate_share=0)
    # A player seen on the first day only.
    events.append({"match_id": "once", "player_id": "loner", "points": 9,
                   "event_time": first + timedelta(hours=3), "region": "na", "mode": "ranked",
                   "server_id": "s1", "ingested_at": first + timedelta(hours=3, minutes=1)})
    last = START + timedelta(days=3)
    for data in (nightly, full):
        land(data / "lake", registry, events)
        write_tombstone(data / "lake", "loner", "ban",
                        datetime.combine(last, time(12), UTC))
    for number in range(3):
        run_batch(_settings(nightly, config), START + timedelta(days=number))
    result = run_batch(_settings(nightly, config), last)
    run_batch(_settings(full, config), last, full=True)
    every = plan_windows(registry, [START + timedelta(days=n) for n in range(4)], last)
    only = plan_windows(registry, [START], last)  # the loner's date (the night adds none)
    assert result.windows_built == len(only | plan_windows(registry, [], last)) < len(every)
    got, want = _published(nightly / "lake"), _published(full / "lake")
    assert set(got) == set(want)
    for key, table in want.items():
        assert got[key].equals(table), key
    assert "loner" not in got[("standings", "global", "all-time")].column(
        "player_id").to_pylist()
