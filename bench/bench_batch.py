"""Benchmark the nightly batch job: full recompute, one-day incremental, pandas, Spark scaling.

Generates a season once (cached under --cache, reused by every measurement and by later runs
with the same shape) and prints, as same-run ratios:

1. full recompute (`run_batch(full=True)` on DuckDB, as of the last generated day) against the
   one-pass floor: DuckDB `SELECT player_id, sum(points) ... GROUP BY 1` over the same landed
   files (best of --floor-repeats); goal <= 4x. Where the full run's time goes: the stages
   between run_batch's step messages, and inside them each engine SQL statement and each
   publish step (timed by wrapping them from here; nothing in jobs/ changes).
   Issue 13 goal 2: the full recompute against ONE plain DuckDB statement on the same lake,
   measured in the same run (dedupe with first ingested wins, explode every event into its
   boards and windows and every direct score into its own board's, apply the counting rule,
   aggregate, order and break ties as each board of the registry says (a sum board with
   shared ties: competition ranks), add the percentile, COPY to Parquet partitioned by
   board), with the standings compared row for row (board, window, player, score, rank);
   goal <= 0.5x. tests/bench/test_bench_batch.py keeps the statement equal to the product.
   Goal 5: DuckDB's peak memory under --memory-limit and its peak spill against the bytes
   the run wrote (both sampled from `duckdb_memory()` on a second connection).
2. one new day incremental against the full recompute (publish as of the day before in full,
   then run the last day incrementally), with the standings rows rewritten over the rows
   published (which bounds it); goal <= 0.25 (issue 13 goal 3).
3. the DuckDB engine against a plain pandas implementation of the same job (dedupe by
   (match_id, player_id), first ingested wins; global board, all-time and daily windows:
   groupby + sum + rank(method='min')), on the same data (--pandas-days to subset); the same
   reduced job in DuckDB SQL is timed too, for an like-for-like ratio; goal: DuckDB >= 10x.
4. the Spark engine on local[2] (SPARK_MASTER overrides) at 1x and 4x data (separate, smaller
   seasons: --spark-events and 4x that, players scaled alike); goal: time(4x)/time(1x) <= 4.

Every time is given as wall seconds and as CPU seconds of this process and its children (Spark's
JVM included): on a shared, busy machine the wall clock also counts other people's work, so
compare ratios, and prefer the CPU ones when the load average is above the core count. DuckDB
runs under --memory-limit (its own default, 80% of RAM, starves everything else on a shared
machine at full size) and spills beyond it, up to --temp-limit; a run that fails (out of memory
or temp space) is reported with the stages it got through, and the other measurements go on.

Usage: python bench/bench_batch.py [--players 1000000] [--events 20000000] [--days 30]
       [--dirty 0.02] [--seed 0] [--cache DIR] [--regenerate] [--floor-repeats 3]
       [--memory-limit 8GB] [--temp-limit 30GB] [--pandas-days N]
       [--spark-events 1000000] [--spark-players 50000]
       [--skip full,plain,incremental,pandas,spark] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import multiprocessing
import os
import re
import resource
import shutil
import sys
import tempfile
import threading
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

import jobs.batch as batch
import jobs.publish as publish
from app.generate import GenerateSpec
from app.season import generate_season
from app.season import season_key as _season_key
from jobs.spec import calendar_table
from leaderboard.bans import banned_players
from leaderboard.lake import ROW_GROUP_SIZE, landed_files
from leaderboard.manifest import Manifest, watermark_for
from leaderboard.registry import Registry
from leaderboard.settings import Settings

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# DuckDB 2 warns on each DB-API Arrow fetch (an extra copy); the engine's, not ours to fix here.
warnings.filterwarnings("ignore", message="Arrow output on a DB-API result")


def _cpu() -> float:
    """CPU seconds (user + system) of this process and its live descendants (Spark's JVM and
    Python workers), plus reaped children. On a shared machine the wall clock counts other
    people's work; CPU seconds count ours."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    used: dict[int, float] = {}
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        # utime, stime (and, for this process, cutime and cstime of reaped children)
        ticks = int(fields[11]) + int(fields[12])
        if pid == me:
            ticks += int(fields[13]) + int(fields[14])
        used[pid] = ticks / tick
    total = 0.0
    for pid, seconds in used.items():
        walk, hops = pid, 0
        while walk not in (0, 1) and walk != me and hops < 64:
            walk, hops = parents.get(walk, 0), hops + 1
        if walk == me:
            total += seconds
    return total

# -- the season --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Season:
    spec: GenerateSpec
    root: Path  # holds lake/events (+ quarantine, writers); never written by a batch run
    generate_seconds: float  # 0 when reused from the cache
    accepted: int

    @property
    def last_day(self) -> date:
        return self.spec.start + timedelta(days=self.spec.days - 1)

    def files(self, as_of: date) -> list[str]:
        """The landed files a batch as of `as_of` reads (ingest_date <= as_of)."""
        return [str(f.path) for f in landed_files(self.root / "lake") if f.ingest_date <= as_of]


