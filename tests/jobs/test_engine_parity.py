"""Engine parity (docs/design.md section 7.2): DuckDB and Spark publish identical standings.

Each scenario lands one lake, copies it into two data dirs, runs `jobs.batch.run_batch` on
each with one engine, and compares what was published, read back through the manifests:
every standings row and every histogram row of every board-window, the index entries,
the rollups and the manifest's inputs and checks.
"""

from __future__ import annotations

import json
import os
import shutil
import tomllib
from collections import Counter
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from lakes import EVERY_KIND, land, registry_from, write_registry
from strategies import limit_registry_raws, limit_worlds

from app.football import football_events
from app.generate import GenerateSpec
from app.season import generate_season
from jobs.batch import BatchResult, run_batch
from jobs.publish import window_runs
from leaderboard.bans import read_tombstones, write_tombstone
from leaderboard.lake import LandingWriter, landed_files
from leaderboard.manifest import read_current
from leaderboard.registry import Registry, load_registry, parse_registry
from leaderboard.settings import Settings
from leaderboard.voids import write_void
from speed_layer.ingest import Ingestor

# The `spark` fixture's session is the active one, so the engine run_batch opens uses it.
pytestmark = [pytest.mark.spark, pytest.mark.usefixtures("spark")]


PARITY = EVERY_KIND
START = date(2026, 11, 26)
DAYS = 4


# -- helpers ----------------------------------------------------------------------------------

def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def _toml(raw: dict[str, Any]) -> str:
    """The registry dict as TOML (scalars, tables, arrays of tables: all it uses)."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in raw.items()
             if not isinstance(v, dict) and not (isinstance(v, list) and v
                                                and isinstance(v[0], dict))]
    for key, table in raw.items():
        if isinstance(table, dict):
            lines += [f"[{key}]", *(f"{k} = {_toml_value(v)}" for k, v in table.items())]
    for key, items in raw.items():
        if isinstance(items, list) and items and isinstance(items[0], dict):
            for item in items:
                lines += [f"[[{key}]]", *(f"{k} = {_toml_value(v)}" for k, v in item.items())]
    text = "\n".join(lines) + "\n"
    assert tomllib.loads(text) == raw
    return text


def _settings(data: Path, config: str) -> Settings:
    return Settings.from_env({"LEADERBOARD_DATA": str(data), "LEADERBOARD_CONFIG": config})


def _split_by_window(table: pa.Table) -> dict[str, pa.Table]:
    """A published file (ordered by window_id) cut into its windows, rows in file order."""
    starts, lengths = window_runs(table.column("window_id"))
    return {table.column("window_id")[int(s)].as_py(): table.slice(int(s), int(n))
            for s, n in zip(starts, lengths, strict=True)}


class Published:
    """The live version of a lake, as a reader sees it through the manifest."""

    def __init__(self, lake: Path) -> None:
        manifest = read_current(lake)
        assert manifest is not None, f"no version published in {lake}"
        self.manifest = manifest
        self.index = manifest.standings(lake)
        files: dict[str, tuple[dict[str, pa.Table], pa.Table]] = {}
        self.standings: dict[tuple[str, str], pa.Table] = {}
        self.histograms: dict[tuple[str, str], pa.Table] = {}
        self.entries: dict[tuple[str, str], dict[str, Any]] = {}
        for entry in self.index.to_pylist():
            key = (entry["board"], entry["window_id"])
            for column, target in (("path", self.standings), ("histogram", self.histograms)):
                path = entry[column]
                if path not in files:
                    table = pq.read_table(lake / path)
                    files[path] = (_split_by_window(table), table.schema.empty_table())
                windows, empty = files[path]
                target[key] = windows.get(entry["window_id"], empty)
            assert self.standings[key].num_rows == entry["rows"]
            assert self.histograms[key].num_rows == entry["histogram_rows"]
            self.entries[key] = {k: v for k, v in entry.items()
                                 if k not in ("path", "histogram")}
        self.rollups = manifest.rollups(lake)
        by_path: dict[str, list[date]] = {}
        for day, entry in self.rollups.items():
            by_path.setdefault(entry["path"], []).append(date.fromisoformat(day))
        parts = [pq.read_table(lake / path, filters=[("event_date", "in", days)])
                 for path, days in sorted(by_path.items())]
        #: the authoritative rollup rows of every date, in one canonical order
        self.rollup_rows: pa.Table | None = pa.concat_tables(parts).sort_by(
            [(c, "ascending") for c in ("event_date", "player_id", "region", "mode", "mask")]
        ) if parts else None


def assert_same_publication(duck: Path, spark: Path) -> Published:
    """Every published row of the two lakes' live versions is identical."""
    want, got = Published(duck), Published(spark)
    assert (got.manifest.engine, want.manifest.engine) == ("spark", "duckdb")
    assert got.manifest.as_of == want.manifest.as_of
    assert got.manifest.inputs == want.manifest.inputs
    assert got.manifest.checks == want.manifest.checks
    assert got.manifest.boards == want.manifest.boards
    assert got.entries.keys() == want.entries.keys()
    for key, entry in want.entries.items():
        assert got.entries[key] == entry, f"index entry {key}"
        assert got.standings[key].schema == want.standings[key].schema
        assert got.standings[key].equals(want.standings[key]), f"standings of {key} differ"
        assert got.histograms[key].schema == want.histograms[key].schema
        assert got.histograms[key].equals(want.histograms[key]), f"histogram of {key} differs"
    assert {d: {k: v for k, v in e.items() if k != "path"} for d, e in got.rollups.items()} == {
        d: {k: v for k, v in e.items() if k != "path"} for d, e in want.rollups.items()}
    assert want.rollup_rows is not None
    assert got.rollup_rows is not None
    assert got.rollup_rows.equals(want.rollup_rows), "rollup rows differ"
    return want


