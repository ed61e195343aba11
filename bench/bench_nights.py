"""Benchmark nights at a constant daily volume: is a night's cost flat in the history?

Generates --days days of --events-per-day events (--players players; cached under --cache,
reused by later runs of the same shape), then runs one night after another as the DAG runs
them (dags/nightly_standings.py): the batch writes the version (`run_batch`, publish=False),
the release checks and publishes it, compaction rewrites the day's landing files, retention
deletes raw partitions past the registry's retention_days and sweeps killed runs' files, and
the analysts' warehouse is refreshed (no speed layer: its rebase is not measured). The
raw events are a copy of the cached ones (compaction and retention change them), each day's
partition copied in before its night. --nights N stops after N nights of the history.

Prints, as same-run figures (CPU seconds of this process: DuckDB's threads included):

1. flat nights (issue 13 goal 1): the batch CPU of the nights after --late days of history
   (mean of --span nights ending there) over those after --early days; goal <= 1.2x.
   Default 60 days over 10; --large: 365 over 10, at 3,000 events a day and 2,000 players
   unless given (a night's fixed costs dominate there: one run at 30,000 a day took well
   over an hour on a shared 2-core box).
2. one new day / full at its size (issue 13 goal 3, at this size): the last night's batch
   against a full recompute as of the same day on the raw events before retention, with the
   standings rows the night rewrote over the rows the version publishes (which bounds it).
   Both versions' standings are compared row for row.

Per night it also prints the board-windows built and carried forward, the event dates whose
rollups were read, and the CPU of the tasks after the batch; after the run, the CPU of each
of those tasks (validate, publish, compact, retention, sweep, warehouse) of the early nights
beside the late ones. --phases adds the batch CPU per phase (plan, roll up, engine passes,
stream, checks, Parquet, manifest) of the early nights beside the late ones: what grows with
the history.

Usage: python bench/bench_nights.py [--players 20000] [--events-per-day 30000] [--days 60]
       [--large] [--early 10] [--span 5] [--memory-limit 4GB] [--cache DIR] [--seed 0]
       [--dirty 0.02] [--every N] [--quick] [--profile N] [--phases] [--nights N]
       [--land-ahead]
On a shared machine, run it under `flock` on a lock file all benchmarks share.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import pstats
import re
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from app.generate import GenerateSpec
from app.season import generate_season, season_key
from jobs import batch, publish
from jobs.compact import SpeedWatermark, compact_partition
from jobs.release import publish_version, validate_version
from jobs.retention import apply_retention
from jobs.sweep import sweep_dead_runs
from jobs.warehouse import refresh_warehouse
from leaderboard.manifest import Manifest, read_version
from leaderboard.registry import Registry
from leaderboard.settings import Settings


def _cpu() -> float:
    """CPU seconds (user + system) of this process, every thread (DuckDB's) included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Night:
    day: date
    mode: str
    batch_cpu: float
    batch_wall: float
    after_cpu: float  # release + compaction + retention + sweep + warehouse
    tasks: dict[str, float]  # CPU s of each post-batch task (the DAG's order)
    built: int
    carried: int
    dates_read: int
    rows_written: int
    rows_published: int


def _season(spec: GenerateSpec, registry: Registry, cache: Path,
            say: Callable[[str], None]) -> Path:
    """The generated lake's root under `cache`: generated once per shape and registry (the
    product's, LEADERBOARD_CONFIG; bench_batch's key, so a lake generated before the
    registry changed is never reused)."""
    root = cache / f"nights-{season_key(spec, registry)}"
    done = root / "complete.json"
    if done.exists():
        return root
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    say(f"generating {spec.days} days of {spec.events_per_day:,} events ({spec.players:,} "
        "players)")
    began = time.perf_counter()
    report = generate_season(spec, registry, root / "lake")
    done.write_text(json.dumps({"accepted": report.accepted, "registry": registry.fingerprint,
                                "seconds": time.perf_counter() - began,
                                "spec": {k: str(v) for k, v in asdict(spec).items()}}))
    return root


#: Where a night's batch spends its CPU (--phases): (module or class, attribute, label).
#: Inclusive times; `stream` (the engine's sort and ranking as the writer drains it) is
#: part of `write_stream`, and `check`/`parquet` are inside it too.
_PHASES: list[tuple[Any, str, str]] = [
    (batch, "_plan", "plan"), (batch, "_sweep", "sweep"), (batch, "_roll_up", "roll up"),
    (batch, "_carry_plan", "carry plan"), (batch, "_rank", "rank (all)"),
    (batch, "_checked_manifest", "checks"), (batch, "seal", "seal"),
    (batch, "write_version", "manifest"),
    (publish.StandingsWriter, "write_stream", "write_stream"),
    (publish.StandingsWriter, "write_histograms", "histograms"),
    (publish, "check_standings", "check"),
    (pq.ParquetWriter, "write_table", "parquet"),
]


class _Phases:
    """CPU seconds per phase of the nights it is on for (patched functions, timed)."""

    def __init__(self) -> None:
        self.on = False
        self.seconds: dict[str, float] = {}
        self.engine: dict[str, float] = {}

    def _timed(self, label: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return function(*args, **kwargs)
            began = _cpu()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + _cpu() - began
        return timed

    @contextmanager
    def patched(self) -> Iterator[None]:
        saved = [(owner, name, getattr(owner, name)) for owner, name, _ in _PHASES]
        for owner, name, label in _PHASES:
            setattr(owner, name, self._timed(label, getattr(owner, name)))
        try:
            yield
        finally:
            for owner, name, function in saved:
                setattr(owner, name, function)

    def wrap_engine(self, engine: Any) -> Any:
        for name in ("rollup_events", "merge_rollups", "standings"):
            setattr(engine, name, self._timed(f"engine.{name}", getattr(engine, name)))
        return engine


PHASES = _Phases()


@contextmanager
def _capped(memory_limit: str) -> Iterator[None]:
    """Every DuckDB engine run_batch opens runs under `memory_limit`."""
    open_engine = batch.open_engine

    def capped(name: str, **options: Any) -> Any:
        engine = open_engine(name, **options)
        con = getattr(engine, "con", None)
        if con is not None and memory_limit:
            con.execute(f"SET memory_limit = '{memory_limit}'")
        return PHASES.wrap_engine(engine)

    batch.open_engine = capped
    try:
        yield
    finally:
        batch.open_engine = open_engine


def _pinned(settings: Settings, registry: Registry) -> Settings:
    """`settings` whose registry is `registry` (its lazily read property filled in), so every
    night and the final full recompute use the registry the run began with."""
    settings.__dict__["registry"] = registry
    return settings


def _published_rows(lake: Path, manifest: Manifest) -> int:
    index = manifest.standings(lake)
    return int(sum(index.column("rows").to_pylist()))


_RANKING = re.compile(r"ranking (\d+) board-window\(s\), (\d+) carried forward; reading the "
                      r"rollups of (\d+) event date")


def _night(settings: Settings, day: date, *, full: bool = False,
           dag: bool = True) -> tuple[Night, Manifest]:
    lake = settings.lake_dir
    messages: list[str] = []
    cpu, wall = _cpu(), time.perf_counter()
    result = batch.run_batch(settings, day, full=full, step=messages.append, publish=False,
                             allow_rewind=True)
    batch_cpu, batch_wall = _cpu() - cpu, time.perf_counter() - wall
    built = carried = dates = 0
    for message in messages:
        found = _RANKING.search(message)
        if found:
            built, carried, dates = (int(x) for x in found.groups())
    tasks: dict[str, float] = {}

    def task(label: str, run: Callable[[], object]) -> None:
        began = _cpu()
        run()
        tasks[label] = _cpu() - began

    if dag:
        version = result.manifest.version
        quiet = SpeedWatermark(present=False)
        task("validate", lambda: validate_version(lake, version, registry=settings.registry,
                                                  as_of=day))
        task("publish", lambda: publish_version(lake, version))
        task("compact", lambda: compact_partition(lake, day, speed=quiet))
        task("retention", lambda: apply_retention(lake, day, settings.registry.retention_days,
                                                  speed=quiet, registry=settings.registry))
        task("sweep", lambda: sweep_dead_runs(lake))
        task("warehouse", lambda: refresh_warehouse(settings.data_dir, settings.registry))
    manifest = read_version(lake, result.manifest.version)
    night = Night(day, result.mode, batch_cpu, batch_wall, sum(tasks.values()), tasks, built,
                  carried, dates, result.standings_rows, _published_rows(lake, manifest))
    return night, manifest


def _standings(lake: Path, manifest: Manifest) -> dict[tuple[str, str], pa.Table]:
    """Every published board-window's rows (the file's window cut out)."""
    index = manifest.standings(lake)
    tables: dict[str, pa.Table] = {}
    out = {}
    for board, window_id, path in zip(index.column("board").to_pylist(),
                                      index.column("window_id").to_pylist(),
                                      index.column("path").to_pylist(), strict=True):
        if path not in tables:
            tables[path] = pq.read_table(lake / path)
        table = tables[path]
        out[(board, window_id)] = table.filter(
            pc.equal(table.column("window_id"), window_id))
    return out


def _mean(nights: list[Night], last: int, span: int) -> float:
    chosen = [n.batch_cpu for n in nights[max(0, last - span):last]]
    return statistics.fmean(chosen) if chosen else float("nan")


def _print_phases(phases: dict[int, dict[str, float]], early: range, late: range,
                  what: str = "batch CPU per phase (inclusive; mean s)") -> None:
    """Mean CPU per phase over the early and the late nights, side by side."""
    labels = sorted({k for p in phases.values() for k in p},
                    key=lambda k: -sum(p.get(k, 0.0) for p in phases.values()))
    print()
    print(f"{what}: nights {early.start}-{early.stop - 1} beside {late.start}-{late.stop - 1}")
    for label in labels:
        a = statistics.fmean(phases[n].get(label, 0.0) for n in early if n in phases)
        b = statistics.fmean(phases[n].get(label, 0.0) for n in late if n in phases)
        print(f"  {label:>22} {a:>7.3f} {b:>7.3f}  {b / a if a else float('nan'):>5.2f}x")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--players", type=int, help="default 20,000 (--large: 2,000)")
    parser.add_argument("--events-per-day", type=int,
                        help="default 30,000 (--large: 3,000)")
    parser.add_argument("--days", type=int, default=60)
    parser.add_argument("--large", action="store_true", help="365 days of history")
    parser.add_argument("--nights", type=int,
                        help="stop after this many nights of the history (default: every day)")
    parser.add_argument("--land-ahead", action="store_true",
                        help="land every day's partition before the first night (as this "
                             "bench did before: every listing then weighs the days to come)")
    parser.add_argument("--early", type=int, default=10)
    parser.add_argument("--span", type=int, default=5, help="nights averaged per figure")
    parser.add_argument("--memory-limit", default="4GB")
    parser.add_argument("--dirty", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--every", type=int, default=0,
                        help="print every Nth night (default: about 20 lines)")
    parser.add_argument("--profile", type=int, action="append", default=[],
                        help="print where night N's batch spends its time (repeatable)")
    parser.add_argument("--phases", action="store_true",
                        help="print the batch CPU per phase, early nights beside late ones")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 14 nights of 3,000 events, 2,000 players")
    parser.add_argument("--cache", default=str(Path(tempfile.gettempdir())
                                               / "leaderboard-bench-cache"))
    args = parser.parse_args(argv)
    small = args.quick or args.large
    args.players = args.players or (2_000 if small else 20_000)
    args.events_per_day = args.events_per_day or (3_000 if small else 30_000)
    if args.quick:
        args.days = 14
        args.early, args.span = min(args.early, 5), min(args.span, 3)
    history = 365 if args.large else args.days
    days = min(args.nights or history, history)
    start = date(2026, 1, 1)
    spec = GenerateSpec(players=args.players, days=history, events_per_day=args.events_per_day,
                        start=start, seed=args.seed, dirty=args.dirty)

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    # One registry for the whole run, read once: a Settings reads it lazily, and a run
    # outlives edits to the tree (the old --large crash: its final full recompute loaded
    # the registry file a rebase had changed an hour into the run, and the code loaded at
    # the start refused the new file's `boards[3].source`).
    registry = Settings.from_env().registry
    root = _season(spec, registry, Path(args.cache), say)
    print(f"bench_nights: {days} nights of {args.events_per_day:,} events a day, "
          f"{args.players:,} players, DuckDB memory_limit {args.memory_limit}")
    every = args.every or max(1, days // 20)
    nights: list[Night] = []
    early_span = range(max(1, args.early - args.span + 1), args.early + 1)
    late_span = range(days - args.span + 1, days + 1)
    phases: dict[int, dict[str, float]] = {}
    timed = PHASES.patched() if args.phases else contextlib.nullcontext()
    with timed, tempfile.TemporaryDirectory(prefix="bench_nights_") as scratch, \
            _capped(args.memory_limit):
        data = Path(scratch) / "data"
        (data / "lake" / "events").mkdir(parents=True)
        waiting = sorted((root / "lake" / "events").glob("ingest_date=*"))
        while args.land_ahead and waiting:
            shutil.copytree(waiting[0], data / "lake" / "events" / waiting.pop(0).name)
        settings = _pinned(Settings.from_env(data_dir=str(data)), registry)
        print(f"{'night':>6} {'as of':>10} {'mode':>11} {'batch CPU s':>11} {'wall s':>7} "
              f"{'after CPU s':>11} {'built':>6} {'carried':>7} {'dates read':>10} "
              f"{'rows written':>12} {'published':>10}")
        for number in range(1, days + 1):
            profiler = cProfile.Profile() if number in args.profile else None
            if profiler is not None:
                profiler.enable()
            PHASES.on = args.phases and (number in early_span or number in late_span)
            today = start + timedelta(days=number - 1)
            # The day's partition lands before its night, as it would live: the lake never
            # holds days to come (their files would weigh on every listing of it).
            while waiting and waiting[0].name <= f"ingest_date={today.isoformat()}":
                shutil.copytree(waiting[0], data / "lake" / "events" / waiting.pop(0).name)
            night, last = _night(settings, today)
            if PHASES.on:
                phases[number], PHASES.seconds = PHASES.seconds, {}
                PHASES.on = False
            if profiler is not None:
                profiler.disable()
                print(f"-- night {number}: the 25 calls with the most cumulative time")
                pstats.Stats(profiler, stream=sys.stdout).sort_stats("cumulative").print_stats(25)
            nights.append(night)
            if number % every == 0 or number in (1, args.early, days):
                print(f"{number:>6} {night.day.isoformat():>10} {night.mode:>11} "
                      f"{night.batch_cpu:>11.2f} {night.batch_wall:>7.2f} "
                      f"{night.after_cpu:>11.2f} {night.built:>6} {night.carried:>7} "
                      f"{night.dates_read:>10} {night.rows_written:>12,} "
                      f"{night.rows_published:>10,}", flush=True)
        # The full recompute at the last night's size, on the raw events before retention.
        full_data = Path(scratch) / "full"
        (full_data / "lake").mkdir(parents=True)
        (full_data / "lake" / "events").symlink_to(root / "lake" / "events")
        full_settings = _pinned(Settings.from_env(data_dir=str(full_data)), registry)
        full, full_manifest = _night(full_settings, nights[-1].day, full=True, dag=False)
        lake = settings.lake_dir
        same = _standings(lake, last) == _standings(full_data / "lake", full_manifest)

    if phases:
        _print_phases(phases, early_span, late_span)
    _print_phases({n: nights[n - 1].tasks for n in (*early_span, *late_span)}, early_span,
                  late_span, "post-batch CPU per DAG task (mean s)")
    early = _mean(nights, args.early, args.span)
    late = _mean(nights, days, args.span)
    ratio = late / early
    incremental = nights[-1]
    print()
    print(f"flat nights: batch CPU of nights {days - args.span + 1}-{days} / nights "
          f"{args.early - args.span + 1}-{args.early}: {late:.2f} s / {early:.2f} s = "
          f"{ratio:.2f}x (goal <= 1.2x) {'met' if ratio <= 1.2 else 'NOT met'}")
    whole_early = statistics.fmean(n.batch_cpu + n.after_cpu
                                   for n in nights[max(0, args.early - args.span):args.early])
    whole_late = statistics.fmean(n.batch_cpu + n.after_cpu for n in nights[days - args.span:])
    print(f"whole DAG night (batch + release, compaction, retention, sweep, warehouse), same "
          "nights: "
          f"{whole_late:.2f} s / {whole_early:.2f} s = {whole_late / whole_early:.2f}x")
    # A night re-ranks every window it touches: the long windows' player counts grow until
    # every player has appeared in them, which no carrying can avoid.
    per_early = statistics.fmean(n.batch_cpu / max(1, n.rows_written) for n in
                                 nights[max(0, args.early - args.span):args.early]) * 1e6
    per_late = statistics.fmean(n.batch_cpu / max(1, n.rows_written)
                                for n in nights[days - args.span:]) * 1e6
    print(f"batch CPU per standings row rewritten, same nights: {per_late:.2f} us / "
          f"{per_early:.2f} us = {per_late / per_early:.2f}x")
    share = incremental.batch_cpu / full.batch_cpu
    print(f"one new day / full at {days} days: {incremental.batch_cpu:.2f} s / "
          f"{full.batch_cpu:.2f} s CPU = {share:.2f} (goal <= 0.25) "
          f"{'met' if share <= 0.25 else 'NOT met'}; wall {incremental.batch_wall:.2f} s / "
          f"{full.batch_wall:.2f} s")
    print(f"rows rewritten / rows published: {incremental.rows_written:,} / "
          f"{incremental.rows_published:,} = "
          f"{incremental.rows_written / max(1, incremental.rows_published):.2f} "
          "(the floor of a night that re-ranks every window it touches)")
    print(f"standings of the last night equal the full recompute's: {same}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
