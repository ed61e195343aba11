"""jobs.duckdb_engine: a full recompute aggregated and sorted in several parts (runs of
board-windows, sized to the memory limit) publishes the same bytes as one part; plans whose
shape is the point (not their timing)."""

from __future__ import annotations

import shutil
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from lakes import EVERY_KIND, day, land, random_stream, registry_from, write_registry

import jobs.duckdb_engine as duckdb_engine
from app.generate import GenerateSpec
from app.season import generate_season
from jobs import batch
from jobs.batch import run_batch
from leaderboard.registry import load_registry
from leaderboard.settings import Settings

START = date(2026, 11, 26)


def _settings(data: Path, config: Path) -> Settings:
    return Settings.from_env({"LEADERBOARD_DATA": str(data), "LEADERBOARD_CONFIG": str(config)})


def _published(lake: Path) -> dict[str, object]:
    """Every standings and histograms file of the lake, keyed by its folder (one file a
    folder; the file's name carries the run)."""
    files = {}
    for kind in ("standings", "histograms"):
        for path in sorted((lake / kind).rglob("*.parquet")):
            key = str(path.parent.relative_to(lake))
            assert key not in files
            files[key] = pq.read_table(path)
    return files


def test_parts_publish_what_one_part_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    config = tmp_path / "kinds.toml"
    write_registry(config, EVERY_KIND)
    registry = registry_from(EVERY_KIND)
    base = tmp_path / "base"
    (base / "lake").mkdir(parents=True)
    generate_season(GenerateSpec(players=150, days=3, events_per_day=1200, start=START,
                                 seed=3, dirty=0.05), registry, base / "lake")
    as_of = START + timedelta(days=2)
    one, many = tmp_path / "one", tmp_path / "many"
    for data in (one, many):
        shutil.copytree(base, data)
    run_batch(_settings(one, config), as_of, engine="duckdb", full=True)
    counted: list[int] = []
    parts = duckdb_engine.DuckDBEngine._parts

    def spy(self: duckdb_engine.DuckDBEngine) -> list[tuple[int, int]]:
        found = parts(self)
        counted.append(len(found))
        return found

    # A budget of a few hundred fanned-out rows: dozens of parts, one board-window alone
    # in a part when it is larger than the budget.
    monkeypatch.setattr(duckdb_engine, "_part_rows", lambda con: 300)
    monkeypatch.setattr(duckdb_engine.DuckDBEngine, "_parts", spy)
    run_batch(_settings(many, config), as_of, engine="duckdb", full=True)
    assert counted
    assert counted[0] > 10
    want, got = _published(one / "lake"), _published(many / "lake")
    assert got.keys() == want.keys()
    for key, table in want.items():
        assert got[key].equals(table), key


def test_a_wide_last_key_publishes_what_a_narrow_one_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The latest (time, match) pair packs into a BIGINT when the run's time span and match
    codes fit (every small lake), else into a HUGEINT: both publish the same bytes (last
    boards' scores, last_event_at and last_match_id included, EVERY_KIND)."""
    config = tmp_path / "kinds.toml"
    write_registry(config, EVERY_KIND)
    base = tmp_path / "base"
    (base / "lake").mkdir(parents=True)
    generate_season(GenerateSpec(players=120, days=3, events_per_day=900, start=START,
                                 seed=5, dirty=0.05), registry_from(EVERY_KIND), base / "lake")
    as_of = START + timedelta(days=2)
    narrow, wide = tmp_path / "narrow", tmp_path / "wide"
    for data in (narrow, wide):
        shutil.copytree(base, data)
    chosen: list[bool] = []
    key = duckdb_engine._LastKey

    def spy(*args: Any) -> duckdb_engine._LastKey:
        found = key(*args)
        chosen.append(found.narrow)
        return found

    monkeypatch.setattr(duckdb_engine, "_LastKey", spy)
    run_batch(_settings(narrow, config), as_of, engine="duckdb", full=True)
    monkeypatch.setattr(duckdb_engine, "_NARROW_BITS", 0)
    run_batch(_settings(wide, config), as_of, engine="duckdb", full=True)
    assert chosen == [True, False]
    want, got = _published(narrow / "lake"), _published(wide / "lake")
    assert got.keys() == want.keys()
    for name, table in want.items():
        assert got[name].equals(table), name


NIGHTS_START = day("2026-11-28")


class _Plans:
    """A connection that records the physical plan of every statement with an ASOF join."""

    def __init__(self, con: Any) -> None:
        self._con = con
        self.plans: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)

    def _explain(self, sql: str) -> None:
        if "ASOF JOIN" in sql:
            self.plans.append(str(self._con.execute("EXPLAIN " + sql).fetchall()[0][1]))

    def sql(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        self._explain(sql)
        return self._con.sql(sql, *args, **kwargs)

    def execute(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs:
            self._explain(sql)
        return self._con.execute(sql, *args, **kwargs)


def test_the_histograms_asof_joins_stay_sort_merge_joins(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The depth histogram finds each bucket's first and last rows by ASOF joins over the
    (board-window, sort key) groups. DuckDB planned them as a nested loop over every group
    before each bucket (buckets x distinct scores per board-window: a third of a night's
    CPU at 20k players, growing as the long windows fill; issue 13 goal 1). Fails on the
    old engine: its plan holds a NESTED_LOOP_JOIN and no ASOF join."""
    data = tmp_path / "data"
    lake = data / "lake"
    lake.mkdir(parents=True)
    registry = load_registry()
    land(lake, registry, random_stream(3, start=NIGHTS_START, days=2, matches=80, players=40))
    engines: list[_Plans] = []

    def spying(name: str, **options: Any) -> Any:
        engine = duckdb_engine.DuckDBEngine()
        engine.con = _Plans(engine.con)  # type: ignore[assignment]
        engines.append(engine.con)  # type: ignore[arg-type]
        return engine

    monkeypatch.setattr(batch, "open_engine", spying)
    batch.run_batch(Settings.from_env({"LEADERBOARD_DATA": str(data)}),
                    (NIGHTS_START + timedelta(days=2)).date(), publish=False)
    plans = [plan for spy in engines for plan in spy.plans]
    assert plans, "the histograms ran no ASOF join"
    for plan in plans:
        assert "ASOF" in plan.upper()
        assert "NESTED_LOOP" not in plan.upper().replace(" ", "_")