def _season(spec: GenerateSpec, cache: Path, regenerate: bool, console: Console) -> Season:
    """Generate `spec` with the product's registry (LEADERBOARD_CONFIG) into cache/<key>, or
    reuse a complete earlier generation of the same key."""
    registry = Settings.from_env().registry
    key = _season_key(spec, registry)
    root = cache / key
    done = root / "complete.json"
    if done.exists() and not regenerate:
        info = json.loads(done.read_text())
        return Season(spec, root, 0.0, int(info["accepted"]))
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    columns = (TextColumn(f"[bold]generate[/] {key}"), BarColumn(),
               MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("rows", total=None)
        report = generate_season(spec, registry, root / "lake",
                                 progress=lambda d, t: progress.update(task, completed=d,
                                                                       total=t))
    done.write_text(json.dumps({"accepted": report.accepted, "seconds": report.seconds,
                                "registry": registry.fingerprint,
                                "spec": {k: str(v) for k, v in asdict(spec).items()}}))
    return Season(spec, root, report.seconds, report.accepted)


@contextmanager
def _data_dir(season: Season, scratch: Path, name: str) -> Iterator[Settings]:
    """A fresh data dir whose lake/events is the cached season's (read only by the jobs)."""
    data = scratch / name
    (data / "lake").mkdir(parents=True)
    for part in ("events", "quarantine"):
        if (season.root / "lake" / part).exists():
            (data / "lake" / part).symlink_to(season.root / "lake" / part)
    try:
        yield Settings.from_env(data_dir=str(data))
    finally:
        shutil.rmtree(data, ignore_errors=True)


# -- memory and spill ------------------------------------------------------------------------


class MemoryPeaks:
    """Peak DuckDB memory and peak spill (temporary storage) of one database, sampled from a
    second connection every `every` seconds while the watched work runs (DuckDB's own
    accounting, `duckdb_memory()`; not the process's RSS, which adds Arrow and Python).

    The second connection is a cursor of the watched one, and DuckDB refuses to close a
    connection while a cursor of it runs a query ("connection is busy with another call"):
    `stop` the watcher before the watched connection closes (`_engines` does so for the
    engine)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, every: float = 0.1) -> None:
        self.memory = 0
        self.spill = 0
        self._cursor = con.cursor()
        self._every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(self._every):
            try:
                memory, spill = self._cursor.execute(
                    "SELECT sum(memory_usage_bytes), sum(temporary_storage_bytes) "
                    "FROM duckdb_memory()").fetchall()[0]
            except duckdb.Error:  # the database closed: the run is over
                return
            self.memory = max(self.memory, int(memory or 0))
            self.spill = max(self.spill, int(spill or 0))

    def stop(self) -> MemoryPeaks:
        """End the sampling and wait for its last query; idempotent."""
        self._stop.set()
        self._thread.join()
        with contextlib.suppress(duckdb.Error):
            self._cursor.close()
        return self


# -- timing run_batch --------------------------------------------------------------------------


@dataclass
class Timeline:
    """Step messages of one run_batch call, and time spent in wrapped calls, by label: wall
    seconds and this process's CPU seconds (time.process_time: DuckDB's threads included,
    other people's work on a busy machine not)."""

    began: float = field(default_factory=time.perf_counter)
    began_cpu: float = field(default_factory=time.process_time)
    steps: list[tuple[float, str, float]] = field(default_factory=list)
    calls: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    cpu_calls: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    ended: float = 0.0
    ended_cpu: float = 0.0
    cpu: float = 0.0  # CPU seconds of the run (see _cpu)
    error: str = ""  # why the run failed, if it did (the times then run up to the failure)
    on_step: Callable[[str], None] | None = None
    memory: MemoryPeaks | None = None  # DuckDB's peak memory and spill, when watched

    def step(self, message: str) -> None:
        self.steps.append((time.perf_counter(), message, time.process_time()))
        if self.on_step is not None:
            self.on_step(message)

    def add(self, label: str, seconds: float, cpu: float, *, count: bool = True) -> None:
        self.calls[label] += seconds
        self.cpu_calls[label] += cpu
        self.counts[label] += count

    def stages(self) -> list[tuple[str, float, float]]:
        """(stage, wall seconds, CPU seconds): before the first message, then from each
        message to the next."""
        marks = [(self.began, "setup: list files, earliest date, calendar, bans",
                  self.began_cpu)]
        marks += [(t, _stage_name(m), c) for t, m, c in self.steps]
        ends = [(t, c) for t, _, c in marks[1:]] + [(self.ended, self.ended_cpu)]
        return [(name, end - start, end_cpu - start_cpu)
                for (start, name, start_cpu), (end, end_cpu) in zip(marks, ends, strict=True)]

    @property
    def seconds(self) -> float:
        return self.ended - self.began


def _stage_name(message: str) -> str:
    """A step message without its run-specific numbers, naming the work that follows it."""
    if message.startswith(("full run", "incremental run")):
        return "rollup_events (read, dedupe, roll up)"
    if message.startswith("deduped and rolled up") or " new events since " in message:
        return "write rollups (+ merge, if incremental) and plan windows"
    if message.startswith("ranking"):
        return "standings SQL + write standings files (" + message.split(" ", 1)[1] + ")"
    if message.startswith("checking"):
        return "check totals, seal (fsync), write manifest, swap"
    if message.startswith("published"):
        return "close engine"
    return message


_CREATE = re.compile(r"CREATE\s+OR\s+REPLACE\s+TEMP\s+(?:TABLE|VIEW)\s+(\w+)", re.I)
_SQL_NAMES = {  # the statements of jobs/duckdb_engine.py that do not create a named relation
    "WITH e AS": "rollup aggregate (join calendar, GROUP BY player-day-region-mode-mask)",
    "DELETE FROM new_events": "drop late duplicates of absorbed rows (incremental)",
    "SELECT DISTINCT board, window_id FROM counted": "distinct received board-windows",
    "SELECT board, window_id, player_id, score, time_bits": "overflow check",
    "WITH b AS": "histograms (window min/max + two GROUP BYs)",
    "WITH r AS": "merge rollups GROUP BY (incremental)",
    "SELECT count(*) FROM new_events": "count deduped events",
    "SELECT board, window_id, player_id, score, sort_key": "open ordered standings stream",
}


def _sql_label(sql: str) -> str:
    text = " ".join(sql.split())
    created = _CREATE.search(text)
    if created:
        return f"create {created.group(1)}"
    for prefix, name in _SQL_NAMES.items():
        if text.startswith(prefix):
            return name
    return text[:48]


class _TimedConnection:
    """A DuckDB connection that adds the time of each execute or sql call (and of fetching
    its result) to a timeline."""

    def __init__(self, con: duckdb.DuckDBPyConnection, timeline: Timeline) -> None:
        self._con = con
        self._timeline = timeline

    def _call(self, method: str, sql: str, *args: Any, **kwargs: Any) -> _TimedResult:
        label = "sql: " + _sql_label(sql)
        began, began_cpu = time.perf_counter(), time.process_time()
        result = getattr(self._con, method)(sql, *args, **kwargs)
        self._timeline.add(label, time.perf_counter() - began, time.process_time() - began_cpu)
        return _TimedResult(result, label, self._timeline)

    def execute(self, sql: str, *args: Any, **kwargs: Any) -> _TimedResult:
        return self._call("execute", sql, *args, **kwargs)

    def sql(self, sql: str, *args: Any, **kwargs: Any) -> _TimedResult:
        # DDL runs now; a SELECT gives a lazy relation that runs when fetched (timed below)
        return self._call("sql", sql, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)


class _TimedResult:
    def __init__(self, result: Any, label: str, timeline: Timeline) -> None:
        self._result, self._label, self._timeline = result, label, timeline

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._result, name)
        if name not in ("fetchall", "fetchone", "to_arrow_table", "fetch_arrow_table", "arrow",
                        "df"):
            return attr  # to_arrow_reader is lazy: its work lands in the standings writer

        def timed(*args: Any, **kwargs: Any) -> Any:
            began, began_cpu = time.perf_counter(), time.process_time()
            try:
                return attr(*args, **kwargs)
            finally:
                self._timeline.add(self._label, time.perf_counter() - began,
                                   time.process_time() - began_cpu, count=False)
        return timed


def _timed(function: Callable[..., Any], label: str, timeline: Timeline) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began, began_cpu = time.perf_counter(), time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            timeline.add(label, time.perf_counter() - began, time.process_time() - began_cpu)
    return wrapper


