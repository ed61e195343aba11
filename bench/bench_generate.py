"""Benchmark the synthetic season generator end to end: generate + validate + land.

Generates a season into a temporary lake and prints events/s, then measures a baseline in the
same run: writing the same landed rows with pyarrow.parquet alone (zstd, one file, from a table
already in memory). The ratio generator/raw-write is what to compare across machines.

Usage: python bench/bench_generate.py [--players 1000000] [--events 20000000] [--days 30]
       [--dirty 0.0] [--batch-minutes 60] [--seed 0] [--generate-only]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from app.generate import GenerateSpec, generate_events
from app.season import GenerateReport, generate_season
from leaderboard.lake import ROW_GROUP_SIZE, landed_files
from leaderboard.registry import load_registry
from leaderboard.schema import LANDED_SCHEMA


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def _run(spec: GenerateSpec, lake: Path, console: Console) -> tuple[GenerateReport, float]:
    registry = load_registry()
    columns = (TextColumn("[bold]generate"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("rows", total=None)

        def advance(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        cpu = _cpu_seconds()
        report = generate_season(spec, registry, lake, progress=advance)
        cpu = _cpu_seconds() - cpu
    return report, cpu


def _generate_only(spec: GenerateSpec) -> float:
    """Seconds to produce every raw batch, with no validation and no I/O."""
    began = time.perf_counter()
    for _ in generate_events(spec, load_registry()):
        pass
    return time.perf_counter() - began


def _raw_write(lake: Path, scratch: Path) -> tuple[int, float]:
    """Rows and seconds to write the landed rows again with pyarrow.parquet alone."""
    table = pa.concat_tables(pq.read_table(f.path, schema=LANDED_SCHEMA)
                             for f in landed_files(lake))
    table = table.combine_chunks()
    began = time.perf_counter()
    pq.write_table(table, scratch / "raw.parquet", compression="zstd",
                   row_group_size=ROW_GROUP_SIZE)
    return table.num_rows, time.perf_counter() - began


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--players", type=int, default=1_000_000)
    parser.add_argument("--events", type=int, default=20_000_000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--dirty", type=float, default=0.0)
    parser.add_argument("--batch-minutes", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--generate-only", action="store_true",
                        help="also time generating the raw batches alone (no validation, no I/O)")
    args = parser.parse_args(argv)
    spec = GenerateSpec(players=args.players, days=args.days,
                        events_per_day=max(2, args.events // args.days), seed=args.seed,
                        dirty=args.dirty, batch_minutes=args.batch_minutes)
    console = Console()
    console.print(f"[bold]bench_generate[/]: {spec.players:,} players, "
                  f"{spec.days * spec.events_per_day:,} events over {spec.days} days, "
                  f"dirty {spec.dirty:.0%}, {spec.batch_minutes}-minute batches, "
                  f"{os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="bench_generate_") as scratch_dir:
        scratch = Path(scratch_dir)
        report, cpu = _run(spec, scratch / "lake", console)
        raw_rows, raw_seconds = _raw_write(scratch / "lake", scratch)
        generate_seconds = _generate_only(spec) if args.generate_only else None

    rate = report.events / report.seconds
    figures = Table(show_header=False, box=None)
    figures.add_column(style="bold")
    figures.add_column(justify="right")
    figures.add_row("clean events", f"{report.events:,}")
    figures.add_row("rows offered / accepted / rejected",
                    f"{report.rows:,} / {report.accepted:,} / {report.rejected:,}")
    figures.add_row("files / quarantine files", f"{report.files:,} / {report.quarantine_files:,}")
    figures.add_row("wall seconds", f"{report.seconds:.2f}")
    figures.add_row("events/s (generate + validate + land)", f"{rate:,.0f}")
    figures.add_row("CPU seconds (all threads)", f"{cpu:.2f}")
    figures.add_row("CPU microseconds per event", f"{cpu / report.events * 1e6:.3f}")
    for stage, seconds in report.stage_seconds.items():
        figures.add_row(f"  {stage} busy seconds (stages overlap)",
                        f"{seconds:.2f} ({seconds / report.events * 1e6:.3f} us/event)")
    if generate_seconds is not None:
        figures.add_row("generate only: events/s (no validation, no I/O)",
                        f"{report.events / generate_seconds:,.0f}")
    figures.add_row("baseline: pyarrow.parquet zstd write, rows/s",
                    f"{raw_rows / raw_seconds:,.0f} ({raw_rows:,} rows, {raw_seconds:.2f} s)")
    # raw_rows == report.accepted: the baseline rewrites exactly the rows the generator landed.
    figures.add_row("generator / raw write (time, same rows)",
                    f"{report.seconds / raw_seconds:.2f}x")
    console.print(figures)


if __name__ == "__main__":
    main()
