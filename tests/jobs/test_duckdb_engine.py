"""jobs.duckdb_engine: a full recompute aggregated and sorted in several parts (runs of
board-windows, sized to the memory limit) publishes the same bytes as one part."""

from __future__ import annotations

import shutil
from datetime import date, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from lakes import EVERY_KIND, registry_from, write_registry

import jobs.duckdb_engine as duckdb_engine
from app.generate import GenerateSpec
from app.season import generate_season
from jobs.batch import run_batch
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
