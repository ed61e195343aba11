"""The nightly batch job: authoritative standings for every board and window as of a date.

Usage: python -m jobs.batch --as-of 2026-12-01 [--engine duckdb|spark] [--full] [--data DIR]
                            [--allow-rewind] [--allow-open-day]
       spark-submit jobs/batch.py --as-of 2026-12-01 --engine spark

Version V (as_of D) absorbs exactly the landed events with ingested_at < W = D+1 00:00 UTC
(a night not ended is refused, exit 2, unless --allow-open-day: then W is the instant the
run reads the lake):
dedupe by (match_id, player_id), first ingested wins; roll up per (player, event_date,
region, mode, lateness mask); rebuild only the event dates and windows that received new
rows since the previous version (or everything, on the first run, after a registry change,
after a landing into partitions it had closed, or with --full); drop banned players; rank; check;
write beside the live version and swap `manifests/current.json`.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jobs.erase import repair_stopped, stopped_erasures
from jobs.publish import PublishError, RewindRefused, StandingsWriter, not_published, seal
from jobs.retention import deleted_through
from jobs.revoid import Revoid, plan_revoid
from jobs.spec import (
    CARRY_KINDS,
    CARRY_SCHEMA,
    ROLLUP_SCHEMA,
    LatenessBit,
    StandingsResult,
    board_window_spec,
    calendar_table,
    lateness_bits,
)
from jobs.sweep import SweepRefused, hold_run, sweep_dead_runs
from leaderboard.bans import banned_players
from leaderboard.binding import bind_registry, board_digests, rollup_layout
from leaderboard.calendar import ALL_TIME, Calendar
from leaderboard.erasure import erasure_barrier
from leaderboard.event_dates import event_date_range
from leaderboard.faults import checkpoint
from leaderboard.lake import (
    ROW_GROUP_SIZE,
    LandedFile,
    LandingStuck,
    absorbed_with_compactions,
    landed_files,
    settle_landings,
)
from leaderboard.manifest import (
    ROLLUP_INDEX_SCHEMA,
    STANDINGS_INDEX_SCHEMA,
    Manifest,
    list_versions,
    manifests_dir,
    rollup_files,
    swap_current,
    watermark_for,
    write_version,
)
from leaderboard.registry import Registry
from leaderboard.retained import redoable
from leaderboard.settings import Settings
from leaderboard.sortkey import SortKeyOverflow
from leaderboard.timeutil import format_instant
from leaderboard.visibility import unread_before
from leaderboard.voids import voids_before, voids_digest

__all__ = ["BatchResult", "Engine", "FullAfterRetention", "OpenNightRefused", "main",
           "open_engine", "plan_windows", "run_batch"]

Step = Callable[[str], None]


class Engine(Protocol):
    name: str

    def rollup_events(self, files: list[str], *, watermark: datetime, since: datetime | None,
                      absorbed: list[str], calendar: pa.Table, bits: list[Any],
                      voids: pa.Table | None = None) -> tuple[pa.Table, int]: ...

    def merge_rollups(self, old: pa.Table, delta: pa.Table) -> pa.Table: ...

    def standings(self, rollups: pa.Table, *, spec: pa.Table, calendar: pa.Table,
                  needed: pa.Table, banned: list[str], delta: pa.Table | None = None,
                  carry: pa.Table | None = None) -> StandingsResult: ...

    def finish(self) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class BatchResult:
    manifest: Manifest
    mode: str  # "full" | "incremental"
    events: int  # events newly absorbed by this version
    windows_built: int
    standings_rows: int
    seconds: float


def open_engine(name: str, *, spark_master: str | None = None) -> Engine:
    """An engine by name; `spark_master` is the Spark engine's master (ignored by DuckDB)."""
    if name == "duckdb":
        from jobs.duckdb_engine import DuckDBEngine

        return DuckDBEngine()
    if name == "spark":
        from jobs.spark_engine import SparkEngine

        return SparkEngine(master=spark_master)
    raise ValueError(f"unknown engine {name!r}; use duckdb or spark")


def _previous(lake: Path, as_of: date, registry: Registry) -> Manifest | None:
    """The newest written version before `as_of` (the base of an incremental run).

    Version ids begin with their as_of date, so only the manifests of the newest earlier
    date are read, not every version's (their inputs grow with the history)."""
    days: dict[str, list[Path]] = {}
    for path in manifests_dir(lake).glob("*.json"):
        day = path.name[:10]
        if path.name != "current.json" and day < as_of.isoformat():
            days.setdefault(day, []).append(path)
    if not all(_is_day(day) for day in days):
        return _previous_of(list_versions(lake), as_of, registry)
    for day in sorted(days, reverse=True):
        found = []
        for path in days[day]:
            try:
                found.append(Manifest.from_json(path.read_text()))
            except (ValueError, TypeError):
                continue
        if found:
            return _previous_of(found, as_of, registry)
    return None


def _is_day(text: str) -> bool:
    try:
        date.fromisoformat(text)
    except ValueError:
        return False
    return True


def _previous_of(versions: list[Manifest], as_of: date, registry: Registry) -> Manifest | None:
    candidates = [m for m in versions if m.as_of_date < as_of]
    if not candidates:
        return None
    latest = max(candidates, key=lambda m: (m.as_of, m.created_at))
    if latest.registry_fingerprint == registry.fingerprint:
        return latest
    # A rebind: the rollups serve when they mean the same under both registries.
    return latest if latest.inputs.get("rollup_layout") == rollup_layout(registry) else None


def plan_windows(registry: Registry, dates: list[date], as_of: date,
                 boards: set[str] | None = None) -> set[tuple[str, str]]:
    """Every (board, window_id) that contains one of `dates`, or is open on `as_of` (of
    `boards` only, when given)."""
    calendar = registry.calendar
    needed: set[tuple[str, str]] = set()
    chosen = [b for b in registry.boards if boards is None or b.name in boards]
    kinds = {k for b in chosen for k in b.windows}
    ids: dict[str, set[str]] = {k: set() for k in kinds}
    for day in [*dates, as_of]:
        for kind in kinds:
            window = calendar.window_on(kind, day)
            if window is not None:
                ids[kind].add(window.id)
    for board in chosen:
        for kind in board.windows:
            needed.update((board.name, window_id) for window_id in ids[kind])
    return needed


