"""bench/bench_batch.py's plain statement (issue 13's baseline) computes the product's standings.

The benchmark's "standings identical" line compares the DuckDB full recompute with one plain
SQL statement row for row; that check is only worth something if the statement follows
today's definition. It once treated every landed row as a match event, so the default
registry's direct `best-lap` scores (lap times, up to 1,000,000) were summed into the
global, region and mode boards and the best-lap board itself was missing: "NO: 34,606,177
differ" at 1M players, a bench defect that looked like a product one.
"""

from __future__ import annotations

import threading
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path

import duckdb
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from lakes import EVERY_KIND, write_registry
from rich.progress import Progress

from app.generate import GenerateSpec
from app.season import generate_season
from bench import bench_batch
from bench.bench_batch import _plain_statement, _same_standings, _season_key
from jobs.batch import run_batch
from jobs.duckdb_engine import DuckDBEngine
from leaderboard.bans import write_tombstone
from leaderboard.lake import landed_files
from leaderboard.registry import load_registry, parse_registry
from leaderboard.settings import Settings

REGISTRY = EVERY_KIND
START = date(2026, 11, 26)
DAYS = 4


def test_plain_statement_matches_the_full_recompute_on_every_board_kind(tmp_path: Path) -> None:
    config = tmp_path / "registry.toml"
    write_registry(config, REGISTRY)
    registry = parse_registry(REGISTRY, source="test")
    data = tmp_path / "data"
    lake = data / "lake"
    lake.mkdir(parents=True)
    report = generate_season(GenerateSpec(players=200, days=DAYS, events_per_day=1500,
                                          start=START, seed=3, dirty=0.1, batch_minutes=240),
                             registry, lake)
    assert report.scores > 0  # direct scores landed beside the events
    keen = pq.read_table(landed_files(lake)[0].path).column("player_id")[0].as_py()
    write_tombstone(lake, keen, "ban", datetime.combine(START, time(6), UTC),
                    reason="cheating")
    settings = Settings.from_env({"LEADERBOARD_DATA": str(data),
                                  "LEADERBOARD_CONFIG": str(config)})
    as_of = START + timedelta(days=DAYS - 1)
    result = run_batch(settings, as_of, engine="duckdb", full=True)

    out = tmp_path / "plain"
    files = [str(f.path) for f in landed_files(lake) if f.ingest_date <= as_of]
    _, _, rows, _ = _plain_statement(files, as_of, lake, out, settings.registry)
    compared, differ = _same_standings(out, lake, as_of)

    assert (compared, differ) == (result.standings_rows, 0)
    assert rows == compared
    plain = pq.read_table(out)
    published = {str(b) for b in pc.unique(plain.column("board")).to_pylist()}
    assert {"best-lap", "coins", "best", "latest:ranked", "fewest-na"} <= published
    # Equal lap times on best-lap rank by who set them first: the ranks are distinct there.
    laps = plain.filter(pc.equal(plain.column("board"), "best-lap"))
    assert len(set(zip(laps.column("window_id").to_pylist(), laps.column("rank").to_pylist(),
                       strict=True))) == laps.num_rows


def test_a_season_is_cached_per_registry() -> None:
    """A season cached under another registry (say, before the default gained `best-lap`)
    is not reused: it would have no rows for the new board."""
    spec = GenerateSpec(players=100, days=2, events_per_day=50)
    default, football = load_registry("default"), load_registry("football")
    assert _season_key(spec, default) == _season_key(spec, load_registry())
    assert _season_key(spec, default) != _season_key(spec, football)
    assert _season_key(spec, default).endswith(default.fingerprint[:8])


def test_the_memory_watcher_stops_before_the_engine_closes(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """The bench samples DuckDB's memory on a cursor of the engine's connection, and DuckDB
    refuses to close a connection while a cursor of it runs a query. The watcher was stopped
    only after run_batch returned, so a sample that overlapped run_batch's last step, closing
    its engine, failed a published run: "connection is busy with another call" (a 300k run
    in session 7, read as a race in the batch). Here the sample waits inside DuckDB (a
    Python function in its query) until the watcher is stopped, and the engine's close
    waits until a sample is inside, so the overlap happens every time unless the watcher
    stops first. Fails on the old code (the run's error is the busy connection)."""
    inside, release = threading.Event(), threading.Event()

    def gate() -> int:
        inside.set()
        release.wait(60)
        return 0

    class GatedPeaks(bench_batch.MemoryPeaks):
        def _watch(self) -> None:
            self._cursor.create_function("gate", gate, [], duckdb.sqltypes.BIGINT)
            self._cursor.execute("SELECT gate()").fetchall()  # a sample held inside DuckDB
            super()._watch()

        def stop(self) -> bench_batch.MemoryPeaks:
            release.set()
            return super().stop()

    close = DuckDBEngine.close

    def close_while_sampling(self: DuckDBEngine) -> None:
        if not release.is_set():  # the watcher still runs: close while it samples
            assert inside.wait(60)
        close(self)

    monkeypatch.setattr(bench_batch, "MemoryPeaks", GatedPeaks)
    monkeypatch.setattr(DuckDBEngine, "close", close_while_sampling)
    config = tmp_path / "registry.toml"
    write_registry(config, REGISTRY)
    data = tmp_path / "data"
    (data / "lake").mkdir(parents=True)
    generate_season(GenerateSpec(players=50, days=2, events_per_day=200, start=START, seed=3),
                    parse_registry(REGISTRY, source="test"), data / "lake")
    settings = Settings.from_env({"LEADERBOARD_DATA": str(data),
                                  "LEADERBOARD_CONFIG": str(config)})
    as_of = START + timedelta(days=1)
    result, timeline = bench_batch._run(settings, as_of, Progress(disable=True), "full",
                                        engine="duckdb", full=True)

    assert timeline.error == ""
    assert result is not None
    assert result.manifest.as_of == as_of.isoformat()
    assert inside.is_set()  # a sample was running when the run ended
