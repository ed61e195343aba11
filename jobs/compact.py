"""Compaction of a closed landing partition: many small landed files become one, same rows.

Usage: python -m jobs.compact --date 2026-12-01 [--data DIR] [--config NAME] [--small-rows N]

The live ingest path lands one small file per micro-batch, so a day's partition holds
thousands of files; reading them costs the batch, the warehouse and every rebuild. This job
rewrites the small files of one partition as `part-compact-<seq>.parquet` files holding
exactly the same rows, and is safe to run beside the live system because:

- the speed layer folds every file in partitions at or after its live version's watermark
  date, and tracks progress per (writer, seq): a new file there would be folded again. So a
  partition is compacted only when it lies wholly below the live speed version's watermark
  (after the rebase onto the version that absorbed it), and only files whose rows were all
  ingested before both watermarks;
- only files the live batch version absorbed are compacted, and a record beside each new
  file lists the files it replaced, so the batch counts the new file as absorbed
  (`leaderboard.lake.absorbed_with_compactions`): no full recompute, no standings change;
- files that share an identity and an `ingested_at` with another file are left alone: the
  batch breaks that tie by file name, which compaction would change;
- every step is durable before the next: record (intent), new file (temp + fsync + rename),
  verification (row count and a checksum of all rows), only then the originals are deleted
  and the record marked done. A crash leaves originals and new file side by side, which the
  batch's dedupe by (match_id, player_id) reads as the same events; a rerun finishes the job.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from leaderboard.erasure import erasure_barrier
from leaderboard.faults import checkpoint
from leaderboard.lake import (
    BACKFILL_FILE_ROWS,
    COMPACTION_RECORD_SUFFIX,
    COMPACTION_WRITER,
    absorbed_with_compactions,
    atomic_write_bytes,
    atomic_write_parquet,
    compaction_record_path,
    events_dir,
    fsync_dir,
    landed_files,
    open_landing_writes,
    stamp_range,
)
from leaderboard.manifest import Manifest, read_current
from leaderboard.schema import LANDED_SCHEMA, as_landed
from leaderboard.settings import Settings
from leaderboard.timeutil import format_instant

__all__ = [
    "SMALL_FILE_ROWS",
    "CompactionError",
    "CompactionReport",
    "FileFacts",
    "SpeedWatermark",
    "choose_files",
    "compact_partition",
    "finish_compactions",
    "group_files",
    "live_speed_watermark",
    "main",
    "partition_gate",
    "rows_checksum",
    "tied_files",
]

#: Files with fewer rows than this are "small" (live micro-batches); bigger ones stay.
SMALL_FILE_ROWS = 250_000
#: Landed columns worth a Parquet dictionary (as the landing writer encodes them).
_DICTIONARY = ["points", "region", "mode", "server_id", "ingested_at"]
_SEQ_PER_DAY = 10_000

Say = Callable[[str], None]


class CompactionError(RuntimeError):
    """A compaction that cannot be finished safely; the message says what to check."""


@dataclass(frozen=True)
class SpeedWatermark:
    """What the speed layer folds: everything ingested at or after `watermark`.

    `present=False`: no speed layer is deployed (nothing folds landed files).
    `present=True, watermark=None`: it has no batch version yet, so it may fold anything.
    """

    present: bool
    watermark: datetime | None = None
    version: str | None = None


@dataclass(frozen=True)
class FileFacts:
    """What compaction needs to know about one landed file (from metadata, no rows read)."""

    relpath: str
    rows: int
    newest_stamp: datetime
    absorbed: bool


@dataclass
class CompactionReport:
    day: date
    skipped: str | None = None
    resumed: int = 0
    compacted: list[dict[str, Any]] = field(default_factory=list)
    left: dict[str, str] = field(default_factory=dict)  # relpath -> why it was not compacted
    files_before: int = 0
    files_after: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"day": self.day.isoformat(), "skipped": self.skipped, "resumed": self.resumed,
                "compacted": self.compacted, "left": self.left,
                "files_before": self.files_before, "files_after": self.files_after}


# -- pure -----------------------------------------------------------------------------------

def rows_checksum(table: pa.Table) -> str:
    """A checksum of a table's rows that ignores row order and file layout: sha256 over the
    rows sorted by every column, column by column (values, string lengths and bytes)."""
    table = as_landed(table)
    if table.num_rows:
        table = table.sort_by([(name, "ascending") for name in LANDED_SCHEMA.names])
    digest = hashlib.sha256(f"rows={table.num_rows}".encode())
    for name in LANDED_SCHEMA.names:
        column = table.column(name).combine_chunks()
        if name == "board" and column.null_count == len(column):
            continue  # match events only: the checksum of files from before the column
        digest.update(f"|{name}|{column.null_count}|".encode())
        if column.null_count:
            digest.update(np.asarray(column.is_null()).tobytes())
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            column = column.cast(pa.large_string())
            offsets = np.frombuffer(column.buffers()[1], dtype=np.int64)[
                column.offset: column.offset + len(column) + 1]
            digest.update(np.diff(offsets).astype("<i8").tobytes())
            data = column.buffers()[2]
            if data is not None and len(offsets) and offsets[-1] > offsets[0]:
                digest.update(memoryview(data)[int(offsets[0]): int(offsets[-1])])
        else:
            values = (column.cast(pa.int64()) if pa.types.is_timestamp(column.type)
                      or pa.types.is_boolean(column.type) else column)
            digest.update(np.asarray(values.fill_null(0)).astype("<i8").tobytes())
    return digest.hexdigest()


def partition_gate(day: date, published: Manifest | None, speed: SpeedWatermark) -> str | None:
    """Why partition `day` must not be compacted now (None: it may be)."""
    if published is None:
        return "no published batch version yet: nothing is absorbed"
    if day > published.as_of_date:
        return (f"the live batch version {published.version} (as of {published.as_of}) has "
                f"not absorbed partition {day}; run the batch for {day} first")
    if speed.present:
        if speed.watermark is None:
            return ("the speed layer has no batch version yet, so it may still fold any file; "
                    "rebase it (leaderboard speed rebase) first")
        if day >= speed.watermark.date():
            return (f"the speed layer is on version {speed.version} (watermark "
                    f"{format_instant(speed.watermark)}), which still folds partition {day}: "
                    "a compacted file there would be counted twice; rebase it first")
    return None


def choose_files(files: Sequence[FileFacts], *, watermark: datetime,
                 small_rows: int = SMALL_FILE_ROWS) -> tuple[list[FileFacts], dict[str, str]]:
    """The files of a partition that may be compacted, and why each other one may not."""
    chosen: list[FileFacts] = []
    left: dict[str, str] = {}
    for facts in files:
        if not facts.absorbed:
            left[facts.relpath] = "not absorbed by the live batch version"
        elif facts.newest_stamp >= watermark:
            left[facts.relpath] = (f"holds rows ingested at or after {format_instant(watermark)}"
                                   " (still speed-layer data)")
        elif facts.rows >= small_rows:
            left[facts.relpath] = f"{facts.rows} rows: not a small file"
        else:
            chosen.append(facts)
    return chosen, left


def tied_files(tables: dict[str, pa.Table]) -> set[str]:
    """Files holding a row whose (match_id, player_id, ingested_at) also appears in another
    file: the batch's dedupe breaks that tie by file name, so they must keep their names."""
    if len(tables) < 2:
        return set()
    parts = [t.select(["match_id", "player_id", "ingested_at"])
             .append_column("file", pa.array([name] * t.num_rows, pa.string()))
             for name, t in tables.items()]
    rows = pa.concat_tables(parts)
    per_file = rows.group_by(["match_id", "player_id", "ingested_at", "file"]).aggregate([])
    counts = per_file.group_by(["match_id", "player_id", "ingested_at"]).aggregate(
        [("file", "count")])
    shared = counts.filter(pc.greater(counts.column("file_count"), 1))
    if shared.num_rows == 0:
        return set()
    joined = per_file.join(shared, ["match_id", "player_id", "ingested_at"], join_type="inner")
    return set(joined.column("file").to_pylist())


