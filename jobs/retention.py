"""Retention: delete raw event partitions past the registry's `retention_days`, and find the
speed versions that are no longer live.

Usage: python -m jobs.retention --as-of 2026-12-01 [--data DIR] [--config NAME] [--dry-run]

Raw events are the batch's input, so a partition goes only when nothing can need it again:
it is older than `retention_days` before the run's as_of, every file in it was absorbed by
the live batch version (a compacted file through its record), and every row in it was
ingested before both the live batch watermark and the speed layer's (so neither a later
batch nor a speed rebuild reads it). Rollups, standings and manifests are never touched:
history stays queryable and seasons can be recomputed from rollups. The newest partition
deleted is noted in `lake/retention.json`, so a full recompute (which would silently miss
the deleted events) is refused at validation (`jobs.release`). Old speed versions are found
here and expired by the caller (`SpeedLayer.expire_version`, which only the DAG may import).

Deleting moves the safe line (`leaderboard.retained.kept_after`): both layers apply a void
of a result only from its date's raw events, on dates after that line. So a partition
stays while deleting it would move the line onto or past the date of a result that a void
the live versions have not absorbed names (docs/architecture.md, "Retention and voids not
yet in a batch"): the next batch absorbs the void, and the next night's retention deletes
the partition.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jobs.compact import SpeedWatermark, live_speed_watermark
from leaderboard.erasure import erasure_barrier
from leaderboard.lake import (
    absorbed_with_compactions,
    atomic_write_bytes,
    events_dir,
    fsync_dir,
    landed_files,
    open_landing_writes,
    read_listed,
    stamp_range,
)
from leaderboard.manifest import Manifest, read_current
from leaderboard.registry import Registry
from leaderboard.retained import RETENTION_LEDGER, deleted_through, line_after
from leaderboard.settings import Settings
from leaderboard.timeutil import format_instant
from leaderboard.voids import Void, VoidIndex, read_voids, voids_before, voids_digest

__all__ = [
    "LEDGER",
    "RetentionReport",
    "apply_retention",
    "deleted_through",
    "expired_partitions",
    "main",
    "partition_blocker",
    "retention_cutoff",
    "speed_version_tags",
    "stale_speed_tags",
]

#: The ledger of deleted partitions, under the lake dir (leaderboard.retained).
LEDGER = RETENTION_LEDGER

Say = Callable[[str], None]


@dataclass
class RetentionReport:
    as_of: date
    cutoff: date
    deleted: list[str] = field(default_factory=list)  # partition dates
    kept: dict[str, str] = field(default_factory=dict)  # expired partition -> why it stays
    files_deleted: int = 0
    skipped: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"as_of": self.as_of.isoformat(), "cutoff": self.cutoff.isoformat(),
                "deleted": self.deleted, "kept": self.kept, "files_deleted": self.files_deleted,
                "skipped": self.skipped}


# -- pure -----------------------------------------------------------------------------------

def retention_cutoff(as_of: date, retention_days: int) -> date:
    """Partitions before this date are older than `retention_days` at `as_of`."""
    return as_of - timedelta(days=retention_days)


def expired_partitions(days: Iterable[date], cutoff: date) -> list[date]:
    return sorted(d for d in set(days) if d < cutoff)


def partition_blocker(day: date, files: list[tuple[str, datetime]], *, absorbed: set[str],
                      published: Manifest, watermark: datetime) -> str | None:
    """Why an expired partition must stay (None: it may go). `files`: (relpath, newest
    ingested_at) of each landed file in it; `watermark`: the earlier of the live batch
    and speed watermarks."""
    if day > published.as_of_date:
        return f"newer than the live batch version ({published.as_of})"
    for relpath, newest in files:
        if relpath not in absorbed:
            return f"{relpath} was not absorbed by the live batch version {published.version}"
        if newest >= watermark:
            return (f"{relpath} holds rows ingested at or after {format_instant(watermark)} "
                    "(the batch or the speed layer still needs them)")
    return None


def stale_speed_tags(keys: Iterable[bytes | str], live_tag: str) -> set[str]:
    """Version tags named by `lb:<tag>:progress` / `lb:<tag>:windows` keys, except the live
    one's."""
    tags = set()
    for key in keys:
        text = key.decode() if isinstance(key, bytes) else key
        parts = text.split(":")
        if len(parts) == 3 and parts[0] == "lb" and parts[2] in ("progress", "windows"):
            tags.add(parts[1])
    return tags - {live_tag}


# -- I/O ------------------------------------------------------------------------------------

def _note_deleted(lake: Path, days: list[date]) -> None:
    path = lake / LEDGER
    try:
        ledger = json.loads(path.read_text())
    except FileNotFoundError:
        ledger = {"partitions": []}
    partitions = sorted(set(ledger["partitions"]) | {d.isoformat() for d in days})
    atomic_write_bytes(path, json.dumps({"deleted_through": partitions[-1],
                                         "partitions": partitions}, indent=1).encode())