def _run_both(duck: Path, spark: Path, config: str, as_of: date
              ) -> tuple[BatchResult, BatchResult, Published]:
    want = run_batch(_settings(duck, config), as_of, engine="duckdb")
    got = run_batch(_settings(spark, config), as_of, engine="spark")
    assert (got.mode, got.events, got.windows_built, got.standings_rows) == (
        want.mode, want.events, want.windows_built, want.standings_rows)
    return want, got, assert_same_publication(duck / "lake", spark / "lake")


def _twins(base: Path, root: Path) -> tuple[Path, Path]:
    duck, spark = root / "duckdb", root / "spark"
    shutil.copytree(base, duck)
    shutil.copytree(base, spark)
    return duck, spark


# -- (a) a generated season with dirt, bans and an incremental day ----------------------------

@pytest.fixture(scope="module")
def season(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Registry]:
    """A generated dirty season landed in a lake, with bans and an unban along the way."""
    root = tmp_path_factory.mktemp("season")
    config = root / "parity.toml"
    config.write_text(_toml(PARITY))
    registry = parse_registry(PARITY, source="test")
    assert load_registry(str(config)).boards == registry.boards
    data = root / "data"
    lake = data / "lake"
    lake.mkdir(parents=True)
    report = generate_season(GenerateSpec(players=240, days=DAYS, events_per_day=2500,
                                          start=START, seed=5, dirty=0.1, batch_minutes=240),
                             registry, lake)
    assert min(report.rejected, report.duplicates, report.late) > 0  # dirt of every kind
    counts: Counter[str] = Counter()
    for landed in landed_files(lake):
        counts.update(pq.read_table(landed.path, columns=["player_id"])
                      .column("player_id").to_pylist())
    keen = [player for player, _ in counts.most_common(3)]

    def at(day: int, hour: int) -> datetime:
        return datetime.combine(START + timedelta(days=day), time(hour), UTC)

    write_tombstone(lake, keen[0], "ban", at(1, 0), reason="cheating")
    write_tombstone(lake, keen[1], "ban", at(2, 12), reason="from the second run on")
    write_tombstone(lake, keen[2], "ban", at(0, 6), reason="banned in the first run only")
    write_tombstone(lake, keen[2], "unban", at(2, 6), reason="appeal upheld")
    # Voids (before the first run, so the second stays incremental): a whole match and one
    # player's result of another, both engines drop them in the dedupe step.
    first = pq.read_table(landed_files(lake)[0].path, columns=["match_id", "player_id"])
    write_void(lake, first.column("match_id")[0].as_py(), None, at(0, 7), reason="exploit")
    write_void(lake, first.column("match_id")[-1].as_py(), first.column("player_id")[-1].as_py(),
               at(0, 8), reason="wrong score")
    return data, str(config), registry