#: Calls run_batch makes by module global name, timed when instrumenting.
_BATCH_CALLS = ("landed_files", "event_date_range", "calendar_table", "banned_players",
                "_write_rollups", "_scope_points", "seal", "write_version", "swap_current")
_WRITER_CALLS = ("write_stream", "write_empty", "write_histograms", "close")
_ENGINE_CALLS = ("rollup_events", "merge_rollups", "standings", "finish")


@contextmanager
def _engines(timeline: Timeline, instrument: bool) -> Iterator[None]:
    """Apply LIMITS to each DuckDB engine run_batch opens and, with `instrument`, time
    run_batch's calls from the outside: module globals, writer and engine methods."""
    saved_globals = {name: getattr(batch, name) for name in _BATCH_CALLS}
    saved_writer = {name: getattr(publish.StandingsWriter, name) for name in _WRITER_CALLS}
    open_engine = batch.open_engine

    def open_capped(name: str, **options: Any) -> Any:
        engine: Any = open_engine(name, **options)
        con = getattr(engine, "con", None)
        if isinstance(con, duckdb.DuckDBPyConnection):
            _apply_limits(con, LIMITS)
            if timeline.memory is None:
                timeline.memory = MemoryPeaks(con)
                engine.close = _closing(timeline.memory, engine.close)
            if instrument:
                engine.con = _TimedConnection(con, timeline)
        if instrument:
            for method in _ENGINE_CALLS:
                setattr(engine, method, _timed(getattr(engine, method), f"engine.{method}",
                                               timeline))
        return engine

    try:
        if instrument:
            for name, function in saved_globals.items():
                setattr(batch, name, _timed(function, f"batch.{name}", timeline))
            for name, function in saved_writer.items():
                setattr(publish.StandingsWriter, name,
                        _timed(function, f"StandingsWriter.{name}", timeline))
        batch.open_engine = open_capped
        yield
    finally:
        for name, function in saved_globals.items():
            setattr(batch, name, function)
        for name, function in saved_writer.items():
            setattr(publish.StandingsWriter, name, function)
        batch.open_engine = open_engine


def _closing(watcher: MemoryPeaks, close: Callable[[], None]) -> Callable[[], None]:
    """The engine's `close`, after the memory watcher on its connection has stopped: closed
    while the watcher's query ran, DuckDB refused ("connection is busy with another call"),
    and run_batch, which closes its engine last, failed after publishing (a 300k bench run
    in session 7; the watcher was stopped only once run_batch had returned)."""

    def close_watched() -> None:
        watcher.stop()
        close()

    return close_watched


#: DuckDB settings for the engine and the baselines (--memory-limit, --temp-limit; "" keeps
#: DuckDB's default).
LIMITS: dict[str, str] = {}


def _apply_limits(con: duckdb.DuckDBPyConnection, limits: dict[str, str]) -> None:
    for name, value in limits.items():
        if value:
            con.execute(f"SET {name} = '{value}'")


def _run(settings: Settings, as_of: date, progress: Progress, label: str, *, engine: str,
         full: bool, instrument: bool = True) -> tuple[batch.BatchResult | None, Timeline]:
    """Time one run_batch call; a failure (out of memory or temp space, say) is returned in
    the timeline, not raised, so the other measurements still run."""
    task = progress.add_task(f"{label}: starting", total=None)
    timeline = Timeline(on_step=lambda m: progress.update(task, description=f"{label}: {m}"))
    gc.collect()
    try:
        with _engines(timeline, instrument):
            cpu = _cpu()
            timeline.began, timeline.began_cpu = time.perf_counter(), time.process_time()
            result: batch.BatchResult | None = None
            try:
                # Sections reuse a data dir and go back a night: rewinding is the point.
                result = batch.run_batch(settings, as_of, engine=engine, full=full,
                                         step=timeline.step, allow_rewind=True)
            except Exception as exc:  # reported by the caller
                timeline.error = f"{type(exc).__name__}: {exc}"[:400]
            timeline.ended, timeline.ended_cpu = time.perf_counter(), time.process_time()
            timeline.cpu = _cpu() - cpu
    finally:
        if timeline.memory is not None:
            timeline.memory.stop()
        progress.remove_task(task)
    return result, timeline


# -- baselines ---------------------------------------------------------------------------------


def _connect(limits: dict[str, str] | None = None) -> duckdb.DuckDBPyConnection:
    """A connection set up as the engine's: UTC, threads = cores, the bench's limits."""
    con = duckdb.connect(config={"preserve_insertion_order": False})
    con.execute("SET TimeZone = 'UTC'")
    con.execute(f"SET threads = {os.cpu_count() or 2}")
    con.execute("SET enable_progress_bar = false")
    _apply_limits(con, LIMITS if limits is None else limits)
    return con


def _floor(files: list[str], repeats: int) -> tuple[float, float, int]:
    """Best wall and best CPU seconds of the one-pass floor, and its result rows."""
    con = _connect()
    best, best_cpu, rows = float("inf"), float("inf"), 0
    for _ in range(repeats):
        cpu = _cpu()
        began = time.perf_counter()
        table: pa.Table = con.sql(
            "SELECT player_id, sum(points) AS points FROM read_parquet($files) GROUP BY 1",
            params={"files": files}).to_arrow_table()
        best = min(best, time.perf_counter() - began)
        best_cpu = min(best_cpu, _cpu() - cpu)
        rows = table.num_rows
        del table
    con.close()
    return best, best_cpu, rows


#: How the plain statement scores a (board, window, player) group of each aggregation: the
#: score and the instant it was reached (the `earliest` tie policy ranks by it). A max or min
#: board's best is the first event with the best points; a sum or last board's instant is its
#: latest event, and a last board's points are those of the latest (event time, match id).
_PLAIN_SCORES = {
    "sum": ("sum(points)::BIGINT", "max(at_us)"),
    "max": ("max(points)", "arg_min(at_us, (-points, at_us))"),
    "min": ("min(points)", "arg_min(at_us, (points, at_us))"),
    "last": ("arg_max(points, (at_us, match_id))", "max(at_us)"),
}


