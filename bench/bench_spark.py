"""Benchmark the Spark engine against DuckDB on the same lake, and its scaling (issue 13 goal 4).

Generates (or reuses, from bench_batch's cache) two seasons with bench_batch's generator: 1x
(--players, --events) and 4x (four times both). On each, as of its last day, a full
recompute (`run_batch(full=True)`) runs through the DuckDB engine and through the Spark
engine (local[2] unless SPARK_MASTER says otherwise), each on its own fresh data dir over the
same landed files, and the two published standings are checked identical (row count and a
content digest). Printed as same-run ratios:

1. Spark / DuckDB at 1x and at 4x (wall and CPU; CPU counts the JVM and Python workers);
2. Spark time(4x) / time(1x), goal <= 4 (linear); DuckDB's beside it for reference.

A Spark warm-up run (the 1x season, not counted) goes first: JVM start, class loading and
JIT are paid once, as in a long-lived cluster. The session's start is printed apart. DuckDB
runs under --memory-limit, as in bench_batch.

Usage: python bench/bench_spark.py [--players 50000] [--events 1000000] [--days 30]
       [--dirty 0.02] [--seed 0] [--cache DIR] [--memory-limit 8GB] [--quick]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bench_batch  # beside this file: the season generator and cache, the timed run_batch
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from app.generate import GenerateSpec
from leaderboard.batch_view import open_current


@dataclass(frozen=True)
class Measured:
    wall: float
    cpu: float
    events: int
    rows: int
    digest: str
    #: run_batch's stages (between its step messages) and their wall seconds
    stages: tuple[tuple[str, float], ...] = ()


def _digest(lake: Path) -> tuple[int, str]:
    """Rows and a digest of every published standings row (board, window, then rank order),
    so two engines' outputs compare by content, not by file names."""
    view = open_current(lake)
    assert view is not None, f"nothing published under {lake}"
    sha = hashlib.sha256()
    rows = 0
    for board, window_id in sorted(view.windows()):
        table = view.standings(board, window_id)
        if table is None:
            continue
        rows += table.num_rows
        sha.update(f"{board}|{window_id}|{table.num_rows}".encode())
        for column in table.columns:
            sha.update(str(column.to_pylist()).encode())
    return rows, sha.hexdigest()[:16]


def _measure(season: bench_batch.Season, scratch: Path, progress: Progress, label: str,
             engine: str) -> Measured | str:
    """One full recompute on a fresh data dir over the season's lake; an error message if it
    failed."""
    with bench_batch._data_dir(season, scratch, label.replace(" ", "-")) as settings:
        result, timeline = bench_batch._run(settings, season.last_day, progress, label,
                                            engine=engine, full=True, instrument=False)
        if result is None:
            return f"{label} failed after {timeline.seconds:.1f} s: {timeline.error}"
        rows, digest = _digest(settings.lake_dir)
    stages = tuple((name.split(" (")[0], seconds) for name, seconds, _ in timeline.stages()
                   if seconds >= 0.05)
    return Measured(timeline.seconds, timeline.cpu, result.events, rows, digest, stages)


def _per(m: Measured) -> str:
    return f"{m.wall:.2f} s wall, {m.cpu:.2f} s CPU"