def _rollup_dates(table: pa.Table) -> list[date]:
    if table.num_rows == 0:
        return []
    return sorted(pc.unique(table.column("event_date")).to_pylist())


def _events_in(table: pa.Table) -> int:
    return int(pc.sum(table.column("matches")).as_py() or 0) if table.num_rows else 0


ROLLUP_FILE_ROWS = 4_000_000


def _date_player_ordered(table: pa.Table) -> bool:
    """Whether the rows are already in (event_date, player_id) order, as the DuckDB engine
    hands them over (sorted in parallel there): one pass of comparisons, where Arrow's sort
    of the strings is single-threaded and ~30x the cost."""
    n = table.num_rows
    if n < 2:
        return True
    days = table.column("event_date").combine_chunks()
    players = table.column("player_id").combine_chunks()
    day, next_day = days.slice(0, n - 1), days.slice(1)
    ordered = pc.or_(pc.less(day, next_day), pc.and_(
        pc.equal(day, next_day),
        pc.less_equal(players.slice(0, n - 1), players.slice(1))))
    return bool(pc.all(ordered).as_py())


def _write_rollups(lake: Path, table: pa.Table, run: str) -> dict[str, dict[str, Any]]:
    """Rollup rows sorted by (event_date, player_id) into files of about ROLLUP_FILE_ROWS;
    the manifest maps each date to the file holding its rows (pruned by event_date stats).

    Files are written in place: nothing reads them before the manifest names them, and
    they are sealed (fsynced) before it is written.
    """
    written: dict[str, dict[str, Any]] = {}
    if table.num_rows == 0:
        return written
    table = table.select(ROLLUP_SCHEMA.names).cast(ROLLUP_SCHEMA)
    if not _date_player_ordered(table):
        table = table.sort_by([("event_date", "ascending"), ("player_id", "ascending")])
    days = table.column("event_date").combine_chunks()
    n = table.num_rows
    change = np.flatnonzero(np.asarray(pc.not_equal(days.slice(1), days.slice(0, n - 1))
                                       .to_numpy(zero_copy_only=False))) + 1
    starts = np.concatenate([[0], change]).tolist()
    ends = np.concatenate([change, [n]]).tolist()
    folder = lake / "rollups" / f"run={run}"
    folder.mkdir(parents=True, exist_ok=True)
    files: list[tuple[int, int]] = []  # row ranges, whole dates each
    for start, end in zip(starts, ends, strict=True):
        if files and files[-1][1] - files[-1][0] < ROLLUP_FILE_ROWS:
            files[-1] = (files[-1][0], end)
        else:
            files.append((start, end))
    day_starts = dict(zip(starts, ends, strict=True))
    for part, (first, last) in enumerate(files):
        target = folder / f"part-{part}.parquet"
        pq.write_table(table.slice(first, last - first), target, compression="zstd",
                       row_group_size=ROW_GROUP_SIZE)
        position = first
        while position < last:
            end = day_starts[position]
            piece = table.slice(position, end - position)
            written[days[position].as_py().isoformat()] = {
                "path": str(target.relative_to(lake)), "rows": piece.num_rows,
                "events": _events_in(piece),
                "points": int(pc.sum(piece.column("points_sum")).as_py() or 0)}
            position = end
    return written


def _rollup_index(lake: Path, rollups: dict[str, dict[str, Any]],
                  dates: list[str] | None = None) -> pa.Table:
    """(path, event_date) of the authoritative rollup rows, for the engines to read."""
    keys = sorted(rollups) if dates is None else [d for d in dates if d in rollups]
    return pa.table({
        "path": pa.array([str(lake / rollups[d]["path"]) for d in keys], pa.string()),
        "event_date": pa.array([date.fromisoformat(d) for d in keys], pa.date32()),
    })


def _rollup_table(rollups: dict[str, dict[str, Any]]) -> pa.Table:
    keys = sorted(rollups)
    return pa.table({
        "event_date": pa.array([date.fromisoformat(d) for d in keys], pa.date32()),
        "path": [rollups[d]["path"] for d in keys],
        "rows": pa.array([rollups[d]["rows"] for d in keys], pa.int64()),
        "events": pa.array([rollups[d]["events"] for d in keys], pa.int64()),
        "points": pa.array([rollups[d]["points"] for d in keys], pa.int64()),
    }, schema=ROLLUP_INDEX_SCHEMA)


def _board_summary(standings: pa.Table) -> dict[str, dict[str, int]]:
    grouped = standings.group_by("board").aggregate([("window_id", "count"), ("rows", "sum")])
    return {b: {"windows": int(w), "rows": int(r)} for b, w, r in zip(
        grouped.column("board").to_pylist(), grouped.column("window_id_count").to_pylist(),
        grouped.column("rows_sum").to_pylist(), strict=True)}


def _scope_points(lake: Path, rollups: dict[str, dict[str, Any]], banned: set[str],
                  end: date) -> dict[str, pa.Array]:
    """Counted points per scope key and player (no lateness filter: the all-time window's
    totals; only dates before the all-time window's `end`), exact as decimals."""
    if not rollups:
        return {}
    by_path: dict[str, list[date]] = {}
    for day, entry in rollups.items():
        if date.fromisoformat(day) < end:
            by_path.setdefault(str(lake / entry["path"]), []).append(date.fromisoformat(day))
    parts = []
    for path, days in by_path.items():
        parts.append(pq.read_table(path, columns=["player_id", "region", "mode", "points_sum"],
                                   filters=[("event_date", "in", days)]))
    if not parts:
        return {}
    table = pa.concat_tables(parts)
    table = table.set_column(3, "points_sum", pc.cast(table.column("points_sum"),
                                                      pa.decimal128(38, 0)))
    if banned:
        table = table.filter(pc.invert(pc.is_in(table.column("player_id"),
                                                value_set=pa.array(sorted(banned)))))
    totals: dict[str, pa.Array] = {}
    # Direct scores' rollup rows have region "" and their board in `mode` (jobs.spec).
    direct = pc.equal(table.column("region"), "")
    events, scores = table.filter(pc.invert(direct)), table.filter(direct)
    for column in (None, "region", "mode", "board"):
        source = scores if column == "board" else events
        keys = ["player_id"] if column is None else ["player_id", column.replace("board", "mode")]
        grouped = source.group_by(keys).aggregate([("points_sum", "sum")])
        if column is None:
            totals["global"] = grouped.column("points_sum_sum").combine_chunks()
            continue
        for value in pc.unique(grouped.column(keys[1])).to_pylist():
            rows = grouped.filter(pc.equal(grouped.column(keys[1]), value))
            totals[f"{column}:{value}"] = rows.column("points_sum_sum").combine_chunks()
    return totals