def _plain_boards(registry: Registry) -> pa.Table:
    """One row per (board, window kind) of `registry`: what the plain statement explodes an
    event or a direct score into (scope_key: `board:<name>` for a direct board, which only
    its own scores feed) and how that board scores and ranks (sign, earliest, unit_us)."""
    pairs = [(b, kind) for b in registry.boards for kind in b.windows]
    return pa.table({
        "board": [b.name for b, _ in pairs],
        "scope_key": [b.scope_key for b, _ in pairs],
        "kind": [kind for _, kind in pairs],
        "grace_us": pa.array([int(b.grace.total_seconds()) * 1_000_000 for b, _ in pairs],
                             pa.int64()),
        "aggregation": [b.aggregation for b, _ in pairs],
        "sign": pa.array([1 if b.order == "desc" else -1 for b, _ in pairs], pa.int64()),
        "earliest": [b.ties == "earliest" for b, _ in pairs],
        "unit_us": pa.array([registry.layout(b, kind).unit_us or 1 for b, kind in pairs],
                            pa.int64()),
    })


def _plain_sql(kinds: set[tuple[str, bool]], out: Path) -> str:
    """The plain statement for a registry whose boards are of these kinds: (aggregation, ties
    go to who reached the score first). Each kind is scored and ranked over its own boards'
    rows only, so the registry's sum boards with shared ties (nearly every row) pay nothing
    for the others: no instant aggregated, no extra sort keys."""
    ranked = []
    for aggregation, earliest in sorted(kinds):
        score, reached = _PLAIN_SCORES[aggregation]
        where = f"aggregation = '{aggregation}' AND {'' if earliest else 'NOT '}earliest"
        # Shared ties: equal scores share the competition rank. Earliest ties: the earlier
        # instant (in the board's key unit, from the window start), then player_id: every
        # rank is distinct.
        extra, order = "", "sign * score DESC"
        if earliest:
            extra = (f", {reached} AS reached_us, any_value(window_start_us) AS start_us,"
                     " any_value(unit_us) AS unit_us")
            order += ", (reached_us - start_us) // unit_us, player_id"
        ranked.append(f"""
                SELECT board, window_id, player_id, score,
                       rank() OVER (PARTITION BY board, window_id ORDER BY {order}) AS rank
                FROM (SELECT board, window_id, player_id, any_value(sign) AS sign,
                             {score} AS score{extra}
                      FROM exploded WHERE {where} GROUP BY board, window_id, player_id)""")
    union = " UNION ALL ".join(ranked)
    return f"""
        COPY (
            WITH events AS (
                SELECT match_id, player_id, points, event_time, region, mode, ingested_at,
                       coalesce(backfill, false) AS backfill, board
                FROM (SELECT * FROM read_parquet($files, filename = true,
                                                 hive_partitioning = false, union_by_name = true)
                      UNION ALL BY NAME SELECT NULL::BOOLEAN AS backfill,
                                               NULL::VARCHAR AS board WHERE false)
                WHERE ingested_at < $watermark
                QUALIFY row_number() OVER (PARTITION BY match_id, player_id, board
                                           ORDER BY ingested_at, filename) = 1
            ), exploded AS (
                SELECT b.board, c.window_id, c.window_start_us, b.aggregation, b.sign,
                       b.earliest, b.unit_us, e.player_id, e.points, e.match_id,
                       epoch_us(e.event_time) AS at_us
                FROM events e
                JOIN calendar_t c ON c.event_date = e.event_time::DATE
                JOIN boards_t b ON b.kind = c.kind
                 AND CASE WHEN e.board IS NOT NULL THEN b.scope_key = 'board:' || e.board
                          ELSE b.scope_key IN ('global', 'region:' || e.region,
                                               'mode:' || e.mode) END
                WHERE (c.window_end_us IS NULL OR e.backfill
                       OR epoch_us(e.ingested_at) <= c.window_end_us + b.grace_us)
                  AND e.player_id NOT IN (SELECT player_id FROM banned_t)
            ), ranked AS ({union}
            )
            SELECT board, window_id, player_id, score, rank,
                   100.0 * (count(*) OVER (PARTITION BY board, window_id) - rank + 1)
                       / count(*) OVER (PARTITION BY board, window_id) AS percentile
            FROM ranked
        ) TO '{out}' (FORMAT parquet, PARTITION_BY (board), COMPRESSION zstd)
    """


def _plain_statement(files: list[str], as_of: date, lake: Path, out: Path,
                     registry: Registry) -> tuple[float, float, int, MemoryPeaks]:
    """Issue 13's baseline: the whole job as ONE plain DuckDB statement over the landed files
    (dedupe with first ingested wins, explode every event into its boards and windows and
    every direct score into its board's, apply the counting rule, aggregate as each board
    does, rank by each board's order and tie policy, add the percentile, write Parquet
    partitioned by board). Wall and CPU seconds and the rows written. The calendar comes from
    the same core table the engines use (window ids are not the point). `registry` is the
    one the product ran with (LEADERBOARD_CONFIG), so both compute the same boards."""
    first = as_of - timedelta(days=400)
    calendar = calendar_table(registry, first, as_of + _DAY)
    boards = _plain_boards(registry)
    banned = pa.table({"player_id": pa.array(sorted(banned_players(
        lake, before=watermark_for(as_of))), pa.string())})
    con = _connect()
    for name, table in (("calendar_t", calendar), ("boards_t", boards), ("banned_t", banned)):
        con.register(name, table)
    peaks = MemoryPeaks(con)
    cpu = _cpu()
    began = time.perf_counter()
    con.execute(_plain_sql({(b.aggregation, b.ties == "earliest") for b in registry.boards},
                           out),
                {"files": files, "watermark": watermark_for(as_of)})
    wall, used = time.perf_counter() - began, _cpu() - cpu
    peaks.stop()
    rows = con.sql(f"SELECT count(*) FROM read_parquet('{out}/**/*.parquet')").fetchall()[0][0]
    con.close()
    return wall, used, int(rows), peaks


def _same_standings(plain: Path, lake: Path, as_of: date) -> tuple[int, int]:
    """Rows of the product's published standings and rows that differ from the plain
    statement's (board, window_id, player_id, score, rank), both ways; 0 means identical."""
    con = _connect()
    product = f"{lake}/standings/as_of={as_of.isoformat()}/**/*.parquet"
    count, differ = con.sql(f"""
        WITH p AS (SELECT board, window_id, player_id, score, rank
                   FROM read_parquet('{product}', hive_partitioning = true)),
             q AS (SELECT board, window_id, player_id, score, rank
                   FROM read_parquet('{plain}/**/*.parquet', hive_partitioning = true))
        SELECT (SELECT count(*) FROM p),
               (SELECT count(*) FROM (FROM p EXCEPT ALL FROM q))
               + (SELECT count(*) FROM (FROM q EXCEPT ALL FROM p))
    """).fetchall()[0]
    con.close()
    return int(count), int(differ)