def test_generated_season_in_full_then_incrementally(season, tmp_path):
    base, config, _ = season
    duck, spark = _twins(base, tmp_path)
    first_day = START + timedelta(days=1)
    want, _, published = _run_both(duck, spark, config, first_day)
    assert want.mode == "full"
    assert published.manifest.inputs["banned"]  # bans are in force
    assert sum(t.num_rows for t in published.standings.values()) > 1000
    # The bans change between the runs: every window is rebuilt from merged rollups.
    want, _, published = _run_both(duck, spark, config, first_day + timedelta(days=1))
    assert want.mode == "incremental"
    rebuilt_all = want.windows_built
    # A trusted backfill of the first day lands (late, past every daily grace) before the
    # last run: both engines count it in its closed windows (issue 10 item 4).
    history = pa.table({
        "match_id": [f"history-{i}" for i in range(6)],
        "player_id": [f"hist{i % 3}" for i in range(6)],
        "points": pa.array([7, 3, 9, 1, 4, 2], pa.int64()),
        "event_time": pa.array([datetime.combine(START, time(i + 1), UTC) for i in range(6)],
                               pa.timestamp("us", tz="UTC")),
        "region": ["na", "eu", "asia", "na", "eu", "asia"], "mode": ["ranked"] * 6,
        "server_id": ["import"] * 6})
    landed_at = datetime.combine(first_day + timedelta(days=2), time(6), UTC)
    # Direct scores landed late (issue 12 part 2): a re-delivery, with the best lap there
    # can be, of a lap an earlier run absorbed (the incremental dedupe drops it: a score's
    # identity is (board, match_id, player_id)), and a lap sharing a match event's match id
    # and player (another identity: it counts).
    rows = pa.concat_tables(pq.read_table(f.path) for f in landed_files(base / "lake"))
    absorbed = rows.filter(pc.equal(rows["board"], "best-lap")).slice(0, 1).to_pylist()[0]
    # A player never banned: a banned one's lap would be dropped with the rest of their rows.
    ever_banned = set(read_tombstones(base / "lake").column("player_id").to_pylist())
    events = rows.filter(pc.is_null(rows["board"])).to_pylist()
    event = next(row for row in events if row["player_id"] not in ever_banned)
    laps = pa.table({
        "match_id": [absorbed["match_id"], event["match_id"]],
        "player_id": [absorbed["player_id"], event["player_id"]],
        "points": pa.array([1, 2], pa.int64()),
        "event_time": pa.array([absorbed["event_time"], landed_at - timedelta(hours=1)],
                               pa.timestamp("us", tz="UTC")),
        "server_id": ["laps"] * 2})
    registry = parse_registry(PARITY, source="test")
    for data in (duck, spark):
        with LandingWriter(data / "lake", "history") as writer:
            report = Ingestor(registry, writer).ingest(
                history, now=landed_at, source="history", backfill=True)
            assert report.accepted == 6
            report = Ingestor(registry, writer).ingest(laps, now=landed_at, source="laps",
                                                       board=registry.board("best-lap"))
            assert report.accepted == 2
    # Same bans as the run before: only the windows of changed dates are rebuilt.
    want, _, published = _run_both(duck, spark, config, first_day + timedelta(days=2))
    daily = published.standings[("global", f"daily:{START.isoformat()}")]
    assert {"hist0", "hist1", "hist2"} <= set(daily.column("player_id").to_pylist())
    assert want.mode == "incremental"
    assert want.windows_built < rebuilt_all
    # the board kinds the registry promises are all there, ties and asc orders included
    boards = {board for board, _ in published.entries}
    assert {"global", "best", "low:ranked", "latest:casual", "fewest-na", "region:asia",
            "best-lap", "coins"} <= boards
    best = published.standings[("best-lap", "all-time")]
    assert best.slice(0, 1).select(["player_id", "score"]).to_pylist() == [
        {"player_id": event["player_id"], "score": 2}]
    assert 1 not in best.column("score").to_pylist(), "the re-delivered lap is not counted"
    assert published.standings[("coins", "all-time")].num_rows > 0


# -- (b) the real football results, backfilled -----------------------------------------------

@pytest.fixture(scope="module")
def football(tmp_path_factory: pytest.TempPathFactory, football_results: Path) -> Path:
    data = tmp_path_factory.mktemp("football") / "data"
    lake = data / "lake"
    lake.mkdir(parents=True)
    table, _ = football_events(football_results)
    since = pa.scalar(datetime(2018, 1, 1, tzinfo=UTC), table.schema.field("event_time").type)
    table = table.filter(pc.greater_equal(table.column("event_time"), since))
    with LandingWriter(lake, "football") as writer:
        report = Ingestor(load_registry("football"), writer).ingest(
            table, now=datetime(2026, 12, 1, tzinfo=UTC), source=str(football_results),
            backfill=True)
    assert report.accepted > 10_000
    return data


def test_football_results_backfilled(football, tmp_path):
    duck, spark = _twins(football, tmp_path)
    want, _, published = _run_both(duck, spark, "football", date(2026, 12, 1))
    assert want.mode == "full"
    all_time = published.standings[("global", "all-time")]
    assert all_time.num_rows > 200
    # shared ties: equal scores share a rank (1, 1, 3), and some do
    ranks = all_time.column("rank").to_pylist()
    assert len(set(ranks)) < len(ranks)