def _carried_scope_points(base: Manifest | None, delta: pa.Table, banned: set[str],
                          end: date) -> dict[str, int] | None:
    """The counted points per scope key (all-time, banned players excluded) as the base's
    check recorded them plus the night's new rollup rows: what `_scope_points` sums over
    every rollup file, without reading history. None when the bans changed since the base
    (a newly banned player's points would have to leave the totals) or there is no base."""
    if base is None or set(base.inputs.get("banned", [])) != banned:
        return None
    recorded = base.checks.get("scope_points")
    if not isinstance(recorded, dict):
        return None
    return _add_scope_points({str(k): int(v) for k, v in recorded.items()}, delta, banned, end)


def _add_scope_points(totals: dict[str, int], rollups: pa.Table, banned: set[str],
                      end: date) -> dict[str, int]:
    """`totals` plus the counted points per scope key of these rollup rows (dates before
    `end`, banned players excluded): sums by region and mode, no per-player grouping. A full
    recompute passes every rollup row it holds (its delta), so its check reads nothing back."""
    totals = dict(totals)
    # Only the columns summed by (filtering copies every column it keeps), and no filter
    # when every date is before `end` (the all-time window's end is far ahead).
    rows = rollups.select(["event_date", "player_id", "region", "mode", "points_sum"])
    if rows.num_rows and pc.max(rows.column("event_date")).as_py() >= end:
        rows = rows.filter(pc.less(rows.column("event_date"), pa.scalar(end, pa.date32())))
    if banned:
        rows = rows.filter(pc.invert(pc.is_in(rows.column("player_id"),
                                              value_set=pa.array(sorted(banned)))))
    if rows.num_rows == 0:
        return totals
    # One grouping by (region, mode), a few groups, instead of a decimal grouping per scope
    # column over every row (3 s of a 300k-player recompute). Exact: each points_sum is
    # within +-2^62, so its high part (>> 31) is within +-2^31 and its low 31 bits below
    # 2^31, and each part's int64 sum over fewer than 2^32 rows cannot overflow.
    points = rows.column("points_sum")
    high = pc.shift_right(points, 31)
    parts = pa.table({"region": rows.column("region"), "mode": rows.column("mode"),
                      "high": high, "low": pc.subtract(points, pc.shift_left(high, 31))})
    grouped = parts.group_by(["region", "mode"]).aggregate([("high", "sum"), ("low", "sum")])
    events: dict[str, int] = {"global": 0}
    for region, mode, high_sum, low_sum in zip(
            grouped.column("region").to_pylist(), grouped.column("mode").to_pylist(),
            grouped.column("high_sum").to_pylist(), grouped.column("low_sum").to_pylist(),
            strict=True):
        if region is None:
            continue
        total = int(high_sum) * 2**31 + int(low_sum)
        # Direct scores' rollup rows (region "", their board in `mode`) count on their
        # board only.
        keys = ([f"board:{mode}"] if region == ""
                else ["global", f"region:{region}", f"mode:{mode}"])
        for key in keys:
            events[key] = events.get(key, 0) + total
    for key, total in events.items():
        totals[key] = totals.get(key, 0) + total
    return totals


def _saturated_total(players: pa.Array | None, limit: int) -> int:
    """Sum over players of each one's total saturated at +-limit (what a sum board's
    all-time scores add up to; leaderboard.sortkey.saturate)."""
    if players is None or len(players) == 0:
        return 0
    bound = pa.scalar(limit, pa.decimal128(38, 0))
    low = pa.scalar(-limit, pa.decimal128(38, 0))
    clamped = pc.max_element_wise(pc.min_element_wise(players, bound), low)
    total = int(pc.sum(clamped).as_py() or 0)
    # The standings index keeps score totals as int64 sums, which wrap past 2^63.
    return (total + 2**63) % 2**64 - 2**63


def run_batch(
    settings: Settings,
    as_of: date,
    *,
    engine: str | None = None,
    full: bool = False,
    step: Step | None = None,
    publish: bool = True,
    allow_rewind: bool = False,
    spark_master: str | None = None,
    now: datetime | None = None,
    allow_open_day: bool = False,
) -> BatchResult:
    """Compute, check and publish version as_of. Safe to rerun: same inputs, same standings.

    The run goes through its milestones in order, each a function of its own: plan (which
    files, which base version, full or incremental), roll up, rank and write, check and
    write the manifest, publish. Fault checkpoints (`leaderboard.faults`): batch.rollups,
    batch.standings, batch.checks, batch.manifest.
    `publish=False` writes and seals the version but leaves `current.json` alone (the DAG
    validates it, then publishes it in a task of its own). Publishing a night older than the
    live version's is refused (RewindRefused, before any work) unless `allow_rewind`.
    `spark_master`: the master for the Spark engine (default: SPARK_MASTER, else local).
    `now`: the clock the night is checked against (the entry points pass Settings.now();
    None: no check). A night that has not ended is refused (OpenNightRefused, before any
    work) unless `allow_open_day`, and then only today's: the version's watermark is `now`,
    the instant it reads the lake, not the night's end (`OpenNightRefused.cut`).
    """
    say = step or (lambda _message: None)
    lake = settings.lake_dir
    if stopped_erasures(lake, unrepaired=True):
        # An erasure stopped part-way left versions disagreeing with the files it rewrote:
        # they are brought in line (once) before the plan reads its base; the rest waits
        # for that erasure's own run. An erasure running now holds the barrier: this waits.
        with erasure_barrier(lake, exclusive=True):
            if stopped_erasures(lake, unrepaired=True):
                say(f"{repair_stopped(lake)} version(s) brought in line with the files "
                    "stopped erasures rewrote")
    if publish and not allow_rewind:
        RewindRefused.check(lake, as_of)
    cut = None if now is None else OpenNightRefused.cut(as_of, now, allow_open_day)
    registry = settings.registry
    plan = _plan(lake, registry, as_of, full=full, say=say, cut=cut)
    if publish and plan.mode == "full":
        FullAfterRetention.check(lake, as_of)
    # Running from before the first file to after the manifest: a sweep never takes this
    # run's files. The sweep of what killed runs left comes first (jobs.sweep).
    # Shared with other runs, exclusive of an erasure (which rewrites the files read here).
    with hold_run(lake, plan.run), erasure_barrier(lake, exclusive=False):
        _sweep(lake, say)
        if stopped := stopped_erasures(lake):  # none runs while this holds the barrier
            say(f"{stopped} erasure(s) stopped part-way: run each again (`leaderboard erase "
                "PLAYER --yes` or DELETE /v1/admin/players/PLAYER) to finish it")
        eng = open_engine(engine or settings.engine, spark_master=spark_master)
        try:
            say(f"{plan.mode} run as of {as_of} on {eng.name}: reading {len(plan.files)} landed "
                "file(s)")
            rolled = _roll_up(eng, lake, plan, say)
            ranked = _rank(eng, lake, registry, plan, rolled, say)
            say("checking the version")
            checkpoint("batch.checks")
            manifest = _checked_manifest(lake, registry, plan, rolled, ranked, eng.name)
            seal([lake / p for p in {e["path"] for e in rolled.rollups.values()}]
                 + ranked.writer.paths)
            write_version(lake, manifest, rollups=_rollup_table(rolled.rollups),
                          standings=ranked.standings)
            checkpoint("batch.manifest")
            if publish:
                if not allow_rewind:
                    RewindRefused.check(lake, as_of)  # a later night published meanwhile
                swap_current(lake, manifest.version)
                say(f"published version {manifest.version}")
        finally:
            eng.close()
    seconds = (datetime.now(UTC) - plan.started).total_seconds()
    return BatchResult(manifest, plan.mode, rolled.counted, len(ranked.needed), ranked.rows,
                       seconds)