def _same_versions(lake: Path, first: Manifest, second: Manifest) -> tuple[int, int]:
    """Rows of version `second`'s standings and rows that differ from version `first`'s
    (board, window_id, player_id, score, rank), both ways; 0 means identical. Each version's
    rows are those its standings index names (a night keeps its base's files for the
    windows it did not rebuild)."""
    con = _connect()
    selects, files = [], {}
    for n, version in enumerate((first, second)):
        index = version.standings(lake).select(["board", "window_id", "path"])
        index = index.set_column(2, "path", pa.array(
            [str(lake / p) for p in index.column("path").to_pylist()], pa.string()))
        con.register(f"index_{n}", index)
        files[f"files_{n}"] = sorted(set(index.column("path").to_pylist()))
        selects.append(f"""SELECT i.board, s.window_id, s.player_id, s.score, s.rank
            FROM read_parquet($files_{n}, filename = true, hive_partitioning = false) s
            JOIN index_{n} i ON i.path = s.filename AND i.window_id = s.window_id""")
    count, differ = con.execute(f"""
        WITH p AS ({selects[0]}), q AS ({selects[1]})
        SELECT (SELECT count(*) FROM q),
               (SELECT count(*) FROM (FROM p EXCEPT ALL FROM q))
               + (SELECT count(*) FROM (FROM q EXCEPT ALL FROM p))
    """, files).fetchall()[0]
    con.close()
    return int(count), int(differ)


_GRACE = timedelta(days=7)  # the default registry's grace; daily windows count late events
_DAY = timedelta(days=1)


def _pandas_job(files: list[str], watermark: Any) -> dict[str, Any]:
    """The reduced job in plain pandas: dedupe, global all-time and daily, sum and rank."""
    seconds: dict[str, float] = {}
    began = time.perf_counter()
    columns = ["match_id", "player_id", "points", "event_time", "ingested_at"]
    df = pd.concat([pd.read_parquet(f, columns=columns).assign(file=i)
                    for i, f in enumerate(files)], ignore_index=True)
    seconds["read"] = time.perf_counter() - began

    began = time.perf_counter()
    df = df[df["ingested_at"] < pd.Timestamp(watermark)]
    df = df.sort_values(["ingested_at", "file"], kind="stable")
    df = df.drop_duplicates(["match_id", "player_id"], keep="first")
    seconds["dedupe"] = time.perf_counter() - began

    began = time.perf_counter()
    total = df.groupby("player_id", sort=False)["points"].sum()
    rank = total.rank(method="min", ascending=False)
    all_time = [len(total), int(rank.sum()), int(total.sum())]
    seconds["all-time"] = time.perf_counter() - began

    began = time.perf_counter()
    day = df["event_time"].dt.normalize()
    on_time = df["ingested_at"] <= day + _DAY + _GRACE  # late beyond grace: not in daily
    daily_rows = df.loc[on_time, ["player_id", "points"]].assign(day=day[on_time])
    per_day = daily_rows.groupby(["day", "player_id"], sort=False)["points"].sum()
    day_rank = per_day.groupby(level="day", sort=False).rank(method="min", ascending=False)
    daily = [len(per_day), int(day_rank.sum()), int(per_day.sum())]
    seconds["daily"] = time.perf_counter() - began
    return {"seconds": seconds, "events": len(df), "all_time": all_time, "daily": daily}


def _duckdb_job(files: list[str], watermark: Any, limits: dict[str, str]) -> dict[str, Any]:
    """The same reduced job in DuckDB SQL (the engine's dedupe; rank() for min ranks)."""
    con = _connect(limits)
    seconds: dict[str, float] = {}
    began = time.perf_counter()
    con.execute("""
        CREATE TEMP TABLE e AS
        SELECT match_id, player_id, points, event_time, ingested_at
        FROM read_parquet($files, filename = true) WHERE ingested_at < $w
        QUALIFY row_number() OVER (PARTITION BY match_id, player_id
                                   ORDER BY ingested_at, filename) = 1
    """, {"files": files, "w": watermark})
    seconds["read + dedupe"] = time.perf_counter() - began
    began = time.perf_counter()
    con.execute("""
        CREATE TEMP TABLE a AS
        SELECT player_id, s, rank() OVER (ORDER BY s DESC) AS r
        FROM (SELECT player_id, sum(points) AS s FROM e GROUP BY 1)
    """)
    all_time = con.execute("SELECT count(*), sum(r), sum(s) FROM a").fetchall()[0]
    seconds["all-time"] = time.perf_counter() - began
    began = time.perf_counter()
    con.execute(f"""
        CREATE TEMP TABLE d AS
        SELECT day, player_id, s, rank() OVER (PARTITION BY day ORDER BY s DESC) AS r
        FROM (SELECT event_time::DATE AS day, player_id, sum(points) AS s FROM e
              WHERE ingested_at <= event_time::DATE + INTERVAL {1 + _GRACE.days} DAY
              GROUP BY 1, 2)
    """)
    daily = con.execute("SELECT count(*), sum(r), sum(s) FROM d").fetchall()[0]
    seconds["daily"] = time.perf_counter() - began
    events = con.execute("SELECT count(*) FROM e").fetchall()[0][0]
    con.close()
    return {"seconds": seconds, "events": int(events), "all_time": [int(x) for x in all_time],
            "daily": [int(x) for x in daily]}


def _job_in_child(kind: str, files: list[str], watermark: Any,
                  limits: dict[str, str]) -> dict[str, Any]:
    """Run a reduced job (in a fresh process): its figures, CPU seconds and peak RSS."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    began = time.perf_counter()
    if kind == "pandas":
        result = _pandas_job(files, watermark)
    else:
        result = _duckdb_job(files, watermark, limits)
    after = resource.getrusage(resource.RUSAGE_SELF)
    result["wall"] = time.perf_counter() - began
    result["cpu"] = (after.ru_utime + after.ru_stime) - (usage.ru_utime + usage.ru_stime)
    with open("/proc/self/status") as status:  # VmHWM: this process's own peak, in kB
        peak = next(line for line in status if line.startswith("VmHWM:"))
    result["peak_rss_gib"] = int(peak.split()[1]) / 2**20
    return result


def _reduced_job(kind: str, files: list[str], watermark: Any) -> dict[str, Any]:
    """_job_in_child in a spawned process, so each job's memory and CPU are its own."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_job_in_child, kind, files, watermark, LIMITS).result()


# -- output ------------------------------------------------------------------------------------


def _figures(console: Console, title: str, rows: list[tuple[str, str]]) -> None:
    table = Table(title=title, title_justify="left", title_style="bold", show_header=False,
                  box=None)
    table.add_column(style="bold")
    table.add_column(justify="right")
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)


