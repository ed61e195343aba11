"""Benchmark the speed layer: the fold's sustained rate, score visibility, and Redis memory.

Starts one local Redis itself (EmbeddedRedis, no persistence) and prints, in one run:

1. baseline: `redis-benchmark -p PORT -P 32 -r 100000 -n N -q zincrby lbbench __rand_int__ 1`
   as given (note: __rand_int__ lands in the *increment*, so it bumps one member "1"), and
   the same with the random value as the member (`zincrby lbbench_members 1 __rand_int__`,
   100k members: what the fold does); with INFO commandstats usec per ZINCRBY. Without
   redis-benchmark, a Python pipelined ZINCRBY baseline (random members) instead.
2. sustained fold rate: events/s through `Folder.fold` (default registry: 15 board-windows an
   event) over micro-batches of generated events landed by the real landing path, against
   no base version or (--base) a published one; Redis commands per event (client round-trip
   commands, and commands run inside the scripts), ZSET updates per event (M updates + T
   first-touch writes), Redis script time (commandstats evalsha usec) against the wall, and
   ZSET updates/s over the baselines' ZINCRBY ops/s.
3. score visibility: accepted -> visible in M, p50/p99, at each sustained offered load of
   --rate, through `Ingestor.ingest` (validate, door, land, fold) for --duration seconds.
   Events arrive evenly; a micro-batch closes every --interval seconds, or when the previous
   ingest returns if that is later (it then takes all that arrived meanwhile, as a live
   ingest loop would). An event arriving at t waits for its batch's cutoff, then its batch's
   ingest, which returns after the fold, so ZSCORE in M reflects it then (checked on a
   sampled player per batch).
4. memory: Redis bytes per touched player-board-window (MEMORY USAGE of the M/T/C/L keys of
   the fold run over their cardinality) and bytes per id of the door's record after
   claiming and settling --door-ids ids (and per id in flight), with the default 16384
   buckets and with ~ids/96 buckets.

Figures only, no assertions. Times are wall seconds on a possibly shared machine: compare the
ratios to the same-run baselines, not the absolute figures.

Usage: python bench/bench_speed.py [--players 100000] [--events 1000000]
       [--batch-events 50000] [--base] [--rate 10000,3000] [--interval 0.1] [--duration 25]
       [--door-ids 2000000] [--benchmark-requests 2000000] [--seed 0]
       [--skip baseline,fold,visibility,memory,door] [--quick]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import redis
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from app.generate import GenerateSpec, generate_events
from app.season import generate_season
from leaderboard.lake import LandingWriter, landed_files
from leaderboard.redis_server import EmbeddedRedis
from leaderboard.registry import Registry, load_registry
from leaderboard.speed_keys import BoardWindowKeys, SpeedVersion
from speed_layer import fold as fold_module
from speed_layer.door import Door
from speed_layer.fold import Folder
from speed_layer.ingest import Ingestor
from speed_layer.service import SpeedLayer

_START = date(2026, 11, 2)
_SECTIONS = ("baseline", "fold", "visibility", "memory", "door")
#: Commands the bench itself sends for its readings; not part of the fold's traffic.
_OWN_COMMANDS = {"info", "config|resetstat", "scan", "memory|usage", "zcard", "flushall",
                 "dbsize", "ping", "hello", "client|setinfo", "strlen"}


# -- helpers -----------------------------------------------------------------------------------

class _CountingConnection(redis.Connection):
    """A connection that counts the commands it sends (single and pipelined)."""

    sent = 0

    def pack_command(self, *args: Any) -> list[bytes]:
        _CountingConnection.sent += 1
        return super().pack_command(*args)

    def pack_commands(self, commands: Any) -> list[bytes]:
        commands = list(commands)
        _CountingConnection.sent += len(commands)
        return super().pack_commands(commands)


def _counting_client(server: EmbeddedRedis) -> redis.Redis:
    pool = redis.ConnectionPool(host="127.0.0.1", port=server.port, protocol=2,
                                connection_class=_CountingConnection)
    return redis.Redis(connection_pool=pool)


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console, transient=True)


def _commandstats(client: redis.Redis) -> dict[str, dict[str, float]]:
    return {name.removeprefix("cmdstat_"): stats
            for name, stats in client.info("commandstats").items()}


def _figures(title: str) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold", show_header=False,
                  box=None)
    table.add_column(style="bold")
    table.add_column(justify="right")
    return table


@dataclass
class _Timer:
    """Seconds and calls per named stage, by wrapping callables."""

    seconds: Counter[str] = field(default_factory=Counter)
    calls: Counter[str] = field(default_factory=Counter)

    def wrap(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - began
                self.calls[name] += 1
        return timed


@contextmanager
def _patched(module: Any, name: str, replacement: Any) -> Iterator[None]:
    original = getattr(module, name)
    setattr(module, name, replacement)
    try:
        yield
    finally:
        setattr(module, name, original)


# -- 1. baseline -------------------------------------------------------------------------------

@dataclass
class Baseline:
    label: str
    ops: float
    usec_per_call: float | None


def _redis_benchmark(exe: str, server: EmbeddedRedis, control: redis.Redis, requests: int,
                     command: list[str]) -> Baseline:
    control.config_resetstat()
    run = subprocess.run([exe, "-p", str(server.port), "-P", "32", "-r", "100000",
                          "-n", str(requests), "-q", *command],
                         capture_output=True, text=True, check=True)
    found = re.findall(r"([\d.]+) requests per second", run.stdout.replace("\r", "\n"))
    stats = _commandstats(control).get("zincrby", {})
    return Baseline(f"redis-benchmark -P 32 -r 100000 -n {requests:,} {' '.join(command)}",
                    float(found[-1]) if found else float("nan"), stats.get("usec_per_call"))


def _python_baseline(control: redis.Redis, requests: int) -> Baseline:
    control.config_resetstat()
    rng = np.random.default_rng(0)
    members = [f"{m:012d}" for m in rng.integers(0, 100_000, size=min(requests, 500_000))]
    began = time.perf_counter()
    for start in range(0, len(members), 1000):
        pipe = control.pipeline(transaction=False)
        for member in members[start:start + 1000]:
            pipe.zincrby("lbbench_members", 1, member)
        pipe.execute()
    seconds = time.perf_counter() - began
    stats = _commandstats(control).get("zincrby", {})
    return Baseline("Python pipelined ZINCRBY (1000 a round trip, 100k random members)",
                    len(members) / seconds, stats.get("usec_per_call"))


def baseline(server: EmbeddedRedis, control: redis.Redis, requests: int,
             console: Console) -> list[Baseline]:
    exe = shutil.which("redis-benchmark")
    found = []
    with console.status("baseline: redis-benchmark ZINCRBY"):
        if exe:
            found.append(_redis_benchmark(exe, server, control, requests,
                                          ["zincrby", "lbbench", "__rand_int__", "1"]))
            found.append(_redis_benchmark(exe, server, control, requests,
                                          ["zincrby", "lbbench_members", "1", "__rand_int__"]))
        else:
            console.print("[yellow]redis-benchmark is not installed (Debian: redis-tools); "
                          "using a Python pipelined ZINCRBY baseline instead[/]")
            found.append(_python_baseline(control, requests))
    control.delete("lbbench", "lbbench_members")
    return found


# -- 2. the sustained fold rate ----------------------------------------------------------------

@dataclass
class FoldRun:
    events: int
    batches: int
    seconds: float
    plan_seconds: float
    script_seconds: float
    updates_m: int
    writes_t: int
    client_commands: int
    script_commands: int
    version: SpeedVersion
    players: int
    in_script: dict[str, int]
    usec: dict[str, float]


def _land_season(spec: GenerateSpec, registry: Registry, lake: Path, console: Console) -> None:
    with _progress(console) as progress:
        task = progress.add_task("generate + land events", total=None)
        generate_season(spec, registry, lake,
                        progress=lambda done, total: progress.update(task, completed=done,
                                                                     total=total))


def _publish_base(data: Path, as_of: date, console: Console) -> SpeedVersion:
    from jobs.batch import run_batch
    from leaderboard.settings import Settings

    with console.status(f"batch: publishing a base version as of {as_of}"):
        manifest = run_batch(Settings.from_env({"LEADERBOARD_DATA": str(data)}), as_of).manifest
    return SpeedVersion(manifest.version, manifest.watermark_at)


def fold_rate(client: redis.Redis, control: redis.Redis, registry: Registry, data: Path,
              args: argparse.Namespace, console: Console) -> FoldRun:
    lake = data / "lake"
    spec = GenerateSpec(players=args.players, days=2 if args.base else 1,
                        events_per_day=args.events, start=_START, seed=args.seed,
                        batch_minutes=5, writer="gen")
    _land_season(spec, registry, lake, console)
    version = _publish_base(data, _START, console) if args.base else SpeedVersion(None, None)
    files = landed_files(lake)
    if version.watermark is not None:
        files = [f for f in files if f.ingest_date >= version.watermark.date()]
    table = pa.concat_tables(pq.read_table(f.path) for f in files)
    if version.watermark is not None:
        table = table.filter(pc.greater_equal(table.column("ingested_at"), pa.scalar(
            version.watermark, table.schema.field("ingested_at").type)))
    table = table.combine_chunks()
    batches = [table.slice(i, args.batch_events)
               for i in range(0, table.num_rows, args.batch_events)]
    folder = Folder(client, registry, lake)
    if version.version is not None:
        with console.status("loading base keys of the touched board-windows"):
            # Base standings load once per board-window and version (cached by the Folder);
            # loaded here so the timed run measures the steady state.
            for update in fold_module.plan_updates(table, registry, version.watermark):
                base = folder.base(version)
                (base.window if hasattr(base, "window") else base.lookup)(update.board,
                                                                         update.window.id)
    timer = _Timer()
    updates = [0]
    plan = fold_module.plan_updates

    def counted_plan(*a: Any, **k: Any) -> Any:
        found = plan(*a, **k)
        updates[0] += sum(len(u.players) for u in found)
        return found

    before = _commandstats(control)
    sent = _CountingConnection.sent
    with _patched(fold_module, "plan_updates", timer.wrap("plan", counted_plan)), \
            _progress(console) as progress:
        task = progress.add_task("fold micro-batches", total=len(batches))
        began = time.perf_counter()
        for seq, batch in enumerate(batches):
            folder.fold(version, "bench", seq, batch, prev=seq - 1)  # files chain as landed
            progress.advance(task)
        seconds = time.perf_counter() - began
    client_commands = _CountingConnection.sent - sent
    after = _commandstats(control)
    delta = {name: int(stats["calls"] - before.get(name, {}).get("calls", 0))
             for name, stats in after.items()}
    script_usec = after.get("evalsha", {}).get("usec", 0) - before.get("evalsha", {}).get("usec", 0)
    total = sum(calls for name, calls in delta.items() if name not in _OWN_COMMANDS)
    writes_t = sum(int(control.zcard(key)) for key in
                   control.scan_iter(match=f"lb:{{*}}:{version.tag}:T", count=1000))
    players = int(control.zcard(BoardWindowKeys("global", "all-time", version.tag).merged))
    # What the client sent itself: SMEMBERS, EVALSHA, SADD (windows) and HSET (progress)
    # once a micro-batch, SCRIPT LOAD once; the rest ran inside the scripts.
    in_script = {name: calls - (len(batches) if name in ("sadd", "hset") else 0)
                 for name, calls in delta.items()
                 if name not in _OWN_COMMANDS and name not in ("evalsha", "smembers")
                 and not name.startswith("script")}
    in_script = {name: calls for name, calls in in_script.items() if calls > 0}
    usec = {name: stats["usec_per_call"] for name, stats in after.items() if name in in_script}
    return FoldRun(events=table.num_rows, batches=len(batches), seconds=seconds,
                   plan_seconds=timer.seconds["plan"], script_seconds=script_usec / 1e6,
                   updates_m=updates[0], writes_t=writes_t, client_commands=client_commands,
                   script_commands=total - client_commands, version=version, players=players,
                   in_script=in_script, usec=usec)


def print_fold(run: FoldRun, baselines: list[Baseline], args: argparse.Namespace,
               console: Console) -> None:
    against = (f"base version {run.version.version}" if run.version.version
               else "no base version")
    figures = _figures(f"2. sustained fold rate ({against})")
    rate = run.events / run.seconds
    updates = run.updates_m + run.writes_t
    figures.add_row("events folded / micro-batches",
                    f"{run.events:,} / {run.batches:,} of {args.batch_events:,}")
    figures.add_row("players (generated / touched on global all-time)",
                    f"{args.players:,} / {run.players:,}")
    figures.add_row("wall seconds", f"{run.seconds:.2f}")
    figures.add_row("events/s through Folder.fold (goal >= 50,000)", f"{rate:,.0f}")
    figures.add_row("  client round-trip commands per event",
                    f"{run.client_commands / run.events:.4f} "
                    f"({run.client_commands / run.batches:.1f} a micro-batch)")
    figures.add_row("  commands inside the scripts per event",
                    f"{run.script_commands / run.events:.2f}")
    figures.add_row("    by command (calls per event, usec a call)",
                    ", ".join(f"{name} {calls / run.events:.2f} ({run.usec[name]:.1f})"
                              for name, calls in sorted(run.in_script.items(),
                                                        key=lambda kv: -kv[1])
                              if calls / run.events >= 0.005))
    figures.add_row("  ZSET updates per event (M updates + T first-touch writes)",
                    f"{updates / run.events:.2f} ({run.updates_m / run.events:.2f} + "
                    f"{run.writes_t / run.events:.2f}; 15 board-windows an event before "
                    "aggregation)")
    figures.add_row("  Redis script time (commandstats evalsha usec) / wall",
                    f"{run.script_seconds:.2f} s / {run.seconds:.2f} s "
                    f"({run.script_seconds / run.seconds:.0%})")
    figures.add_row("  client plan_updates (aggregation) / wall",
                    f"{run.plan_seconds:.2f} s ({run.plan_seconds / run.seconds:.0%}); the rest "
                    "is encoding, sending and waiting")
    figures.add_row("  Redis script microseconds per ZSET update",
                    f"{run.script_seconds / max(updates, 1) * 1e6:.2f}")
    figures.add_row("ZSET updates/s", f"{updates / run.seconds:,.0f}")
    for found in baselines:
        figures.add_row(f"  / {found.label}",
                        f"{updates / run.seconds / found.ops:.2f}x of {found.ops:,.0f} ops/s")
    console.print(figures)


# -- 3. score visibility -----------------------------------------------------------------------

@dataclass
class Visibility:
    rate: int
    latencies: np.ndarray
    ingest_seconds: np.ndarray
    batch_rows: np.ndarray
    events: int
    elapsed: float
    stages: dict[str, float]
    checked: int
    visible: int


def _live_pool(rate: int, duration: float, players: int, seed: int,
               registry: Registry) -> tuple[pa.Table, np.ndarray]:
    """Raw events for `duration` seconds at `rate`, in landing order, with each row's
    simulated landing clock (us): a batch lands at the latest clock of its rows, so no row is
    in the future."""
    spec = GenerateSpec(players=players, days=1, events_per_day=int(rate * duration),
                        start=_START + timedelta(days=10), seed=seed + 1, batch_minutes=1)
    tables, stamps = [], []
    for landing, raw in generate_events(spec, registry):
        tables.append(raw)
        stamps.append(np.full(raw.num_rows, _us(landing), dtype=np.int64))
    return pa.concat_tables(tables).combine_chunks(), np.concatenate(stamps)


def _us(instant: datetime) -> int:
    return (instant - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def visibility(client: redis.Redis, registry: Registry, data: Path, rate: int,
               args: argparse.Namespace, console: Console) -> Visibility:
    """Events arrive evenly at `rate`; a micro-batch closes every --interval, or as soon as
    the previous ingest returns if that is later (then it takes everything that arrived
    meanwhile, as a live ingest loop would); latency = ingest return - arrival."""
    lake = data / f"live-lake-{rate}"
    client.flushall()
    pool, landing_us = _live_pool(rate, args.duration, args.players, args.seed, registry)
    speed = SpeedLayer(client, registry, lake)
    timer = _Timer()
    speed.door.claim = timer.wrap("door claim", speed.door.claim)  # type: ignore[method-assign]
    speed.door.end = timer.wrap("door settle", speed.door.end)  # type: ignore[method-assign]
    speed.folder.fold = timer.wrap("fold", speed.folder.fold)  # type: ignore[method-assign]
    merged = BoardWindowKeys("global", "all-time", "none").merged
    interval, total = args.interval, pool.num_rows
    warmup = min(total, rate)  # events of the first second: scripts load, caches fill
    latencies, ingests, sizes = [], [], []
    checked = visible = 0
    with LandingWriter(lake, "live") as writer:
        writer.land = timer.wrap("land", writer.land)  # type: ignore[method-assign]
        ingestor = Ingestor(registry, writer, speed)
        with _progress(console) as progress:
            task = progress.add_task(f"ingest at {rate:,} events/s offered", total=total)
            origin = time.perf_counter() + 0.05
            cutoff, begin = origin, 0
            while begin < total:
                cutoff = max(cutoff + interval, time.perf_counter())
                wait = cutoff - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                end = min(total, int((cutoff - origin) * rate))
                if end <= begin:
                    continue
                chunk = pool.slice(begin, end - begin)
                now = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(
                    microseconds=int(landing_us[begin:end].max()))
                began = time.perf_counter()
                report = ingestor.ingest(chunk, now=now, source="bench")
                done = time.perf_counter()
                counted = np.arange(max(begin, warmup), end)
                if len(counted):
                    latencies.append(done - (origin + counted / rate))
                    ingests.append(done - began)
                    sizes.append(end - begin)
                if report.accepted:
                    checked += 1
                    player = chunk.column("player_id")[0].as_py()
                    visible += client.zscore(merged, player) is not None
                progress.update(task, completed=end)
                begin = end
            elapsed = time.perf_counter() - origin
    stages = {name: seconds / max(timer.calls[name], 1) for name, seconds in timer.seconds.items()}
    return Visibility(rate, np.concatenate(latencies) if latencies else np.zeros(0),
                      np.array(ingests), np.array(sizes), max(total - warmup, 0), elapsed,
                      stages, checked, visible)


def print_visibility(found: Visibility, args: argparse.Namespace, console: Console) -> None:
    figures = _figures(f"3. score visibility at {found.rate:,} events/s offered, batches "
                       f"closing every {args.interval * 1000:.0f} ms (or when the previous "
                       "ingest returns, if later)")
    lat = found.latencies * 1000
    figures.add_row("events measured (after the first second)", f"{found.events:,}")
    figures.add_row("wall seconds / offered seconds",
                    f"{found.elapsed:.1f} / {args.duration:.1f}")
    if len(lat):
        figures.add_row("accepted -> visible in M, p50 (ms)", f"{np.percentile(lat, 50):.0f}")
        figures.add_row("accepted -> visible in M, p99 (ms, goal <= 200)",
                        f"{np.percentile(lat, 99):.0f}")
        figures.add_row("accepted -> visible in M, max (ms)", f"{lat.max():.0f}")
        ingest = found.ingest_seconds * 1000
        figures.add_row("ingest() duration p50 / p99 (ms)",
                        f"{np.percentile(ingest, 50):.0f} / {np.percentile(ingest, 99):.0f}")
        figures.add_row("micro-batch events p50 / max",
                        f"{np.percentile(found.batch_rows, 50):,.0f} / "
                        f"{found.batch_rows.max():,}")
        figures.add_row("ingest capacity at that batch size (events / ingest seconds)",
                        f"{found.batch_rows.sum() / found.ingest_seconds.sum():,.0f} events/s")
    for stage, seconds in sorted(found.stages.items()):
        figures.add_row(f"  mean {stage} per batch (ms)", f"{seconds * 1000:.1f}")
    figures.add_row("batches whose sampled player was in M when ingest returned",
                    f"{found.visible} / {found.checked}")
    console.print(figures)


# -- 4. memory ---------------------------------------------------------------------------------

def state_memory(control: redis.Redis, run: FoldRun, console: Console) -> None:
    used: Counter[str] = Counter()
    members: Counter[str] = Counter()
    keys: Counter[str] = Counter()
    with console.status("MEMORY USAGE of the fold's keys"):
        for raw in control.scan_iter(match=f"lb:{{*}}:{run.version.tag}:*", count=1000):
            kind = raw.decode().rsplit(":", 1)[1]
            used[kind] += int(control.memory_usage(raw, samples=0) or 0)
            keys[kind] += 1
            kind_type = control.type(raw).decode()
            members[kind] += int(control.zcard(raw) if kind_type == "zset" else
                                 control.hlen(raw) if kind_type == "hash" else
                                 control.scard(raw))
    touched = members["M"]
    figures = _figures("4a. Redis bytes per touched player-board-window (the fold run's state)")
    figures.add_row("touched player-board-windows (members of every M)", f"{touched:,}")
    figures.add_row("players touched (global all-time)", f"{run.players:,}")
    for kind in sorted(used):
        figures.add_row(f"  {kind}: keys / members / bytes",
                        f"{keys[kind]:,} / {members[kind]:,} / {used[kind]:,}")
    figures.add_row("bytes per touched player-board-window (M+T+C+L)",
                    f"{sum(used.values()) / max(touched, 1):.1f}")
    figures.add_row("  M alone, per member", f"{used['M'] / max(touched, 1):.1f}")
    if members["T"]:
        figures.add_row("  T alone, per member", f"{used['T'] / members['T']:.1f}")
    console.print(figures)


def _id_table(start: int, count: int) -> pa.Table:
    numbers = np.arange(start, start + count)
    return pa.table({
        "match_id": pc.binary_join_element_wise("m", pc.cast(pa.array(numbers // 4),
                                                             pa.string()), ""),
        "player_id": pc.binary_join_element_wise("p", pc.cast(pa.array(numbers), pa.string()),
                                                 ""),
    })


def door_memory(client: redis.Redis, registry: Registry, ids: int, console: Console) -> None:
    figures = _figures(f"4b. the door's record: bytes per remembered id ({ids:,} ids, "
                       "one generation; goal <= 16)")
    at = datetime(2026, 11, 20, 12, tzinfo=UTC)
    chunk = 20_000
    for buckets in dict.fromkeys((16384, max(1, ids // 96))):
        client.flushall()
        door = Door(client, registry.idempotency_horizon, buckets=buckets)
        door.mark_epoch("bench")  # the record belongs to this (bench) state: claims check it
        with _progress(console) as progress:
            task = progress.add_task(f"claim and settle ids, {buckets:,} buckets", total=ids)
            began = time.perf_counter()
            for start in range(0, ids, chunk):
                # The ingest path: claim (in flight), then settle once the rows "landed".
                door.claim(_id_table(start, min(chunk, ids - start)), at, "bench",
                           start, epoch="bench").claim.settle()
                progress.advance(task, min(chunk, ids - start))
            seconds = time.perf_counter() - began
        used, remembered = door.memory()
        sample = pa.concat_tables([_id_table(0, 1000), _id_table(ids, 1000)])
        admission = door.claim(sample, at + timedelta(hours=1), "bench", ids, epoch="bench")
        admission.claim.release()  # the new ids did not land
        seen = admission.seen
        # An id in flight (claimed, landing not settled) costs its record in the writer's
        # in-flight key and its field in the holders hash on top of its fingerprint.
        flying = door.claim(_id_table(ids + 1000, chunk), at, "bench", ids + 1, epoch="bench")
        in_flight_used, _ = door.memory()
        flying.claim.release()
        figures.add_row(f"{buckets:,} buckets ({ids / buckets:.0f} ids a bucket): bytes / ids",
                        f"{used:,} / {remembered:,}")
        figures.add_row("  bytes per id", f"{used / max(remembered, 1):.2f}")
        figures.add_row(f"  bytes per id in flight ({chunk:,} claimed, not settled)",
                        f"{(in_flight_used - used) / chunk:.2f}")
        figures.add_row("  claim + settle rate (ids/s); known ids seen, new ids seen",
                        f"{ids / seconds:,.0f}; {int(seen[:1000].sum())}/1000, "
                        f"{int(seen[1000:].sum())}/1000")
    client.flushall()
    console.print(figures)


# -- main --------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--players", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=1_000_000,
                        help="events to fold (one generated day; --base adds a day before)")
    parser.add_argument("--batch-events", type=int, default=50_000,
                        help="micro-batch size for the sustained fold")
    parser.add_argument("--base", action="store_true",
                        help="fold against a published base version (runs the batch job)")
    parser.add_argument("--rate", type=lambda text: [int(r) for r in text.split(",")],
                        default=[10_000, 3_000],
                        help="offered events/s for the visibility run; a comma list runs each")
    parser.add_argument("--interval", type=float, default=0.1, help="micro-batch seconds")
    parser.add_argument("--duration", type=float, default=25.0, help="visibility run seconds")
    parser.add_argument("--door-ids", type=int, default=2_000_000)
    parser.add_argument("--benchmark-requests", type=int, default=2_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip", default="", help=f"comma list of {','.join(_SECTIONS)}")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args(argv)
    skip = {s for s in args.skip.split(",") if s}
    if skip - set(_SECTIONS):
        parser.error(f"--skip takes {','.join(_SECTIONS)}, not {','.join(skip - set(_SECTIONS))}")
    if args.quick:
        args.players, args.events, args.batch_events = 5_000, 50_000, 10_000
        args.duration, args.door_ids, args.benchmark_requests = 3.0, 100_000, 100_000
    console = Console()
    registry = load_registry()
    console.print(f"[bold]bench_speed[/]: {args.players:,} players, {args.events:,} events in "
                  f"micro-batches of {args.batch_events:,}, {len(registry.boards)} boards, "
                  f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="bench_speed_") as scratch:
        server = EmbeddedRedis(dir=Path(scratch) / "redis").start()
        try:
            console.print(f"Redis: {server.url} "
                          f"({redis.Redis(port=server.port).info('server')['redis_version']})")
            control = redis.Redis(host="127.0.0.1", port=server.port, protocol=2)
            client = _counting_client(server)
            baselines = ([] if "baseline" in skip else
                         baseline(server, control, args.benchmark_requests, console))
            if baselines:
                figures = _figures("1. baseline: ZINCRBY, same server, same run")
                for found in baselines:
                    usec = ("" if found.usec_per_call is None
                            else f" ({found.usec_per_call:.2f} usec a call in Redis)")
                    figures.add_row(found.label, f"{found.ops:,.0f} ops/s{usec}")
                console.print(figures)
            run = None
            if "fold" not in skip:
                run = fold_rate(client, control, registry, Path(scratch) / "data", args,
                                console)
                print_fold(run, baselines, args, console)
                if "memory" not in skip:
                    state_memory(control, run, console)
            for rate in ([] if "visibility" in skip else args.rate):
                found = visibility(client, registry, Path(scratch) / "data", rate, args,
                                   console)
                print_visibility(found, args, console)
            if "door" not in skip:
                door_memory(client, registry, args.door_ids, console)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