def _sweep(lake: Path, say: Step) -> None:
    """Delete the files of killed runs (never one a manifest names, or a running run's),
    found by the lock files they left (`leaderboard lake sweep` walks the whole lake)."""
    try:
        swept = sweep_dead_runs(lake)
    except SweepRefused as exc:
        say(f"no sweep of killed runs' files: {exc}")
        return
    if swept.files:
        say(f"swept {swept.files} file(s) ({swept.bytes:,} bytes) of killed run(s) "
            f"{', '.join(swept.runs)}")


@dataclass(frozen=True)
class _Plan:
    """What a run reads and builds on, decided before the engine starts."""

    as_of: date
    run: str  # the version id
    started: datetime
    watermark: datetime
    files: list[LandedFile]  # every landed file with ingest_date <= as_of
    base: Manifest | None  # the version an incremental run builds on; None: full
    mode: str  # "full" | "incremental"
    calendar: pa.Table
    bits: list[LatenessBit]
    banned: set[str]
    voids: pa.Table  # (match_id, player_id or null): the voids before the watermark
    #: the landed files (lake-relative) the base absorbed, compacted files included, that
    #: are still in the lake: what an incremental run dedupes its new events against
    absorbed: list[str]
    #: a void night after retention: the event dates recomputed from raw events (jobs.revoid)
    revoid: Revoid | None = None
    #: boards a rebind added or changed: every window built from the rollups, none carried
    rebuilt: frozenset[str] = frozenset()


@dataclass(frozen=True)
class _Rolled:
    """The version's rollups after this run: event date -> file entry."""

    rollups: dict[str, dict[str, Any]]
    changed: list[date]  # event dates that received new rows (or were recomputed)
    counted: int  # events newly absorbed
    delta: pa.Table  # this run's new rollup rows (before merging with the base's)
    #: event dates recomputed from raw events without the new voids, and the events the
    #: base counted on them that the voids took out
    redone: list[date] = field(default_factory=list)
    removed: int = 0


@dataclass(frozen=True)
class _Ranked:
    """The standings written by this run and the version's whole standings index."""

    writer: StandingsWriter
    rows: int  # standings rows written
    needed: set[tuple[str, str]]  # board-windows rebuilt
    standings: pa.Table  # STANDINGS_INDEX_SCHEMA: kept windows and fresh ones