def _breakdown(console: Console, title: str, timeline: Timeline) -> None:
    total = timeline.seconds
    total_cpu = max(timeline.ended_cpu - timeline.began_cpu, 1e-9)
    table = Table(title=title, title_justify="left", title_style="bold")
    table.add_column("stage (between run_batch step messages)")
    table.add_column("wall s", justify="right")
    table.add_column("share", justify="right")
    table.add_column("CPU s", justify="right")
    table.add_column("share", justify="right")
    for name, seconds, cpu in timeline.stages():
        table.add_row(name, f"{seconds:.2f}", f"{seconds / total:.0%}", f"{cpu:.2f}",
                      f"{cpu / total_cpu:.0%}")
    console.print(table)
    if not timeline.calls:
        return
    calls = Table(title=f"{title}: timed calls inside the run (nested: engine.* includes its "
                  "sql:*, write_stream includes the final ORDER BY stream)",
                  title_justify="left", title_style="bold")
    calls.add_column("call")
    calls.add_column("n", justify="right")
    calls.add_column("wall s", justify="right")
    calls.add_column("share", justify="right")
    calls.add_column("CPU s", justify="right")
    calls.add_column("share", justify="right")
    for label, seconds in sorted(timeline.cpu_calls.items(), key=lambda kv: -kv[1]):
        if timeline.calls[label] < 0.005 and seconds < 0.005:
            continue
        calls.add_row(label, str(timeline.counts[label]), f"{timeline.calls[label]:.2f}",
                      f"{timeline.calls[label] / total:.0%}", f"{seconds:.2f}",
                      f"{seconds / total_cpu:.0%}")
    console.print(calls)


def _ratio(value: float, goal: str) -> str:
    return f"{value:.2f}x (goal {goal})"


# -- the sections ------------------------------------------------------------------------------


def _per(wall: float, cpu: float) -> str:
    return f"{wall:.2f} s wall, {cpu:.2f} s CPU"


def _failed(console: Console, title: str, timeline: Timeline) -> None:
    _figures(console, title, [("failed after", _per(timeline.seconds, timeline.cpu)),
                              ("error", timeline.error)])
    _breakdown(console, f"{title}: where the time went before it failed", timeline)


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"


def _output_bytes(lake: Path) -> int:
    """Bytes of the files a run wrote: rollups, standings, histograms (a fresh data dir holds
    one run's)."""
    return sum(p.stat().st_size for part in ("rollups", "standings", "histograms")
               for p in (lake / part).rglob("*.parquet"))


def _memory_figures(run: Timeline, lake: Path) -> list[tuple[str, str]]:
    """Issue 13 goal 5: inside the memory limit, spilling no more than the output's size."""
    if run.memory is None:
        return []
    output = _output_bytes(lake)
    return [
        (f"DuckDB peak memory (limit {LIMITS.get('memory_limit') or 'default'})",
         _gib(run.memory.memory)),
        ("DuckDB peak spill / bytes written (goal: spill <= output)",
         f"{_gib(run.memory.spill)} / {_gib(output)}"
         f" ({'met' if run.memory.spill <= output else 'NOT met'})"),
    ]


def _format_floor(lake: Path, as_of: date, out: Path) -> tuple[float, float, int, int]:
    """What the published format alone costs: the product's standings files of `as_of` read
    back one at a time (untimed) and written again from memory with the publisher's settings
    (12 columns, zstd, ROW_GROUP_SIZE row groups). Wall and CPU seconds of the writes, rows,
    bytes. No engine can publish these bytes for less, so goal 2 cannot be met while this
    is above half the plain statement's time (whose output is 6 columns)."""
    files = sorted((lake / "standings" / f"as_of={as_of.isoformat()}").rglob("*.parquet"))
    wall = cpu = 0.0
    rows = size = 0
    out.mkdir(parents=True, exist_ok=True)
    for n, path in enumerate(files):
        table = pq.read_table(path)
        began_cpu, began = time.process_time(), time.perf_counter()
        with pq.ParquetWriter(out / f"{n}.parquet", table.schema, compression="zstd") as writer:
            writer.write_table(table, row_group_size=ROW_GROUP_SIZE)
        wall += time.perf_counter() - began
        cpu += time.process_time() - began_cpu
        rows, size = rows + table.num_rows, size + path.stat().st_size
        (out / f"{n}.parquet").unlink()
        del table
    return wall, cpu, rows, size


def _plain_figures(files: list[str], as_of: date, settings: Settings, scratch: Path,
                   full: Timeline, progress: Progress) -> list[tuple[str, str]]:
    """Issue 13 goal 2: the full recompute against the plain statement, same lake, same run,
    with the standings compared row for row."""
    task = progress.add_task("plain SQL statement (issue 13 baseline)", total=None)
    out, lake = scratch / "plain", settings.lake_dir
    try:
        wall, cpu, rows, peaks = _plain_statement(files, as_of, lake, out, settings.registry)
        compared, differ = _same_standings(out, lake, as_of)
    finally:
        progress.remove_task(task)
        shutil.rmtree(out, ignore_errors=True)
    task = progress.add_task("format floor: rewrite the published standings", total=None)
    try:
        f_wall, f_cpu, f_rows, f_bytes = _format_floor(lake, as_of, scratch / "format-floor")
    finally:
        progress.remove_task(task)
        shutil.rmtree(scratch / "format-floor", ignore_errors=True)
    return [
        (f"plain statement (one DuckDB COPY: dedupe, explode, count, aggregate, rank, "
         f"percentile, Parquet by board; peak memory {_gib(peaks.memory)}, "
         f"spill {_gib(peaks.spill)})",
         f"{_per(wall, cpu)} ({rows:,} rows)"),
        ("standings identical (board, window, player, score, rank; rows differing both ways)",
         f"{'yes' if differ == 0 and compared == rows else 'NO'}: {compared:,} rows, "
         f"{differ:,} differ"),
        ("full recompute / plain statement, wall", _ratio(full.seconds / wall, "<= 0.5x")),
        ("full recompute / plain statement, CPU", _ratio(full.cpu / cpu, "<= 0.5x")),
        (f"format floor: writing the published standings alone from memory ({f_rows:,} rows,"
         f" 12 columns zstd, {_gib(f_bytes)}) / plain statement",
         f"{_per(f_wall, f_cpu)}: {f_wall / wall:.2f}x wall, {f_cpu / cpu:.2f}x CPU"),
    ]


