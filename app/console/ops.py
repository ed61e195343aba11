"""What the console's operations page shows, gathered cheaply from the lake and Redis.

The published batch version (from its manifest), the speed layer's status, and the rows
quarantined over the last days counted by reason. Quarantine files are immutable once landed
(written to a temp name, then renamed), so each file's counts are memoised by (path, size,
mtime): a refresh reads only the `reason` column of files it has not seen yet.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import redis

from leaderboard.lake import quarantine_dir
from leaderboard.manifest import Manifest, ManifestError, read_current
from leaderboard.timeutil import format_instant
from leaderboard.visibility import invisible_files
from speed_layer.service import SpeedLayer

__all__ = [
    "QUARANTINE_DAYS",
    "BatchRun",
    "OpsStatus",
    "QuarantineCounts",
    "QuarantineTally",
    "ReasonCount",
    "batch_run",
    "ops_status",
]

#: Days of quarantine partitions the operations page counts (today included).
QUARANTINE_DAYS = 7


@dataclass(frozen=True)
class BatchRun:
    """The published batch version and the run that built it."""

    version: str
    as_of: str
    watermark: str
    created_at: str
    engine: str
    mode: str | None
    duration_seconds: float | None  # None: built before manifests recorded it
    new_events: int | None
    events: int | None
    windows_built: int | None
    standings_rows: int | None


@dataclass(frozen=True)
class ReasonCount:
    reason: str
    rows: int
    per_day: list[int]  # aligned with QuarantineCounts.days


@dataclass(frozen=True)
class QuarantineCounts:
    days: list[str]  # oldest first, ISO dates of ingest_date partitions
    rows: int
    files: int
    reasons: list[ReasonCount]  # most rows first


@dataclass(frozen=True)
class OpsStatus:
    now: str
    batch: BatchRun | None
    batch_problem: str | None
    speed: dict[str, Any] | None  # SpeedStatus.as_dict()
    speed_problem: str | None
    quarantine: QuarantineCounts
    #: landed files holding accepted events the live version did not read though they were
    #: ingested before its watermark: on no live board (leaderboard.visibility); None: no
    #: version
    invisible_files: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def batch_run(manifest: Manifest) -> BatchRun:
    """A manifest's figures for people (older manifests lack some: those are None)."""
    inputs, checks = manifest.inputs, manifest.checks
    mode = inputs.get("mode")
    return BatchRun(
        version=manifest.version, as_of=manifest.as_of, watermark=manifest.watermark,
        created_at=manifest.created_at, engine=manifest.engine,
        mode=mode if isinstance(mode, str) else None,
        duration_seconds=manifest.duration_seconds,
        new_events=_int(inputs.get("new_events")), events=_int(inputs.get("events")),
        windows_built=_int(checks.get("windows_built")),
        standings_rows=_int(checks.get("standings_rows_written")))


class QuarantineTally:
    """Rows per reason in each quarantine file, memoised per file version (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, int, int], Counter[str]] = {}

    def _counts(self, path: Path) -> Counter[str]:
        stat = path.stat()
        key = (str(path), stat.st_size, stat.st_mtime_ns)
        with self._lock:
            found = self._seen.get(key)
        if found is None:
            reasons = pq.read_table(path, columns=["reason"]).column("reason").to_pylist()
            found = Counter(str(r) for r in reasons)
            with self._lock:
                self._seen[key] = found
        return found

    def count(self, lake: Path, today: date, days: int = QUARANTINE_DAYS) -> QuarantineCounts:
        """Rows by reason in the ingest_date partitions of the `days` days up to `today`."""
        wanted = [today - timedelta(days=back) for back in range(days - 1, -1, -1)]
        totals: Counter[str] = Counter()
        per_day: dict[str, list[int]] = {}
        files = 0
        live: set[tuple[str, int, int]] = set()
        for index, day in enumerate(wanted):
            folder = quarantine_dir(lake) / f"ingest_date={day.isoformat()}"
            for path in sorted(folder.glob("*.parquet")) if folder.is_dir() else ():
                try:
                    counts = self._counts(path)
                    stat = path.stat()
                except FileNotFoundError:  # compacted or swept meanwhile
                    continue
                live.add((str(path), stat.st_size, stat.st_mtime_ns))
                files += 1
                for reason, rows in counts.items():
                    totals[reason] += rows
                    per_day.setdefault(reason, [0] * days)[index] += rows
        with self._lock:  # forget files that left the window
            self._seen = {k: v for k, v in self._seen.items() if k in live}
        reasons = [ReasonCount(reason, rows, per_day[reason])
                   for reason, rows in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))]
        return QuarantineCounts(days=[d.isoformat() for d in wanted], rows=sum(totals.values()),
                                files=files, reasons=reasons)


def ops_status(lake: Path, speed: SpeedLayer, now: datetime, tally: QuarantineTally
               ) -> OpsStatus:
    """Everything the operations page shows; a part that cannot be read says why instead."""
    batch = batch_problem = speed_status = speed_problem = invisible = None
    try:
        manifest = read_current(lake)
        if manifest is None:
            batch_problem = "no batch version is published yet; run `leaderboard batch`"
        else:
            batch = batch_run(manifest)
            invisible = len(invisible_files(lake, manifest))
    except ManifestError as exc:
        batch_problem = str(exc)
    try:
        speed_status = speed.status().as_dict()
    except redis.RedisError as exc:
        speed_problem = f"Redis does not answer ({exc}); check REDIS_URL or the local server"
    return OpsStatus(now=format_instant(now), batch=batch, batch_problem=batch_problem,
                     speed=speed_status, speed_problem=speed_problem,
                     quarantine=tally.count(lake, now.date()), invisible_files=invisible)