def _plan(lake: Path, registry: Registry, as_of: date, *, full: bool, say: Step,
          cut: datetime | None = None) -> _Plan:
    """Full or incremental, on which files, with which calendar and bans. `cut`: the
    watermark of a version of today (the instant it reads the lake; None: the night's end)."""
    started = datetime.now(UTC)
    watermark = watermark_for(as_of) if cut is None else min(cut, watermark_for(as_of))
    run = f"{as_of.isoformat()}.{started.strftime('%Y%m%dT%H%M%S')}.{uuid.uuid4().hex[:6]}"
    if cut is not None:
        # An open day: every landing stamped before the cut is in place before the listing,
        # every later one stamped at or after it (its rows then stay speed events).
        try:
            settle_landings(lake, cut, say=say)
        except LandingStuck as exc:
            raise OpenNightRefused(str(exc)) from None
    files = [f for f in landed_files(lake) if f.ingest_date <= as_of]
    previous = None if full else _previous(lake, as_of, registry)
    mode = "full"
    absorbed: set[str] = set()
    if previous is not None:
        # A compacted file counts as absorbed when every file it replaced was.
        absorbed = absorbed_with_compactions(lake, previous.inputs.get("files", {}))
        late_landed = unread_before(lake, previous, files, absorbed=absorbed)
        mode = "incremental" if not late_landed else "full"
        if late_landed:
            say(f"{len(late_landed)} file(s) hold events from before the previous version's "
                "watermark that it did not read (landed with a clock in the past, or still "
                "landing when an open day's batch read the lake): recomputing in full")
    voids = voids_before(lake, watermark)
    revoid = None
    if mode == "incremental" and previous is not None and (
            previous.inputs.get("voids", "") != voids_digest(voids)):
        # A void may hit events the previous version absorbed: their rollups must lose
        # them, which only a recompute from the raw events does (voids are rare).
        if _retention_ran(lake):
            # A full recompute would miss the deleted events: only the event dates the new
            # voids touch are recomputed, those whose raw events are all still kept.
            revoid = plan_revoid(lake, registry, previous, files, watermark)
            if revoid.beyond:
                say("voids changed, but retention deleted raw events of "
                    f"{', '.join(d.isoformat() for d in revoid.beyond)}: the base's rows of "
                    "those dates stand (README: Voids)")
            for void in revoid.unseen:
                say(f"void of {void.describe()} names no raw event still in the lake: "
                    "retention deleted its events (their results stay in the standings, "
                    "README: Voids) or its match has not landed (it will not count when it "
                    "does)")
            if revoid.dates:
                say("voids changed: recomputing the rollups of "
                    f"{', '.join(d.isoformat() for d in revoid.dates)} from raw events")
        else:
            mode = "full"
            say("voids changed since the previous version: recomputing in full")
    base = previous if mode == "incremental" else None
    rebuilt: frozenset[str] = frozenset()
    if base is not None and base.registry_fingerprint != registry.fingerprint:
        recorded = base.inputs.get("board_digests", {})
        rebuilt = frozenset(b for b, d in board_digests(registry).items() if recorded.get(b) != d)
        say(f"registry rebound since {base.version}: "
            + (f"building {', '.join(sorted(rebuilt))} from the rollups; " if rebuilt else "")
            + "the other boards keep their standings")
    listed = {str(f.path.relative_to(lake)) for f in files}
    first_day = min([f.ingest_date for f in files] + [as_of]) - timedelta(days=1)
    # An event may lie ahead of its landing by up to future_skew (days, with a wide skew):
    # the calendar reaches its date, so it counts in the window its event_time falls in.
    # Raw events of old dates may be gone (retention); the base's rollups are not.
    last_day = as_of + timedelta(days=1)
    if (span := event_date_range(lake, files, base)) is not None:
        first_day, last_day = _within(registry.calendar, span, first_day, last_day)
    return _Plan(
        as_of=as_of, run=run, started=started, watermark=watermark, files=files, base=base,
        mode=mode, calendar=calendar_table(registry, first_day, last_day),
        bits=lateness_bits(registry), banned=banned_players(lake, before=watermark),
        voids=voids, absorbed=sorted(absorbed & listed) if base is not None else [],
        revoid=revoid if base is not None else None, rebuilt=rebuilt)


class FullAfterRetention(PublishError):
    """A full recompute to publish after retention deleted raw events: it would miss them.

    Refused before any work, so the live version stays (the DAG's path, which writes
    without publishing, is refused by `jobs.release.validate_version` instead)."""

    @classmethod
    def check(cls, lake: Path, as_of: date) -> None:
        deleted = deleted_through(lake)
        if deleted is not None:
            raise cls(
                f"a full recompute as of {as_of} would miss the raw events through {deleted} "
                "that retention deleted (their results live on only in the rollups), so it "
                "is refused and the live version stays; run the night without --full (an "
                "incremental run on the live version)")


class OpenNightRefused(PublishError):
    """A batch of a night that has not ended: its version would absorb part of the day.

    Refused before any work unless the operator allows today's open day; its watermark is
    then the instant the run reads the lake, so what lands later stays on the live boards
    (the speed layer folds everything at or after a version's watermark)."""

    @classmethod
    def cut(cls, as_of: date, now: datetime, allow_open_day: bool) -> datetime | None:
        """The watermark of a version of `as_of` read at `now`: None for an ended night
        (the night's end, watermark_for), `now` for today's with `allow_open_day`."""
        end = watermark_for(as_of)
        if end <= now:
            return None
        last = (now - timedelta(days=1)).date()
        if as_of > now.date():
            raise cls(f"the night of {as_of} has not begun (it is {format_instant(now)}); the "
                      f"last night that may run is {last}: run `leaderboard batch --as-of "
                      f"{last}` (the default)")
        if not allow_open_day:
            raise cls(f"the night of {as_of} has not ended (it ends at {format_instant(end)};"
                      f" it is {format_instant(now)}): a version of it would absorb only part "
                      f"of the day. The last night that may run is {last} (`leaderboard batch"
                      f" --as-of {last}`, the default); to publish today's events so far "
                      "anyway, add --allow-open-day (what lands later stays live)")
        return now

    @classmethod
    def check_clock(cls, now: datetime, allow_open_day: bool,
                    wall: datetime | None = None) -> None:
        """Refuse an open day's batch run with a clock (--now / LEADERBOARD_NOW) ahead of the
        wall clock by more than OPEN_DAY_CLOCK_SKEW: its cut is the floor of every later
        landing's stamp (`settle_landings`), so all would be stamped at that future instant.
        A clock in the past (a replay) records a cut already past, which restamps nothing."""
        wall = datetime.now(UTC) if wall is None else wall
        if allow_open_day and now > wall + OPEN_DAY_CLOCK_SKEW:
            raise cls(f"--allow-open-day with a clock ahead of the wall clock (the batch's clock "
                      f"is {format_instant(now)}, the wall clock {format_instant(wall)}): its "
                      "cut would stamp every later landing at that future instant. Run it "
                      "without --now / LEADERBOARD_NOW, or with a clock not ahead of the wall "
                      "clock")


#: How far an open day's batch's clock may be ahead of the wall clock (`check_clock`).
OPEN_DAY_CLOCK_SKEW = timedelta(minutes=5)


def _retention_ran(lake: Path) -> bool:
    """Whether retention deleted raw events (its ledger, `jobs.retention.LEDGER`)."""
    return deleted_through(lake) is not None