def _delete_partition(partition: Path) -> int:
    """Every file of the partition, then the directory; returns the files deleted. A file
    that lands meanwhile keeps the directory (rmdir refuses), and is seen next time."""
    deleted = 0
    for path in sorted(partition.iterdir()):
        if path.is_file():
            path.unlink(missing_ok=True)
            deleted += 1
    fsync_dir(partition)
    try:
        partition.rmdir()
    except OSError:
        return deleted
    fsync_dir(partition.parent)
    return deleted


def _voids_waiting(lake: Path, published: Manifest) -> str | None:
    """Why the first deletion must wait for a void (None: it need not). Once raw events are
    gone the batch never recomputes in full again (it would miss them), so a void of an
    event the live version absorbed reaches the batch only through a full recompute before
    that: until the live version holds every void of the lake, deleting would bring the
    voided result back with the next version (and the speed layer, which recomputes a base
    part from raw rows, stops at the same line). After the first deletion waiting gains
    nothing (README: the limit), so only the first one waits."""
    if deleted_through(lake) is not None:
        return None
    voids = read_voids(lake)
    if not voids:
        return None
    applied = voids_digest(voids_before(lake, published.watermark_at))
    pending = [v for v in voids if v.at >= published.watermark_at]
    if not pending and published.inputs.get("voids", "") == applied:
        return None
    return (f"the live batch version {published.version} has not applied every void in the "
            "lake yet, and the first deletion of raw events would keep them from ever "
            "reaching the batch: deleting nothing; run the next batch first (the DAG's next "
            "night does), then retention again")


def _live_waiting(lake: Path, published: Manifest, speed: SpeedWatermark) -> str | None:
    """Why a deletion must wait for the live layer's rebase (None: it need not). The live
    layer applies a void its version had not seen (at or after that version's watermark)
    by recomputing the player's base part from the raw rows the version absorbed; with a
    newer version published but not served yet, those rows may be in partitions the
    published one no longer needs, and once they are gone the next recompute on the live
    version (a ban and unban, another void) would bring the voided result back. So while
    the live layer serves an older version than the published one and a void is late for
    it, nothing is deleted."""
    if (not speed.present or speed.version is None or speed.watermark is None
            or speed.version == published.version):
        return None
    if not any(v.at >= speed.watermark for v in read_voids(lake)):
        return None
    return (f"the live layer serves batch version {speed.version}, older than the published "
            f"{published.version}, and applies voids from the raw events that version "
            "absorbed: deleting nothing; rebase the speed layer onto the published version "
            "(the DAG's rebase step does), then run retention again")


@dataclass(frozen=True)
class _LateResult:
    """The earliest event date of a result that a void not absorbed by the live versions
    names (the void with it): the safe line must stay before that date."""

    day: date
    void: Void


def _late_result(lake: Path, published: Manifest, speed: SpeedWatermark) -> _LateResult | None:
    """The earliest result (by event date) that a void at or after the watermark of the
    published version or of the live layer's names, among the raw rows either of those
    versions absorbed (ingested before its watermark): rows ingested later are no base's,
    and both layers count them without the voided ones. None when there is none."""
    marks = [published.watermark_at]
    if speed.present and speed.watermark is not None:
        marks.append(speed.watermark)
    late = [v for v in read_voids(lake) if v.at >= min(marks)]
    if not late:
        return None
    index = VoidIndex.of(late)
    matches = pa.array(sorted(index.by_match), pa.string())
    found: _LateResult | None = None
    # A compaction may replace files meanwhile: read_listed lists and reads again then.
    for rows in read_listed(lambda: landed_files(lake), lambda files: [
            pq.read_table(f.path, columns=["match_id", "player_id", "event_time",
                                           "ingested_at"],
                          filters=pc.field("match_id").isin(matches)) for f in files]):
        if rows.num_rows:
            rows = rows.filter(pc.less(rows.column("ingested_at"), pa.scalar(
                max(marks), rows.schema.field("ingested_at").type)))
            rows = rows.filter(index.mask(rows))
        for match_id, player_id, at in zip(rows.column("match_id").to_pylist(),
                                           rows.column("player_id").to_pylist(),
                                           rows.column("event_time").to_pylist(), strict=True):
            if found is None or at.date() < found.day:
                void = next(v for v in late if v.match_id == match_id
                            and v.player_id in (None, player_id))
                found = _LateResult(at.date(), void)
    return found