def _section_full(season: Season, scratch: Path, args: argparse.Namespace, console: Console,
                  progress: Progress) -> Timeline | None:
    """Sections 1 and 2; returns the full recompute's timeline (None if skipped or failed)."""
    as_of = season.last_day
    files = season.files(as_of)
    task = progress.add_task(f"floor: best of {args.floor_repeats}", total=None)
    floor_s, floor_cpu, floor_rows = _floor(files, args.floor_repeats)
    progress.remove_task(task)
    title = "1. full recompute vs the one-pass floor"
    figures = [
        ("as of / landed files read", f"{as_of} / {len(files):,}"),
        (f"floor: GROUP BY player_id sum(points), best of {args.floor_repeats} "
         f"({floor_rows:,} players)", _per(floor_s, floor_cpu)),
    ]
    if "full" in args.skip:
        _figures(console, title + " (full recompute skipped)", figures)
        return None
    with _data_dir(season, scratch, "full") as settings:
        result, full = _run(settings, as_of, progress, "full recompute", engine="duckdb",
                            full=True)
        if result is None:
            _figures(console, title, figures)
            _failed(console, "full recompute", full)
            return None
        figures += [
            ("events absorbed (deduped)", f"{result.events:,}"),
            ("board-windows built / standings rows",
             f"{result.windows_built:,} / {result.standings_rows:,}"),
            ("full recompute (run_batch full=True, DuckDB)", _per(full.seconds, full.cpu)),
            ("full recompute / floor, wall", _ratio(full.seconds / floor_s, "<= 4x")),
            ("full recompute / floor, CPU", _ratio(full.cpu / floor_cpu, "<= 4x")),
        ]
        figures += _memory_figures(full, settings.lake_dir)
        if "plain" not in args.skip:
            figures += _plain_figures(files, as_of, settings, scratch, full, progress)
        _figures(console, title, figures)
        _breakdown(console, "full recompute: where the time goes", full)
        if "incremental" in args.skip:
            return full
        # Section 2 reuses this data dir: as_of - 1 in full, then as_of incrementally.
        previous, before = _run(settings, as_of - _DAY, progress, "full recompute, day before",
                                engine="duckdb", full=True, instrument=False)
        if previous is None:
            _failed(console, "2. full recompute as of the day before", before)
            return full
        incremental, inc = _run(settings, as_of, progress, "incremental", engine="duckdb",
                                full=False)
        if incremental is None:
            _failed(console, "2. incremental", inc)
            return full
        published = sum(b["rows"] for b in incremental.manifest.boards.values())
        task = progress.add_task("compare the night's standings with the full recompute's",
                                 total=None)
        try:
            compared, differ = _same_versions(settings.lake_dir, result.manifest,
                                              incremental.manifest)
        finally:
            progress.remove_task(task)
        figures = [
            ("full recompute as of the day before",
             f"{_per(before.seconds, before.cpu)} ({previous.events:,} events)"),
            ("incremental run mode / new events absorbed",
             f"{incremental.mode} / {incremental.events:,}"),
            ("board-windows rebuilt / standings rows written",
             f"{incremental.windows_built:,} / {incremental.standings_rows:,}"),
            ("standings rows rewritten / rows published (bounds the ratio below)",
             f"{incremental.standings_rows:,} / {published:,} = "
             f"{incremental.standings_rows / max(published, 1):.2f}"),
            ("standings identical to the full recompute's (board, window, player, score, "
             "rank; rows differing both ways)",
             f"{'yes' if differ == 0 and compared == published else 'NO'}: {compared:,} "
             f"rows, {differ:,} differ"),
            ("incremental", _per(inc.seconds, inc.cpu)),
            ("one new day / full recompute (same as_of), wall",
             _ratio(inc.seconds / full.seconds, "<= 0.25, issue 13 goal 3")),
            ("one new day / full recompute (same as_of), CPU",
             _ratio(inc.cpu / full.cpu, "<= 0.25")),
        ]
        _figures(console, "2. one new day incremental vs full recompute", figures)
        _breakdown(console, "incremental: where the time goes", inc)
    return full


def _section_pandas(season: Season, scratch: Path, args: argparse.Namespace, console: Console,
                    progress: Progress, full: Timeline | None) -> None:
    days = args.pandas_days or season.spec.days
    as_of = season.spec.start + timedelta(days=days - 1)
    files = season.files(as_of)
    watermark = watermark_for(as_of)
    engine = full if days == season.spec.days else None
    if engine is None and "full" not in args.skip:
        with _data_dir(season, scratch, "pandas-subset") as settings:
            _, engine = _run(settings, as_of, progress, "engine on the pandas subset",
                             engine="duckdb", full=True, instrument=False)
        if engine.error:
            console.print(f"engine on the pandas subset failed: {engine.error}")
            engine = None
    task = progress.add_task("DuckDB SQL, reduced job (child process)", total=None)
    sql = _reduced_job("duckdb", files, watermark)
    progress.remove_task(task)
    task = progress.add_task("pandas, reduced job (child process)", total=None)
    panda = _reduced_job("pandas", files, watermark)
    progress.remove_task(task)
    agree = (panda["all_time"], panda["daily"]) == (sql["all_time"], sql["daily"])
    read = panda["seconds"]["read"]

    def parts(job: dict[str, Any]) -> str:
        return ", ".join(f"{k} {v:.1f}" for k, v in job["seconds"].items())

    figures = [
        ("data", f"ingest days 1..{days} of {season.spec.days} ({len(files):,} files, "
                 f"{panda['events']:,} deduped events)"),
        (f"pandas reduced job ({parts(panda)}); peak RSS {panda['peak_rss_gib']:.1f} GiB",
         _per(panda["wall"], panda["cpu"])),
        (f"DuckDB SQL reduced job ({parts(sql)}); peak RSS {sql['peak_rss_gib']:.1f} GiB",
         _per(sql["wall"], sql["cpu"])),
        ("reduced-job results agree (rows, rank sums, score sums)", "yes" if agree else
         f"NO: pandas {panda['all_time']} {panda['daily']} / "
         f"duckdb {sql['all_time']} {sql['daily']}"),
        ("pandas / DuckDB SQL, same reduced job, wall (like for like)",
         _ratio(panda["wall"] / sql["wall"], ">= 10x")),
        ("pandas / DuckDB SQL, same reduced job, CPU",
         f"{panda['cpu'] / sql['cpu']:.2f}x"),
    ]
    if engine is None:
        figures.append(("DuckDB engine: run_batch full", "not run (skipped or failed)"))
    else:
        figures += [
            ("DuckDB engine: run_batch full (every board and window, published)",
             _per(engine.seconds, engine.cpu)),
            ("pandas reduced job / DuckDB engine full job, wall",
             _ratio(panda["wall"] / engine.seconds, ">= 10x")),
            ("  same, without pandas' file reading",
             f"{(panda['wall'] - read) / engine.seconds:.2f}x"),
        ]
    _figures(console, "3. DuckDB vs plain pandas", figures)


def _spark_session() -> Any:
    """A local session configured as SparkEngine builds one, minus the console progress bars;
    run_batch's engines use it as the active session (and leave it running)."""
    from pyspark.sql import SparkSession

    master = os.environ.get("SPARK_MASTER") or "local[2]"
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (SparkSession.builder.master(master).appName("bench-batch")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.shuffle.partitions",
                       os.environ.get("SPARK_SHUFFLE_PARTITIONS") or "8")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.ui.enabled", "false")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session