def _roll_up(eng: Engine, lake: Path, plan: _Plan, say: Step) -> _Rolled:
    """Dedupe and roll up the new events; merge them into the base's rollups; write."""
    base = plan.base
    if base is None:
        delta, counted = eng.rollup_events(
            [str(f.path) for f in plan.files], watermark=plan.watermark, since=None,
            absorbed=[], calendar=plan.calendar, bits=plan.bits, voids=plan.voids)
        say(f"deduped and rolled up {counted:,} events into {delta.num_rows:,} rollup rows")
        checkpoint("batch.rollups")
        return _Rolled(_write_rollups(lake, delta, plan.run), _rollup_dates(delta), counted,
                       delta)
    # A file's rows are all stamped on its partition's day (a backfill too), so partitions
    # before the old watermark's day hold nothing at or after it (an open day's base: its
    # day's files are read again, their rows past its watermark counted).
    new_files = [str(f.path) for f in plan.files if f.ingest_date >= base.watermark_at.date()]
    absorbed_files = [str(lake / p) for p in plan.absorbed]
    delta, counted = eng.rollup_events(
        new_files, watermark=plan.watermark, since=base.watermark_at, absorbed=absorbed_files,
        calendar=plan.calendar, bits=plan.bits, voids=plan.voids)
    changed = _rollup_dates(delta)
    say(f"{counted:,} new events since {base.as_of} touch {len(changed)} event date(s)")
    rollups = base.rollups(lake)
    redone, fresh, removed = _redo(eng, lake, plan, rollups, say)
    merged = eng.merge_rollups(
        _rollup_index(lake, rollups, [d.isoformat() for d in changed if d not in redone]),
        pa.concat_tables([delta, fresh.cast(delta.schema)]) if redone else delta)
    checkpoint("batch.rollups")
    for day in redone:  # a date the voids emptied has no rows left
        rollups.pop(day.isoformat(), None)
    rollups.update(_write_rollups(lake, merged, plan.run))
    return _Rolled(rollups, sorted(set(changed) | set(redone)), counted, delta, redone,
                   removed)


def _redo(eng: Engine, lake: Path, plan: _Plan, rollups: dict[str, dict[str, Any]],
          say: Step) -> tuple[list[date], pa.Table, int]:
    """A void night after retention: the rollup rows of the event dates the new voids touch,
    recomputed from the raw events the base absorbed (the same dedupe and counting as a full
    recompute, every void applied), and the events they lost. A date is recomputed only if
    the same recompute with the base's voids gives back the base's events and points for it
    (else some raw event of it is gone, e.g. a first copy in a deleted partition: the base's
    rows stand, the documented limit): `leaderboard.retained.redoable`, which the speed
    layer asks too."""
    revoid, base = plan.revoid, plan.base
    if revoid is None or base is None or not revoid.dates:
        return [], ROLLUP_SCHEMA.empty_table(), 0
    files = [str(lake / p) for p in plan.absorbed]
    days = pa.array(revoid.dates, pa.date32())

    def roll(voids: pa.Table) -> pa.Table:
        table, _ = eng.rollup_events(files, watermark=base.watermark_at, since=None,
                                     absorbed=[], calendar=plan.calendar, bits=plan.bits,
                                     voids=voids)
        return table.filter(pc.is_in(table.column("event_date"), value_set=days))

    before, after = roll(revoid.old_voids), roll(plan.voids)
    raw = {}
    for day in revoid.dates:
        rows = before.filter(pc.equal(before.column("event_date"), pa.scalar(day, pa.date32())))
        points = int(pc.sum(rows.column("points_sum")).as_py() or 0) if rows.num_rows else 0
        raw[day] = (_events_in(rows), points)
    redone = redoable(revoid.dates, raw, rollups)
    for day in revoid.dates:
        if day not in redone:
            say(f"raw events of {day} are missing from the lake: the base's rows stand")
    fresh = after.filter(pc.is_in(after.column("event_date"),
                                  value_set=pa.array(redone, pa.date32())))
    removed = sum(int(rollups.get(d.isoformat(), {"events": 0})["events"]) for d in redone
                  ) - _events_in(fresh)
    return redone, fresh, removed


def _rank(eng: Engine, lake: Path, registry: Registry, plan: _Plan, rolled: _Rolled,
          say: Step) -> _Ranked:
    """Rank every board-window that changed, write its standings and histograms, and build
    the version's standings index (the base's unchanged windows kept)."""
    base, as_of = plan.base, plan.as_of
    all_dates = sorted(date.fromisoformat(d) for d in rolled.rollups)
    previous_banned = set(base.inputs.get("banned", [])) if base is not None else None
    # rolled.changed holds the dates a void night recomputed (jobs.revoid), so every
    # board-window they feed is ranked again, and none of them is carried (its past changed)
    if base is None or previous_banned is None:
        needed = plan_windows(registry, all_dates, as_of)
    elif previous_banned != plan.banned:
        # Only the windows of the dates where a newly banned or unbanned player has rows
        # change (besides the night's own dates); the others keep their files.
        touched = _dates_with(lake, rolled.rollups, previous_banned ^ plan.banned)
        needed = plan_windows(registry, sorted(set(rolled.changed) | touched), as_of)
    else:
        needed = plan_windows(registry, rolled.changed, as_of)
    if plan.rebuilt:
        needed |= plan_windows(registry, all_dates, as_of, boards=set(plan.rebuilt))
    needed_table = pa.table({"board": [b for b, _ in sorted(needed)],
                             "window_id": [w for _, w in sorted(needed)]})
    carry = _carry_plan(lake, registry, plan, needed,
                        changed_past=_windows_of(plan.calendar, rolled.redone))
    carried = set(zip(carry.column("board").to_pylist(), carry.column("window_id").to_pylist(),
                      strict=True))
    read = _dates_of(plan.calendar, {w for _, w in needed - carried})
    say(f"ranking {len(needed)} board-window(s), {len(carried)} carried forward; reading the "
        f"rollups of {len(read)} event date(s)")
    result = eng.standings(
        _rollup_index(lake, rolled.rollups, read), spec=board_window_spec(registry),
        calendar=plan.calendar, needed=needed_table, banned=sorted(plan.banned),
        delta=rolled.delta if carried else None, carry=carry)
    if result.overflow is not None:
        row = result.overflow.slice(0, 1).to_pylist()[0]
        raise SortKeyOverflow(
            f"score {row['score']} of {row['player_id']} on {row['board']} "
            f"{row['window_id']} does not fit an exact sort key; lower the board's points "
            "bounds or use ties=shared")
    writer = StandingsWriter(
        lake=lake, as_of=as_of.isoformat(), run=plan.run,
        earliest_boards={b.name for b in registry.boards if b.ties == "earliest"},
        banned=plan.banned)
    try:
        rows = writer.write_stream(result.rows)
    finally:
        result.stop()  # a failed write must not leave the read-ahead running the engine
    eng.finish()
    checkpoint("batch.standings")
    built = {(e.board, e.window_id) for e in writer.entries}
    # A board-window exists iff it is open on as_of or counted events fell in it (a window
    # whose players are all banned stays, empty).
    received = {(b, w) for b, w in zip(result.windows.column("board").to_pylist(),
                                       result.windows.column("window_id").to_pylist(),
                                       strict=True)}
    if base is not None and carried:
        # A carried window whose only players are banned has no state rows; it received
        # events all the same (the base says so), as a recompute from rollups would find.
        index = base.standings(lake)
        received |= carried & {(b, w) for b, w, r in zip(
            index.column("board").to_pylist(), index.column("window_id").to_pylist(),
            index.column("received").to_pylist(), strict=True) if r}
    open_now = plan_windows(registry, [], as_of)
    writer.write_empty(sorted((needed & (received | open_now)) - built))
    writer.write_histograms(result.histograms)
    writer.close()
    entries = writer.entries
    histogram = [writer.histogram_entries[(e.board, e.window_id)] for e in entries]
    fresh = pa.table({
        "board": [e.board for e in entries],
        "window_id": [e.window_id for e in entries],
        "path": [e.path for e in entries],
        "rows": pa.array([e.rows for e in entries], pa.int64()),
        "score_total": pa.array([e.score_total for e in entries], pa.int64()),
        "histogram": [path for path, _ in histogram],
        "histogram_rows": pa.array([count for _, count in histogram], pa.int64()),
        "received": pa.array([(e.board, e.window_id) in received for e in entries]),
    }, schema=STANDINGS_INDEX_SCHEMA)
    if base is not None:
        kept = base.standings(lake)
        keys = pc.binary_join_element_wise(kept.column("board"), kept.column("window_id"),
                                           "\x00")
        rebuilt = pa.array(sorted(f"{b}\x00{w}" for b, w in needed), pa.string())
        open_keys = pa.array(sorted(f"{b}\x00{w}" for b, w in open_now), pa.string())
        # a rebind: the boards it dropped go, those it rebuilt are all in `needed`
        boards = pa.array(sorted({b.name for b in registry.boards} - plan.rebuilt), pa.string())
        kept = kept.filter(pc.and_(pc.and_(
            pc.invert(pc.is_in(keys, value_set=rebuilt)),
            pc.is_in(kept.column("board"), value_set=boards)),
            # an empty window kept only while it is open, as a full recompute would
            pc.or_(kept.column("received"), pc.is_in(keys, value_set=open_keys))))
        standings = pa.concat_tables([kept.cast(STANDINGS_INDEX_SCHEMA), fresh])
    else:
        standings = fresh
    standings = standings.sort_by([("board", "ascending"), ("window_id", "ascending")])
    return _Ranked(writer, rows, needed, standings)