# -- (d) registries drawn at the limits (issue 11) --------------------------------------------

#: Spark takes seconds per run: a few drawn worlds (SPARK_LIMIT_EXAMPLES overrides).
SPARK_LIMIT_EXAMPLES = int(os.environ.get("SPARK_LIMIT_EXAMPLES", "4"))


@settings(max_examples=SPARK_LIMIT_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
@pytest.mark.timeout(1800)
def test_drawn_registries_at_the_limits(data, tmp_path_factory):
    """Registries drawn as in the lambda identity at the limits (every aggregation x order x
    tie policy, bounds at the edge of what loads, explicit seasons, grace 0, all_time_start
    before 1970) with events at the bounds, in the 1960s and across the 2026/27 year end:
    both engines publish the same rows."""
    raw = data.draw(limit_registry_raws())
    registry = registry_from(raw)
    world = data.draw(limit_worlds(registry))
    root = tmp_path_factory.mktemp("limits")
    config = root / "registry.toml"
    write_registry(config, raw)
    assume(land(root / "base" / "lake", registry, world["events"]) > 0)
    as_of = (max(e["ingested_at"] for e in world["events"]) + timedelta(hours=2)).date()
    duck, spark = _twins(root / "base", root)
    _run_both(duck, spark, str(config), as_of)  # everything is the batch's


def test_events_before_1970_and_saturated_sums(tmp_path):
    """Regression (issue 11.2 and 11.1) in both engines: a calendar from 1870 with events of
    1964-65 (all-time only: far too late for their daily windows), a `last` board whose
    latest event is before 1970, max and min boards whose bests are before 1970, and sums
    that saturate at the key limit."""
    raw = {"regions": ["r"], "modes": ["a", "b"],
           "calendar": {"season": "quarterly", "all_time_start": "1870-01-01"},
           "limits": {"grace": "0s"},
           "boards": [
               {"scope": "mode:a", "name": "sum-a", "ties": "earliest",
                "windows": ["daily", "all-time"], "min_points": 0, "max_points": 2**19 - 1},
               {"scope": "mode:b", "name": "last-b", "aggregation": "last",
                "windows": ["all-time"], "min_points": -10, "max_points": 10},
               {"scope": "mode:b", "name": "max-b", "aggregation": "max",
                "windows": ["all-time"], "min_points": -10, "max_points": 10},
               {"scope": "mode:b", "name": "min-b", "aggregation": "min", "order": "asc",
                "windows": ["all-time"], "min_points": -10, "max_points": 10}]}
    registry = registry_from(raw)
    landed = datetime(2026, 12, 1, 12, tzinfo=UTC)
    events = [{"match_id": f"m{i}", "player_id": player, "points": points, "event_time": at,
               "region": "r", "mode": mode, "server_id": "s", "ingested_at": landed}
              for i, (player, points, at, mode) in enumerate([
                  ("p", 2**19 - 1, datetime(1965, 6, 1, tzinfo=UTC), "a"),
                  ("p", 2**19 - 1, datetime(2026, 12, 1, tzinfo=UTC), "a"),
                  ("q", 5, datetime(1964, 12, 31, 23, 59, tzinfo=UTC), "a"),
                  ("p", 5, datetime(1965, 3, 1, tzinfo=UTC), "b"),
                  ("p", -7, datetime(1964, 3, 1, tzinfo=UTC), "b"),
                  ("q", 3, datetime(1963, 1, 1, tzinfo=UTC), "b")])]
    config = tmp_path / "registry.toml"
    write_registry(config, raw)
    assert land(tmp_path / "base" / "lake", registry, events) == len(events)
    duck, spark = _twins(tmp_path / "base", tmp_path)
    _, _, published = _run_both(duck, spark, str(config), date(2026, 12, 1))
    rows = {key: [(r["player_id"], r["score"]) for r in table.to_pylist()]
            for key, table in published.standings.items()}
    assert rows[("sum-a", "all-time")] == [("p", 2**19 - 1), ("q", 5)]
    assert rows[("sum-a", "daily:2026-12-01")] == [("p", 2**19 - 1)]
    assert rows[("last-b", "all-time")] == [("p", 5), ("q", 3)]
    # max and min keys pack (score, time) with times before 1970 (the DuckDB engine once
    # overflowed INT64 there)
    assert rows[("max-b", "all-time")] == [("p", 5), ("q", 3)]
    assert rows[("min-b", "all-time")] == [("p", -7), ("q", 3)]
    reached = {r["player_id"]: r["reached_at"]
               for r in published.standings[("max-b", "all-time")].to_pylist()}
    assert reached["p"] == datetime(1965, 3, 1, tzinfo=UTC)