def group_files(files: Sequence[FileFacts], *, max_rows: int = BACKFILL_FILE_ROWS
                ) -> list[list[FileFacts]]:
    """Files (in landing order) packed into groups of at most `max_rows` rows; a group of
    one file is dropped (rewriting it gains nothing)."""
    groups: list[list[FileFacts]] = []
    rows = 0
    for facts in files:
        if not groups or rows + facts.rows > max_rows:
            groups.append([])
            rows = 0
        groups[-1].append(facts)
        rows += facts.rows
    return [g for g in groups if len(g) > 1]


# -- I/O ------------------------------------------------------------------------------------

def _read_rows(path: Path) -> pa.Table:
    return as_landed(pq.read_table(path))


def _partition(lake: Path, day: date) -> Path:
    return events_dir(lake) / f"ingest_date={day.isoformat()}"


def _records(lake: Path, day: date) -> list[tuple[Path, dict[str, Any]]]:
    found = []
    for path in sorted(_partition(lake, day).glob(f"*{COMPACTION_RECORD_SUFFIX}")):
        try:
            found.append((path, json.loads(path.read_text())))
        except (OSError, ValueError) as exc:
            raise CompactionError(f"compaction record {path} is unreadable ({exc}); restore it "
                                  "or, if its file and originals are intact, delete it") from None
    return found