def _dates_with(lake: Path, rollups: dict[str, dict[str, Any]], players: set[str]
                ) -> set[date]:
    """The event dates on which any of `players` has rollup rows (two columns read, the
    players' rows only)."""
    if not players:
        return set()
    wanted = pa.array(sorted(players), pa.string())
    found: set[date] = set()
    for path, days in sorted(rollup_files(rollups).items()):
        # A file may also hold rows of dates a later run rewrote: only its own dates count.
        table = pq.read_table(lake / path, columns=["event_date", "player_id"],
                              filters=pc.field("player_id").isin(wanted)
                              & pc.field("event_date").isin(pa.array(days, pa.date32())))
        found.update(pc.unique(table.column("event_date")).to_pylist())
    return found


def _dates_of(calendar: pa.Table, window_ids: set[str]) -> list[str]:
    """The event dates (ISO) that fall in any of `window_ids`."""
    if not window_ids:
        return []
    rows = calendar.filter(pc.is_in(calendar.column("window_id"),
                                    value_set=pa.array(sorted(window_ids), pa.string())))
    return sorted(d.isoformat() for d in pc.unique(rows.column("event_date")).to_pylist())


def _windows_of(calendar: pa.Table, dates: list[date]) -> set[str]:
    """The window ids (any board) that hold any of `dates`."""
    if not dates:
        return set()
    rows = calendar.filter(pc.is_in(calendar.column("event_date"),
                                    value_set=pa.array(dates, pa.date32())))
    return set(pc.unique(rows.column("window_id")).to_pylist())


def _carry_plan(lake: Path, registry: Registry, plan: _Plan,
                needed: set[tuple[str, str]],
                changed_past: set[str] | None = None) -> pa.Table:
    """The needed board-windows of CARRY_KINDS that can be built from the base version's
    standings rows plus the night's new rollup rows (CARRY_SCHEMA), so that a night reads
    no history. A window is carried when the base's rows hold every counted player's whole
    state: never on a full run; never after an unban (a player banned in the base has no
    standings rows there: the windows are recomputed from rollups); never from a file
    without `last_match_id` (written before it existed) or, on a sum board, one where some
    total may sit at the saturation limit (Parquet statistics, no data read). A window the
    base lacks had no counted rows yet: carried from nothing (path null). Never a window of
    `changed_past` (window ids): its past changed (a void night recomputed some of its
    dates).
    """
    base = plan.base
    if base is None or not set(base.inputs.get("banned", [])) <= plan.banned:
        return CARRY_SCHEMA.empty_table()
    index = base.standings(lake)
    paths = dict(zip(zip(index.column("board").to_pylist(),
                         index.column("window_id").to_pylist(), strict=True),
                     index.column("path").to_pylist(), strict=True))
    boards = {b.name: b for b in registry.boards}
    usable: dict[tuple[str, int | None], bool] = {}
    rows: list[tuple[str, str, str | None]] = []
    for board, window_id in sorted(needed):
        kind = window_id.split(":", 1)[0]
        if (kind not in CARRY_KINDS or window_id in (changed_past or set())
                or board in plan.rebuilt):
            continue
        path = paths.get((board, window_id))
        if path is None:
            rows.append((board, window_id, None))
            continue
        limit = (registry.layout(boards[board], kind).limit
                 if boards[board].aggregation == "sum" else None)
        if (path, limit) not in usable:
            usable[(path, limit)] = _state_file_usable(lake / path, limit)
        if usable[(path, limit)]:
            rows.append((board, window_id, str(lake / path)))
    return pa.table({"board": [r[0] for r in rows], "window_id": [r[1] for r in rows],
                     "path": pa.array([r[2] for r in rows], pa.string())}, schema=CARRY_SCHEMA)