def _line_blocker(day: date, late: _LateResult | None, through: date | None,
                  registry: Registry) -> str | None:
    """Why deleting the partition of `day` must wait for a void (None: it need not)."""
    if late is None or (through is not None and day <= through):
        return None  # the line does not move
    line = line_after(day, registry)
    if line < late.day:
        return None
    return (f"the void of {late.void.describe()} (recorded {format_instant(late.void.at)}) "
            f"is not in the live batch version yet, and deleting this partition would move "
            f"the safe line to {line}, on or past its result of {late.day}: neither the "
            "batch nor the live boards could remove that result any more; it goes once a "
            "batch has the void (the next night)")


def apply_retention(lake: Path, as_of: date, retention_days: int, *, speed: SpeedWatermark,
                    registry: Registry, dry_run: bool = False,
                    say: Say | None = None) -> RetentionReport:
    """Delete the expired raw-event partitions nothing needs any more; safe to rerun.
    `registry`: the data dir's, required (its `future_skew` draws the safe line; a default
    registry would draw the wrong one). Not while an erasure rewrites the lake's files
    (`erasure_barrier`: it waits). A dry run makes no barrier file (it writes nothing, and
    may run on a read-only backup)."""
    with erasure_barrier(lake, exclusive=False, create=not dry_run):
        return _apply_retention(lake, as_of, retention_days, speed=speed,
                                registry=registry, dry_run=dry_run,
                                say=say)


def _apply_retention(lake: Path, as_of: date, retention_days: int, *, speed: SpeedWatermark,
                     registry: Registry, dry_run: bool, say: Say | None) -> RetentionReport:
    say = say or (lambda _message: None)
    cutoff = retention_cutoff(as_of, retention_days)
    report = RetentionReport(as_of, cutoff)
    published = read_current(lake)
    if published is None:
        report.skipped = "no published batch version: every raw event is still needed"
        say(report.skipped)
        return report
    watermark = published.watermark_at
    if speed.present:
        if speed.watermark is None:
            report.skipped = "the speed layer has no batch version yet: it may need any file"
            say(report.skipped)
            return report
        watermark = min(watermark, speed.watermark)
    waiting = _voids_waiting(lake, published) or _live_waiting(lake, published, speed)
    if waiting:
        report.skipped = waiting
        say(report.skipped)
        return report
    partitions = [date.fromisoformat(p.name.removeprefix("ingest_date="))
                  for p in events_dir(lake).glob("ingest_date=*") if p.is_dir()]
    expired = expired_partitions(partitions, cutoff)
    # Only the expired partitions' files and records are read: a night's retention costs
    # what is past the horizon, not the history a long retention_days keeps (issue 13).
    absorbed = absorbed_with_compactions(lake, published.inputs.get("files", {}), days=expired)
    by_day: dict[date, list[tuple[str, datetime]]] = {}
    for landed in landed_files(lake, days=expired):
        by_day.setdefault(landed.ingest_date, []).append(
            (str(landed.path.relative_to(lake)), stamp_range(landed.path)[1]))
    late = _late_result(lake, published, speed) if expired else None
    through = deleted_through(lake)
    gone = []
    for day in expired:
        partition = events_dir(lake) / f"ingest_date={day.isoformat()}"
        reason = partition_blocker(day, by_day.get(day, []), absorbed=absorbed,
                                   published=published, watermark=watermark)
        if reason is None:
            reason = _line_blocker(day, late, through, registry)
        if reason is None and open_landing_writes(partition):
            reason = "a writer is writing into it"
        if reason is not None:
            report.kept[day.isoformat()] = reason
            say(f"keeping partition {day}: {reason}")
            continue
        if not dry_run:
            report.files_deleted += _delete_partition(partition)
        gone.append(day)
        report.deleted.append(day.isoformat())
    if gone and not dry_run:
        _note_deleted(lake, gone)
    say(f"retention ({retention_days} days before {as_of}): deleted {len(gone)} partition(s), "
        f"kept {len(report.kept)} expired one(s)")
    return report


def speed_version_tags(client: Any) -> set[str]:
    """Every speed version tag with state in Redis that is not already set to expire."""
    found = set()
    for pattern in ("lb:*:progress", "lb:*:windows"):
        for key in client.scan_iter(match=pattern, count=1000):
            if client.ttl(key) == -1:
                found.add(key)
    return stale_speed_tags(found, live_tag="")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--as-of", required=True, help="the run's date, YYYY-MM-DD")
    parser.add_argument("--data", help="data dir (env LEADERBOARD_DATA)")
    parser.add_argument("--config", help="board registry (env LEADERBOARD_CONFIG)")
    parser.add_argument("--dry-run", action="store_true", help="report, delete nothing")
    args = parser.parse_args(argv)
    settings = Settings.from_env(data_dir=args.data, config=args.config)
    report = apply_retention(settings.lake_dir, date.fromisoformat(args.as_of),
                             settings.registry.retention_days,
                             speed=live_speed_watermark(settings),
                             registry=settings.registry, dry_run=args.dry_run,
                             say=lambda message: print(message, file=sys.stderr))
    print(json.dumps(report.as_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