def _write_record(path: Path, record: dict[str, Any]) -> None:
    atomic_write_bytes(path, json.dumps(record, indent=1, sort_keys=True).encode())


def _verify(target: Path, record: dict[str, Any]) -> bool:
    """Whether the compacted file holds exactly the record's rows."""
    if not target.exists():
        return False
    rows = _read_rows(target)
    return bool(rows.num_rows == record["rows"] and rows_checksum(rows) == record["checksum"])


def _write_target(lake: Path, record: dict[str, Any]) -> Path:
    """Write the compacted file from its originals (all present), atomically."""
    tables = [_read_rows(lake / o["path"]) for o in record["originals"]]
    rows = pa.concat_tables(tables)
    if rows.num_rows != record["rows"] or rows_checksum(rows) != record["checksum"]:
        raise CompactionError(
            f"the originals listed in {record['target']}'s record no longer hold the rows it "
            "recorded; leave them in place and check the partition by hand")
    target = lake / str(record["target"])
    atomic_write_parquet(rows, target, sort_by="event_time", use_dictionary=_DICTIONARY)
    return target


def _finish(lake: Path, record_path: Path, record: dict[str, Any], say: Say) -> None:
    """Bring one compaction to its end state: new file verified, originals gone, done.

    Fault checkpoints (`leaderboard.faults`): compact.written, compact.verified,
    compact.deleted."""
    target = lake / record["target"]
    present = [o for o in record["originals"] if (lake / o["path"]).exists()]
    if not _verify(target, record):
        if len(present) != len(record["originals"]):
            missing = sorted({o["path"] for o in record["originals"]}
                             - {o["path"] for o in present})
            raise CompactionError(
                f"{record['target']} is missing or does not match its record, and original(s) "
                f"{missing[:3]} are gone: restore them from a backup before running again")
        target.unlink(missing_ok=True)
        target = _write_target(lake, record)
        checkpoint("compact.written")
        if not _verify(target, record):
            raise CompactionError(f"{target} does not read back with the rows it was written "
                                  "with; the originals are kept (check the disk)")
    checkpoint("compact.verified")
    for original in present:
        (lake / original["path"]).unlink(missing_ok=True)
    fsync_dir(target.parent)
    checkpoint("compact.deleted")
    record["done"] = True
    _write_record(record_path, record)
    say(f"compacted {len(record['originals'])} file(s) ({record['rows']} rows) into "
        f"{record['target']}")


def finish_compactions(lake: Path, day: date, say: Say | None = None) -> int:
    """Finish every compaction of the partition a crash interrupted; returns how many."""
    say = say or (lambda _message: None)
    finished = 0
    for record_path, record in _records(lake, day):
        if not record.get("done"):
            say(f"finishing an interrupted compaction into {record['target']}")
            _finish(lake, record_path, record, say)
            finished += 1
    return finished


def _next_seq(lake: Path, day: date) -> int:
    """A seq for the next compacted file of the day: YYYYMMDD * 10^4 + n, after any used."""
    base = int(day.strftime("%Y%m%d")) * _SEQ_PER_DAY
    used = [f.seq for f in landed_files(lake, days=[day]) if f.writer == COMPACTION_WRITER]
    for record_path, _record in _records(lake, day):
        used.append(int(record_path.name.split("-")[2].split(".")[0]))
    seq = max([base, *[u + 1 for u in used]])
    if seq >= base + _SEQ_PER_DAY:
        raise CompactionError(f"partition {day} was compacted {_SEQ_PER_DAY} times; "
                              "compact it by hand")
    return seq


def compact_partition(
    lake: Path,
    day: date,
    *,
    speed: SpeedWatermark,
    small_rows: int = SMALL_FILE_ROWS,
    max_rows: int = BACKFILL_FILE_ROWS,
    say: Say | None = None,
) -> CompactionReport:
    """Compact the small files of partition `day`; safe to rerun (finishes or no-ops).

    Fault checkpoint `compact.record` (`leaderboard.faults`) follows the record's write.
    Not while an erasure rewrites the partition's files (`erasure_barrier`: it waits).
    """
    with erasure_barrier(lake, exclusive=False):
        return _compact_partition(lake, day, speed=speed, small_rows=small_rows,
                                  max_rows=max_rows, say=say)