def _state_file_usable(path: Path, limit: int | None) -> bool:
    """Whether a standings file's rows are whole aggregate states: it has `last_match_id`
    and, when `limit` is given (a sum board), every score lies strictly inside +-limit."""
    metadata = pq.ParquetFile(path).metadata
    schema = metadata.schema.to_arrow_schema()
    if "last_match_id" not in schema.names:
        return False
    if limit is None:
        return True
    column = schema.get_field_index("score")
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(column).statistics
        if metadata.row_group(group).num_rows == 0:
            continue
        if stats is None or not stats.has_min_max:
            return False
        if not -limit < stats.min <= stats.max < limit:
            return False
    return True


def _checked_manifest(lake: Path, registry: Registry, plan: _Plan, rolled: _Rolled,
                      ranked: _Ranked, engine: str) -> Manifest:
    """The version's manifest, once its events and all-time points add up (else
    PublishError: nothing is written)."""
    base, rollups, counted = plan.base, rolled.rollups, rolled.counted
    standings = ranked.standings
    totals = {(b, w): t for b, w, t in zip(standings.column("board").to_pylist(),
                                           standings.column("window_id").to_pylist(),
                                           standings.column("score_total").to_pylist(),
                                           strict=True)}
    events_total = sum(e["events"] for e in rollups.values())
    expected_total = counted + (int(base.inputs.get("events", 0)) if base else 0
                                ) - rolled.removed
    if events_total != expected_total:
        raise PublishError(f"rollups count {events_total} events, expected {expected_total} "
                           "(deduped input); not publishing")
    end = registry.calendar.all_time_end
    carried_points = (None if rolled.redone
                      else _carried_scope_points(base, rolled.delta, plan.banned, end))
    if base is None:
        # A full recompute holds every rollup row (its delta): the scope sums come from them,
        # and the per-player totals below are read only where some all-time total saturates.
        carried_points = _add_scope_points({}, rolled.delta, plan.banned, end)
    full_points: dict[str, pa.Array] | None = None
    paths = dict(zip(zip(standings.column("board").to_pylist(),
                         standings.column("window_id").to_pylist(), strict=True),
                     standings.column("path").to_pylist(), strict=True))
    for board in registry.boards:
        if board.aggregation != "sum" or ALL_TIME not in board.windows:
            continue
        if (board.name, ALL_TIME) not in totals:
            continue
        key = board.scope_key
        got = totals[(board.name, ALL_TIME)]
        limit = registry.layout(board, ALL_TIME).limit
        if carried_points is not None and _state_file_usable(
                lake / paths[(board.name, ALL_TIME)], limit):
            # No total saturated: the scores add up to the counted points themselves.
            expected = (carried_points.get(key, 0) + 2**63) % 2**64 - 2**63
        else:
            if full_points is None:
                full_points = _scope_points(lake, rollups, plan.banned, end)
            expected = _saturated_total(full_points.get(key), limit)
        if got != expected:
            raise PublishError(f"{board.name} all-time scores add up to {got}, the counted "
                               f"points to {expected}; not publishing")
    # Every landed file up to as_of: the base's inputs plus the new files, less the files
    # retention or compaction deleted since (a compacted file stands for its originals), so
    # the manifest does not grow with the history.
    input_files = {str(f.path.relative_to(lake)): 1 for f in plan.files}
    return Manifest(
        version=plan.run, as_of=plan.as_of.isoformat(),
        watermark=format_instant(plan.watermark), created_at=format_instant(plan.started),
        engine=engine, registry_fingerprint=registry.fingerprint,
        previous=base.version if base else None,
        inputs={"files": dict(sorted(input_files.items())), "events": events_total,
                "new_events": counted, "banned": sorted(plan.banned), "mode": plan.mode,
                "voids": voids_digest(plan.voids), "rollup_layout": rollup_layout(registry),
                "board_digests": board_digests(registry)},
        boards=_board_summary(standings),
        checks={"events": events_total, "windows_built": len(ranked.needed),
                "standings_rows_written": ranked.rows, "scope_points": carried_points if
                carried_points is not None else {k: int(pc.sum(v).as_py() or 0) for k, v in (
                    full_points or _scope_points(lake, rollups, plan.banned, end)).items()}},
        duration_seconds=round((datetime.now(UTC) - plan.started).total_seconds(), 3),
    )


def _within(calendar: Calendar, span: tuple[date, date], first_day: date, last_day: date
            ) -> tuple[date, date]:
    """The run's calendar days widened to the lake's event dates `span`, never before the
    calendar's all_time_start (no event counts before it) nor after its all_time_end
    (ingest refuses events outside them; a file without statistics may hold anything)."""
    low = max(span[0], calendar.all_time_start)
    high = max(min(span[1], calendar.all_time_end), calendar.all_time_start)
    return min(first_day, low), max(last_day, high)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--as-of", required=True, help="YYYY-MM-DD")
    parser.add_argument("--engine", choices=["duckdb", "spark"])
    parser.add_argument("--full", action="store_true", help="recompute everything")
    parser.add_argument("--data", help="data dir (env LEADERBOARD_DATA)")
    parser.add_argument("--config", help="board registry (env LEADERBOARD_CONFIG)")
    parser.add_argument("--allow-rewind", action="store_true",
                        help="publish even if the live version is of a later night")
    parser.add_argument("--allow-open-day", action="store_true",
                        help="allow --as-of today, a night not ended: the version's watermark "
                             "is the instant the batch reads the lake")
    args = parser.parse_args(argv)
    settings = Settings.from_env(data_dir=args.data, config=args.config, engine=args.engine)
    bind_registry(settings.lake_dir, settings.registry)
    as_of = date.fromisoformat(args.as_of)
    try:
        OpenNightRefused.check_clock(settings.now(), args.allow_open_day)
        result = run_batch(settings, as_of, full=args.full,
                           step=lambda message: print(message, file=sys.stderr),
                           allow_rewind=args.allow_rewind, now=settings.now(),
                           allow_open_day=args.allow_open_day)
    except (RewindRefused, FullAfterRetention, OpenNightRefused) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except PublishError as exc:
        print(f"error: {not_published(settings.lake_dir, as_of, exc)}", file=sys.stderr)
        return 1
    print(result.manifest.version)
    return 0


if __name__ == "__main__":
    sys.exit(main())