def _section_spark(args: argparse.Namespace, cache: Path, scratch: Path, console: Console,
                   progress: Progress) -> None:
    task = progress.add_task("spark: starting a session", total=None)
    try:
        began = time.perf_counter()
        session = _spark_session()
        started = time.perf_counter() - began
        batch.open_engine("spark").close()  # the engine imports and binds to the session
    except Exception as exc:  # any failure means: not available
        console.print(f"[bold]4. Spark[/]: spark engine not available: {exc!r}")
        return
    finally:
        progress.remove_task(task)
    rows: list[tuple[str, str]] = [
        ("master / shuffle partitions", f"{session.sparkContext.master} / "
         f"{session.conf.get('spark.sql.shuffle.partitions')}"),
        ("session start seconds (not in the run times)", f"{started:.2f}"),
    ]
    runs: dict[str, Timeline] = {}
    try:
        # The first 1x run warms the JVM up (class loading, JIT) and is not counted.
        for name, scale in (("warm-up 1x", 1), ("1x", 1), ("4x", 4)):
            spec = GenerateSpec(players=args.spark_players * scale, days=args.days,
                                events_per_day=max(2, args.spark_events * scale // args.days),
                                seed=args.seed, dirty=args.dirty)
            season = _season(spec, cache, args.regenerate and name != "1x", console)
            with _data_dir(season, scratch, f"spark-{name.replace(' ', '-')}") as settings:
                result, timeline = _run(settings, season.last_day, progress, f"spark {name}",
                                        engine="spark", full=True, instrument=False)
            if result is None:
                rows.append((f"{name} failed after {_per(timeline.seconds, timeline.cpu)}",
                             timeline.error))
                break
            runs[name] = timeline
            rows.append((f"{name}: {spec.players:,} players, {result.events:,} events, "
                         f"{result.standings_rows:,} standings rows",
                         _per(timeline.seconds, timeline.cpu)))
            if name != "warm-up 1x":
                rows.append((f"  {name} stages, wall s", ", ".join(
                    f"{stage.split(' (')[0]} {s:.1f}" for stage, s, _ in timeline.stages()
                    if s >= 0.05)))
    except Exception as exc:  # report and carry on
        rows.append(("spark run failed", repr(exc)[:300]))
    finally:
        session.stop()
    if "1x" in runs and "4x" in runs:
        rows.append(("time(4x) / time(1x), wall",
                     _ratio(runs["4x"].seconds / runs["1x"].seconds, "<= 4, linear")))
        rows.append(("time(4x) / time(1x), CPU (driver + JVM + workers)",
                     _ratio(runs["4x"].cpu / runs["1x"].cpu, "<= 4, linear")))
    _figures(console, "4. Spark scaling", rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--players", type=int, default=1_000_000)
    parser.add_argument("--events", type=int, default=20_000_000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--dirty", type=float, default=0.02,
                        help="dirt share (retries, late, malformed), so dedupe has work")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", type=lambda p: Path(p).resolve(),
                        default=Path(tempfile.gettempdir()) / "bench_batch_cache",
                        help="where generated seasons are kept and reused")
    parser.add_argument("--regenerate", action="store_true", help="ignore a cached season")
    parser.add_argument("--floor-repeats", type=int, default=3)
    parser.add_argument("--memory-limit", default="8GB",
                        help="DuckDB memory_limit for the engine and the baselines; '' keeps "
                             "DuckDB's default (80%% of RAM, too much for a shared machine)")
    parser.add_argument("--temp-limit", default="30GB",
                        help="DuckDB max_temp_directory_size (spill); a run that needs more "
                             "fails and is reported; '' keeps DuckDB's (90%% of free disk)")
    parser.add_argument("--pandas-days", type=int, default=0,
                        help="run section 3 on ingest days 1..N only (0: all days)")
    parser.add_argument("--spark-events", type=int, default=1_000_000)
    parser.add_argument("--spark-players", type=int, default=50_000)
    parser.add_argument("--skip", default="",
                        help="comma list of: full (the engine runs of sections 1-3; the floor "
                             "still runs), plain (issue 13's one-statement baseline), "
                             "incremental, pandas, spark")
    parser.add_argument("--quick", action="store_true",
                        help="a small run: 100k players, 2M events, Spark 200k/800k events")
    args = parser.parse_args(argv)
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    LIMITS.update(memory_limit=args.memory_limit, max_temp_directory_size=args.temp_limit)
    if args.quick:
        args.players, args.events = 100_000, 2_000_000
        args.spark_players, args.spark_events = 10_000, 200_000

    console = Console()
    if not console.is_terminal:  # a log file: wide enough for the tables
        console = Console(width=120)
    spec = GenerateSpec(players=args.players, days=args.days,
                        events_per_day=max(2, args.events // args.days), seed=args.seed,
                        dirty=args.dirty)
    console.print(f"[bold]bench_batch[/]: {spec.players:,} players, "
                  f"{spec.days * spec.events_per_day:,} events over {spec.days} days, "
                  f"dirty {spec.dirty:.0%}, {os.cpu_count()} CPUs, duckdb {duckdb.__version__}, "
                  f"pandas {pd.__version__}, pyarrow {pa.__version__}, DuckDB memory_limit "
                  f"{args.memory_limit or 'default'}, temp limit {args.temp_limit or 'default'}, "
                  f"load average {os.getloadavg()[0]:.2f}")
    season = _season(spec, args.cache, args.regenerate, console)
    console.print(f"season: {season.root} ({season.accepted:,} landed rows; "
                  + (f"generated in {season.generate_seconds:.1f} s)" if season.generate_seconds
                     else "reused from the cache)"))
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with tempfile.TemporaryDirectory(prefix="bench_batch_") as scratch_dir, \
            Progress(*columns, console=console, transient=True) as progress:
        scratch = Path(scratch_dir)
        home = Path.cwd()
        os.chdir(scratch)  # DuckDB spills to ./.tmp by default: keep that out of the repo
        try:
            full = _section_full(season, scratch, args, console, progress)
            console.print(f"load average now {os.getloadavg()[0]:.2f}")
            if "pandas" not in args.skip:
                _section_pandas(season, scratch, args, console, progress, full)
                console.print(f"load average now {os.getloadavg()[0]:.2f}")
            if "spark" not in args.skip:
                _section_spark(args, args.cache, scratch, console, progress)
        finally:
            os.chdir(home)
    console.print(f"load average at the end {os.getloadavg()[0]:.2f} (noisy if above "
                  f"{os.cpu_count()})")


if __name__ == "__main__":
    main()