def _compact_partition(lake: Path, day: date, *, speed: SpeedWatermark, small_rows: int,
                       max_rows: int, say: Say | None) -> CompactionReport:
    say = say or (lambda _message: None)
    report = CompactionReport(day)
    partition = _partition(lake, day)
    before = landed_files(lake, days=[day])
    report.files_before = len(before)
    if not partition.is_dir():
        report.skipped = f"partition {day} has no landed files"
        say(report.skipped)
        return report
    report.resumed = finish_compactions(lake, day, say)
    published = read_current(lake)
    reason = partition_gate(day, published, speed)
    writing = open_landing_writes(partition)
    if reason is None and writing:
        reason = (f"a writer is still writing into partition {day} ({writing[0].name}); "
                  "try again when it is closed")
    if reason is not None:
        report.skipped = reason
        report.files_after = len(landed_files(lake, days=[day]))
        say(f"not compacting {day}: {reason}")
        return report
    assert published is not None  # partition_gate said so
    watermark = published.watermark_at
    if speed.present and speed.watermark is not None:
        watermark = min(watermark, speed.watermark)
    absorbed = absorbed_with_compactions(lake, published.inputs.get("files", {}), days=[day])
    facts = []
    for landed in landed_files(lake, days=[day]):
        relpath = str(landed.path.relative_to(lake))
        facts.append(FileFacts(relpath, pq.ParquetFile(landed.path).metadata.num_rows,
                               stamp_range(landed.path)[1], relpath in absorbed))
    chosen, report.left = choose_files(facts, watermark=watermark, small_rows=small_rows)
    tables = {f.relpath: _read_rows(lake / f.relpath) for f in chosen}
    for relpath in sorted(tied_files(tables)):
        report.left[relpath] = "shares an identity and ingested_at with another file"
        tables.pop(relpath)
    chosen = [f for f in chosen if f.relpath in tables]
    for group in group_files(chosen, max_rows=max_rows):
        seq = _next_seq(lake, day)
        target = partition / f"part-{COMPACTION_WRITER}-{seq:012d}.parquet"
        rows = pa.concat_tables([tables[f.relpath] for f in group])
        record = {
            "format": 1, "ingest_date": day.isoformat(),
            "target": str(target.relative_to(lake)),
            "originals": [{"path": f.relpath, "rows": tables[f.relpath].num_rows,
                           "checksum": rows_checksum(tables[f.relpath])} for f in group],
            "rows": rows.num_rows, "checksum": rows_checksum(rows),
            "watermark": format_instant(watermark), "done": False,
        }
        record_path = compaction_record_path(target)
        _write_record(record_path, record)
        checkpoint("compact.record")
        _finish(lake, record_path, record, say)
        report.compacted.append({"target": record["target"], "rows": record["rows"],
                                 "originals": len(group)})
    report.files_after = len(landed_files(lake, days=[day]))
    if not report.compacted:
        say(f"nothing to compact in {day} ({report.files_before} file(s), "
            f"{len(report.left)} left as they are)")
    return report


def live_speed_watermark(settings: Settings) -> SpeedWatermark:
    """The live speed version, read from Redis without starting anything new.

    No REDIS_URL and no local server recorded under the data dir: no speed layer. A speed
    layer that lost its pointer will take the lake's live version on first use, so that is
    what it is taken to be. Unreachable Redis raises (a retry will tell).
    """
    if settings.redis_url is None and not (settings.data_dir / "redis" / "server.json").exists():
        return SpeedWatermark(present=False)
    from leaderboard.speed_keys import connect, read_current_version

    client = connect(settings)
    try:
        found = read_current_version(client)
    finally:
        client.close()
    if found is None:
        live = read_current(settings.lake_dir)
        if live is None:
            return SpeedWatermark(present=True)
        return SpeedWatermark(present=True, watermark=live.watermark_at, version=live.version)
    return SpeedWatermark(present=True, watermark=found.watermark, version=found.version)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--date", required=True, help="the partition, YYYY-MM-DD")
    parser.add_argument("--data", help="data dir (env LEADERBOARD_DATA)")
    parser.add_argument("--config", help="board registry (env LEADERBOARD_CONFIG)")
    parser.add_argument("--small-rows", type=int, default=SMALL_FILE_ROWS,
                        help=f"files with fewer rows are compacted (default {SMALL_FILE_ROWS})")
    args = parser.parse_args(argv)
    settings = Settings.from_env(data_dir=args.data, config=args.config)
    report = compact_partition(settings.lake_dir, date.fromisoformat(args.date),
                               speed=live_speed_watermark(settings), small_rows=args.small_rows,
                               say=lambda message: print(message, file=sys.stderr))
    print(json.dumps(report.as_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