def _ratio(value: float, goal: str = "") -> str:
    return f"{value:.2f}x" + (f" (goal {goal})" if goal else "")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--players", type=int, default=50_000)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--dirty", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", type=lambda p: Path(p).resolve(),
                        default=Path(tempfile.gettempdir()) / "bench_batch_cache",
                        help="where generated seasons are kept (shared with bench_batch)")
    parser.add_argument("--memory-limit", default="8GB", help="DuckDB memory_limit")
    parser.add_argument("--quick", action="store_true",
                        help="a small run: 10k players, 200k events (x4 for 4x)")
    args = parser.parse_args(argv)
    if args.quick:
        args.players, args.events = 10_000, 200_000
    bench_batch.LIMITS.update(memory_limit=args.memory_limit)

    console = Console() if Console().is_terminal else Console(width=120)
    console.print(f"[bold]bench_spark[/]: 1x = {args.players:,} players, {args.events:,} "
                  f"events over {args.days} days; 4x = four times both; {os.cpu_count()} CPUs, "
                  f"load average {os.getloadavg()[0]:.2f}")
    seasons = {}
    for name, scale in (("1x", 1), ("4x", 4)):
        spec = GenerateSpec(players=args.players * scale, days=args.days,
                            events_per_day=max(2, args.events * scale // args.days),
                            seed=args.seed, dirty=args.dirty)
        seasons[name] = bench_batch._season(spec, args.cache, False, console)
        console.print(f"season {name}: {seasons[name].root} "
                      f"({seasons[name].accepted:,} landed rows)")

    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    rows: list[tuple[str, str]] = []
    runs: dict[tuple[str, str], Measured] = {}
    with tempfile.TemporaryDirectory(prefix="bench_spark_") as scratch_dir, \
            Progress(*columns, console=console, transient=True) as progress:
        scratch = Path(scratch_dir)
        home = Path.cwd()
        os.chdir(scratch)  # DuckDB spills to ./.tmp by default: keep that out of the repo
        began = time.perf_counter()
        session: Any = bench_batch._spark_session()
        rows.append(("Spark master / shuffle partitions / session start",
                     f"{session.sparkContext.master} / "
                     f"{session.conf.get('spark.sql.shuffle.partitions')} / "
                     f"{time.perf_counter() - began:.1f} s"))
        try:
            warm = _measure(seasons["1x"], scratch, progress, "spark warm-up", "spark")
            rows.append(("spark warm-up 1x (not counted)",
                         warm if isinstance(warm, str) else _per(warm)))
            for name in ("1x", "4x"):
                for engine in ("duckdb", "spark"):
                    found = _measure(seasons[name], scratch, progress, f"{engine} {name}",
                                     engine)
                    if isinstance(found, str):
                        rows.append((f"{engine} {name}", found))
                        continue
                    runs[(engine, name)] = found
                    rows.append((f"{engine} {name}: {found.events:,} events, "
                                 f"{found.rows:,} standings rows", _per(found)))
                    rows.append((f"  {engine} {name} stages, wall s", ", ".join(
                        f"{stage} {seconds:.1f}" for stage, seconds in found.stages)))
        finally:
            session.stop()
            os.chdir(home)

    for name in ("1x", "4x"):
        duck, spark = runs.get(("duckdb", name)), runs.get(("spark", name))
        if duck and spark:
            same = (duck.rows, duck.digest) == (spark.rows, spark.digest)
            rows.append((f"{name}: standings identical (rows, digest)",
                         "yes" if same else f"NO: duckdb {duck.rows} {duck.digest}, "
                                            f"spark {spark.rows} {spark.digest}"))
            rows.append((f"{name}: Spark / DuckDB, wall", _ratio(spark.wall / duck.wall)))
            rows.append((f"{name}: Spark / DuckDB, CPU", _ratio(spark.cpu / duck.cpu)))
    for engine in ("spark", "duckdb"):
        one, four = runs.get((engine, "1x")), runs.get((engine, "4x"))
        if one and four:
            goal = "<= 4, linear" if engine == "spark" else ""
            rows.append((f"{engine} time(4x) / time(1x), wall", _ratio(four.wall / one.wall,
                                                                        goal)))
            rows.append((f"{engine} time(4x) / time(1x), CPU", _ratio(four.cpu / one.cpu,
                                                                       goal)))
    table = Table(title="Spark engine vs DuckDB, full recompute (issue 13 goal 4)",
                  title_justify="left", title_style="bold", show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column(justify="right")
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    console.print(f"load average at the end {os.getloadavg()[0]:.2f} (noisy if above "
                  f"{os.cpu_count()})")


if __name__ == "__main__":
    main()
