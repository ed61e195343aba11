"""jobs.duckdb_engine: a full recompute aggregated and sorted in several parts (runs of
board-windows, sized to the memory limit) publishes the same bytes as one part; plans whose
shape is the point (not their timing)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import example, given
from lakes import EVERY_KIND, day, land, random_stream, registry_from, write_registry
from strategies import YEAR_1_US, last_key_cases

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


def _published(lake: Path) -> dict[str, pa.Table]:
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


def _code_width(codes: int) -> int:
    """The fewest bits (at least one) that hold every match code 0..codes (0: a carried row
    whose match is unknown)."""
    width = 1
    while 2 ** width <= codes:
        width += 1
    return width


@pytest.fixture(scope="module")
def utc_duckdb() -> Iterator[duckdb.DuckDBPyConnection]:
    """One in-memory DuckDB connection in UTC, as the engine's, shared by the examples (a
    connection each would be most of their time)."""
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    yield con
    con.close()


def _case(first_us: int, span: int, codes: int) -> dict[str, Any]:
    return {"first_us": first_us, "span": span, "codes": codes, "pairs": []}


@given(last_key_cases())
# The largest span a 1-bit code field leaves narrow, and one past it.
@example(_case(YEAR_1_US, 2**61 - 1, 1))
@example(_case(YEAR_1_US, 2**61, 1))
@example(_case(0, 2**61 - 1, 0))
@example(_case(0, 2**61, 0))
# Codes at a power of two: 2047 fits 11 bits, 2048 needs 12 (the code `codes` itself).
@example(_case(-(2**40), 2**51 - 1, 2047))
@example(_case(-(2**40), 2**51 - 1, 2048))
@example(_case(-(2**40), 2**50 - 1, 2048))
# The most codes an INTEGER row number gives, from a run starting 2025-12-01.
@example(_case(1_764_547_200_000_000, 2**31 - 1, 2**31 - 1))
@example(_case(1_764_547_200_000_000, 2**31, 2**31 - 1))
# Times before 1970, year 1 included, and a zero span.
@example(_case(YEAR_1_US, 0, 0))
@example(_case(YEAR_1_US, 86_400_000_000, 5))
@example(_case(-1, 1, 1))
@example(_case(-(2**40), 0, 2**20))
def test_the_last_key_is_narrow_exactly_when_it_fits_and_decodes_exactly(
        utc_duckdb: duckdb.DuckDBPyConnection, case: dict[str, Any]) -> None:
    """jobs.duckdb_engine._LastKey, packed and decoded in DuckDB SQL as the engine does, on a
    TIMESTAMPTZ event time and an INTEGER match code: it is a BIGINT exactly when the run's
    largest pair (last time, code count) would key below 2^62 with the fewest code bits, else
    a HUGEINT; either way keys order as (time, code) pairs do (so max is the latest pair),
    decode to their time and code exactly, a narrow key lies in [0, 2^62), and a null time
    keys null (max skips it). The oracle is plain Python integers, not the product's pack."""
    first_us, span, codes = case["first_us"], case["span"], case["codes"]
    last_us = first_us + span
    key = duckdb_engine._LastKey(first_us, last_us, codes)
    fits = span * 2 ** _code_width(codes) + codes < 2**62
    assert key.narrow == fits
    pairs = sorted({*case["pairs"], (first_us, 0), (first_us, codes), (last_us, 0),
                    (last_us, codes)})
    values = ", ".join(f"({t}::BIGINT, {c}::INTEGER)" for t, c in pairs)
    keyed = f"""
        SELECT t, c, {key.pack("make_timestamp(t)::TIMESTAMPTZ", "c")} AS k
        FROM (VALUES {values}, (NULL::BIGINT, 0::INTEGER)) r(t, c)"""
    rows = utc_duckdb.execute(f"""
        SELECT t, c, k, typeof(k), {key.time_us("k")}, {key.code("k")} FROM ({keyed})
    """).fetchall()
    latest = utc_duckdb.execute(f"""
        SELECT {key.time_us("k")}, {key.code("k")} FROM (SELECT max(k) AS k FROM ({keyed}))
    """).fetchall()
    assert [(k, t_back, c_back) for t, _, k, _, t_back, c_back in rows if t is None] == [
        (None, None, None)]
    rows = [row for row in rows if row[0] is not None]
    assert sorted((t, c) for t, c, *_ in rows) == pairs
    assert {kind for _, _, _, kind, _, _ in rows} == {"BIGINT" if fits else "HUGEINT"}
    for t, c, k, _, t_back, c_back in rows:
        assert (t_back, c_back) == (t, c)
        if fits:
            assert 0 <= k < 2**62
    by_key = sorted(rows, key=lambda row: row[2])
    assert [(t, c) for t, c, *_ in by_key] == pairs
    assert len({k for _, _, k, *_ in rows}) == len(pairs)
    assert latest == [pairs[-1]]


def test_a_run_without_event_times_keys_wide() -> None:
    """No row to time (an empty run): the span is unknown, so the key is the HUGEINT one,
    which needs no origin."""
    key = duckdb_engine._LastKey(None, None, 0)
    assert (key.narrow, key.origin, key.bits) == (False, 0, 32)


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
