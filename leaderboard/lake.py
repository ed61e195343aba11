"""The lake layout and the landing writer.

Every write is temp file + fsync + rename, so a reader sees a whole file or nothing. A landing
writer owns a seq counter that it advances durably *before* it writes, so a crash between the
write and the rename burns that seq instead of reusing it. Seqs are reserved durably in blocks
(SEQ_BLOCK at a time), so most files cost no counter write; a crash burns the rest of the block.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TextIO, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from leaderboard.schema import (
    LANDED_SCHEMA,
    QUARANTINE_SCHEMA,
    SCORE_QUARANTINE_SCHEMA,
    TIMESTAMP,
    conform,
)
from leaderboard.timeutil import epoch_us, to_utc

__all__ = [
    "BACKFILL_FILE_ROWS",
    "COMPACTION_RECORD_SUFFIX",
    "COMPACTION_WRITER",
    "LANDING_SETTLE_WAIT",
    "LANDING_TEMP_STALE",
    "ROW_GROUP_SIZE",
    "LandedFile",
    "LandingStuck",
    "LandingWriter",
    "WriterBusy",
    "absorbed_with_compactions",
    "atomic_write_bytes",
    "atomic_write_parquet",
    "compacted_originals",
    "compaction_record_path",
    "compaction_records",
    "events_dir",
    "fsync_dir",
    "held_landing",
    "idle_landing",
    "landed_files",
    "landing_floor",
    "landing_lock_path",
    "landing_stamp",
    "open_landing_writes",
    "parse_landed_name",
    "quarantine_dir",
    "read_listed",
    "retire_landing_floor",
    "settle_landings",
    "stamp_range",
]

ROW_GROUP_SIZE = 128 * 1024
#: Seqs a landing writer reserves durably at a time.
SEQ_BLOCK = 64
#: Landed event columns with few distinct values (ingested_at: one per live file), which are
#: dictionary-encoded in Parquet. The ids are (nearly) all distinct and event_time spreads,
#: so a dictionary there is wasted work and bytes.
_LANDED_DICTIONARY = ["points", "region", "mode", "server_id", "ingested_at"]
BACKFILL_FILE_ROWS = 1_000_000
_WRITER = re.compile(r"^[a-z0-9_]{1,32}$")
_PART = re.compile(r"^part-([a-z0-9_]{1,32})-(\d{12})\.parquet$")


class WriterBusy(RuntimeError):
    """Another process holds this writer id."""


def events_dir(lake: Path) -> Path:
    return lake / "events"


def quarantine_dir(lake: Path) -> Path:
    return lake / "quarantine"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temp_path(target: Path) -> Path:
    return target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")


def atomic_write_bytes(target: Path, payload: bytes) -> None:
    """Write `payload` to `target` atomically (temp + fsync + rename + dir fsync)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = _temp_path(target)
    with open(temp, "wb") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, target)
    fsync_dir(target.parent)


def _is_sorted(column: pa.ChunkedArray) -> bool:
    """Whether a column is already in ascending order with no nulls (so sorting keeps it)."""
    if column.null_count or not (pa.types.is_integer(column.type)
                                 or pa.types.is_timestamp(column.type)):
        return False
    values = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if pa.types.is_timestamp(values.type):
        values = values.view(pa.int64())
    array = values.to_numpy()
    return bool((array[1:] >= array[:-1]).all())


def atomic_write_parquet(table: pa.Table, target: Path, *, sort_by: str | None = None,
                         use_dictionary: bool | list[str] = True) -> int:
    """Write a Parquet file atomically (zstd, row groups sized for pruning); returns its bytes.

    `sort_by` sorts the rows by that column first (stably; a column already in order is left
    as is); `use_dictionary` is passed to the Parquet writer.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    if (sort_by is not None and table.num_rows > 1
            and not _is_sorted(table.column(sort_by))):
        table = table.sort_by(sort_by)
    temp = _temp_path(target)
    pq.write_table(table, temp, compression="zstd", row_group_size=ROW_GROUP_SIZE,
                   write_statistics=True, use_dictionary=use_dictionary)
    with open(temp, "rb+") as handle:
        os.fsync(handle.fileno())
    size = temp.stat().st_size
    os.replace(temp, target)
    fsync_dir(target.parent)
    return size


@dataclass(frozen=True, order=True)
class LandedFile:
    """One landed micro-batch."""

    writer: str
    seq: int
    ingest_date: date
    path: Path
    rows: int = -1


#: A landing temp file untouched this long is a crashed writer's leftover (its seq is
#: burned, it is never renamed), not a write in progress.
LANDING_TEMP_STALE = timedelta(hours=1)


def open_landing_writes(partition: Path, *, stale_after: timedelta = LANDING_TEMP_STALE,
                        now: datetime | None = None) -> list[Path]:
    """Landing writes in progress in a partition: temp files (`.part-<writer>-<seq>.parquet.
    <hex>.tmp`, see `atomic_write_parquet`) touched within `stale_after` of `now`."""
    if not partition.is_dir():
        return []
    clock = (now or datetime.now(UTC)).timestamp()
    found = []
    for temp in sorted(partition.glob(".part-*.tmp")):
        try:
            if clock - temp.stat().st_mtime < stale_after.total_seconds():
                found.append(temp)
        except FileNotFoundError:
            continue  # renamed or removed meanwhile: that write is over
    return found


def parse_landed_name(path: Path) -> tuple[str, int] | None:
    match = _PART.match(path.name)
    return (match.group(1), int(match.group(2))) if match else None


def landed_files(lake: Path, *, kind: str = "events",
                 days: Iterable[date] | None = None) -> list[LandedFile]:
    """Every landed file, by (writer, seq); temp files and foreign files are ignored.
    `days`: only these partitions' (a task about a few days lists only those, not the
    whole history)."""
    root = lake / kind
    found = []
    if not root.is_dir():
        return []
    patterns = (["ingest_date=*/part-*.parquet"] if days is None
                else [f"ingest_date={d.isoformat()}/part-*.parquet" for d in sorted(set(days))])
    for part in (p for pattern in patterns for p in root.glob(pattern)):
        parsed = parse_landed_name(part)
        if parsed is None:
            continue
        day = date.fromisoformat(part.parent.name.removeprefix("ingest_date="))
        found.append(LandedFile(parsed[0], parsed[1], day, part))
    return sorted(found)


_T = TypeVar("_T")
#: How many listings `read_listed` tries: each retry follows a compaction that deleted a file
#: of the previous listing, and a partition is compacted once a night.
LISTING_ATTEMPTS = 4


def read_listed(listing: Callable[[], list[LandedFile]],
                read: Callable[[list[LandedFile]], _T]) -> _T:
    """`read` over the files of `listing`, listed and read again from the start when one of
    them vanished meanwhile. Compaction (jobs.compact) deletes the files it replaced only
    once the file holding their rows is written, so the next listing holds every row: a
    reader of files older than the live watermark (which compaction rewrites) needs no lock
    shared with it. Only the last attempt's FileNotFoundError propagates."""
    for _retry in range(LISTING_ATTEMPTS - 1):
        try:
            return read(listing())
        except FileNotFoundError:
            continue  # compacted meanwhile: its rows are in a file the next listing holds
    return read(listing())


def stamp_range(path: Path, column: str = "ingested_at") -> tuple[datetime, datetime]:
    """(min, max) of a timestamp column from the file's Parquet statistics, without reading
    its rows. A row group without statistics widens the range to (datetime.min, datetime.max):
    unknown means "may hold anything"."""
    meta = pq.ParquetFile(path).metadata
    index = meta.schema.to_arrow_schema().get_field_index(column)
    low = high = None
    lowest, highest = datetime.min.replace(tzinfo=UTC), datetime.max.replace(tzinfo=UTC)
    for group in range(meta.num_row_groups):
        if meta.row_group(group).num_rows == 0:  # written with no statistics: holds nothing
            continue
        stats = meta.row_group(group).column(index).statistics
        if stats is None or not stats.has_min_max:
            return lowest, highest
        first, last = to_utc(stats.min), to_utc(stats.max)
        low = first if low is None else min(low, first)
        high = last if high is None else max(high, last)
    if low is None or high is None:  # no rows at all
        return highest, lowest
    return low, high


def _lock_id(fd: int) -> str:
    """The identity of a lock file (device and inode), as the door records it."""
    stat = os.fstat(fd)
    return f"{stat.st_dev}:{stat.st_ino}"


def landing_lock_path(lake: Path, writer: str) -> Path:
    """The lock a writer holds while a landing's ids are in flight (claim, land, settle)."""
    if not _WRITER.match(writer):
        raise ValueError(f"writer id {writer!r} must be 1-32 chars of [a-z0-9_]")
    return Path(lake) / "writers" / f"{writer}.landing"


#: The latest cut of a batch of an open day (`settle_landings`), under lake/writers/.
_CUT_NAME = "open-day-cut.json"


def landing_floor(lake: Path) -> datetime | None:
    """The earliest instant a landing may be stamped with now: the latest cut an open day's
    batch recorded (None: none). Read by a landing under its writer's landing lock."""
    try:
        record = json.loads((Path(lake) / "writers" / _CUT_NAME).read_text())
        return to_utc(datetime.fromisoformat(record["cut"]))
    except FileNotFoundError:
        return None


@contextmanager
def _cut_lock(lake: Path) -> Iterator[None]:
    """Serialise the changes of the recorded cut (a batch raising it, a publish retiring
    it): a retirement never deletes a later cut recorded meanwhile."""
    fd = os.open(Path(lake) / "writers" / f"{_CUT_NAME}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def retire_landing_floor(lake: Path, watermark: datetime) -> bool:
    """Delete the recorded cut once a published version's `watermark` is past it: that
    version reads every landing stamped before it, so the floor protects nothing any more
    (a cut ahead of the clock would otherwise restamp every later landing). The open day's
    own version (watermark == cut) keeps it. Whether it was deleted."""
    if not (Path(lake) / "writers" / _CUT_NAME).exists():
        return False
    with _cut_lock(lake):
        floor = landing_floor(lake)
        if floor is None or floor >= watermark:
            return False
        (Path(lake) / "writers" / _CUT_NAME).unlink(missing_ok=True)
        return True


def landing_stamp(now: datetime, floor: datetime | None) -> datetime:
    """The instant a landing is stamped with: its clock `now`, or the floor when that is
    later (`LandingWriter.landing` yields it)."""
    return now if floor is None or now >= floor else floor


#: How long an open day's batch waits for one writer's landing in flight (`settle_landings`).
#: A landing holds its lock for milliseconds; one held this long is stopped, not slow.
LANDING_SETTLE_WAIT = timedelta(seconds=60)
_SETTLE_POLL = 0.05  # seconds between two tries of a held landing lock


class LandingStuck(RuntimeError):
    """A writer held its landing lock past the bound an open day's batch waits
    (`settle_landings`): alive and not running (suspended, paused, stuck on a disk write)."""

    def __init__(self, writer: str, waited: timedelta) -> None:
        self.writer = writer
        super().__init__(
            f"writer {writer} has held its landing lock for {waited.total_seconds():g} s (a "
            "landing takes milliseconds: the process is stopped or stuck, e.g. suspended with "
            "Ctrl-Z, a paused container or a hung disk write): resume or stop that writer, "
            "then run the batch again; nothing was published")


def settle_landings(lake: Path, cut: datetime, *, wait: timedelta | None = None,
                    say: Callable[[str], None] | None = None) -> None:
    """Make `cut` a line no landing crosses: every landing stamped before it is landed when
    this returns, and every later one is stamped at or after it.

    A landing's clock is read by its caller before the writer's landing lock is taken, and
    its file is renamed into place just before the lock is released. So the cut is recorded
    first (a landing reads it under its lock and stamps at least the cut, `LandingWriter.
    landing`), then each writer's landing lock is taken and released once: a landing that
    held it when the cut was recorded (and may have read no cut) has then renamed its file.
    A batch lists the lake after this, so no landing stamped before its watermark appears
    after its listing.

    Each lock is waited for at most `wait` (default LANDING_SETTLE_WAIT; `say` hears once
    which writer is waited for), then LandingStuck: the batch must not list the lake. The
    cut stays recorded: landings that read it were stamped at it, an instant already past
    when they landed, which no version needs and none contradicts (their rows stay speed
    events until a later version reads them), so withdrawing it would gain nothing and race
    a concurrent batch's later cut."""
    bound = LANDING_SETTLE_WAIT if wait is None else wait
    state = Path(lake) / "writers"
    state.mkdir(parents=True, exist_ok=True)
    with _cut_lock(lake):
        floor = landing_floor(lake)
        if floor is None or floor < cut:
            atomic_write_bytes(state / _CUT_NAME,
                               json.dumps({"cut": to_utc(cut).isoformat()}).encode())
    for path in sorted(state.glob("*.landing")):
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            _wait_for_landing(fd, path.stem, bound, say)
        finally:
            os.close(fd)


def _wait_for_landing(fd: int, writer: str, bound: timedelta,
                      say: Callable[[str], None] | None) -> None:
    """Take and release the landing lock on `fd` (the landing in flight, if any, is then
    renamed), polling for at most `bound`; LandingStuck past it."""
    deadline = time.monotonic() + bound.total_seconds()
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise LandingStuck(writer, bound) from None
            if say is not None:
                say(f"waiting for writer {writer}'s landing in flight (up to "
                    f"{bound.total_seconds():g} s)")
                say = None
            time.sleep(_SETTLE_POLL)
            continue
        fcntl.flock(fd, fcntl.LOCK_UN)
        return


def held_landing(lake: Path, writer: str) -> str:
    """The identity of `writer`'s landing lock, which the caller holds (`LandingWriter.
    landing`); raises RuntimeError when nobody holds it: ids claimed outside a landing
    would look abandoned to every other writer."""
    try:
        fd = os.open(landing_lock_path(lake, writer), os.O_RDWR)
    except FileNotFoundError:
        fd = -1
    try:
        if fd >= 0:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return _lock_id(fd)
        raise RuntimeError(f"writer {writer} claims ids outside a landing: hold "
                           "`LandingWriter.landing()` from the claim to the settle")
    finally:
        if fd >= 0:
            os.close(fd)


@contextmanager
def idle_landing(lake: Path, writer: str, recorded: Iterable[str | None] = ()
                 ) -> Iterator[bool]:
    """Whether `writer` is between landings (dead, or alive and not landing): its landing
    lock is free, so ids it left in flight will never land unless they already did, and
    whoever holds this may settle or release them from the lake. While the block runs the
    lock is held here, so the writer starts no landing meanwhile (it waits).

    Never trusted when the lock file is missing, or is not the file the claims were made
    under (`recorded`: the lock identities in their headers): an operator who deleted the
    file of a live writer must not make it look idle (it still holds the lock on the
    deleted inode)."""
    try:
        fd = os.open(landing_lock_path(lake, writer), os.O_RDWR)  # never created here
    except FileNotFoundError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            here = _lock_id(fd)
            same = (os.stat(landing_lock_path(lake, writer)).st_ino == os.fstat(fd).st_ino
                    and all(r is None or r == here for r in recorded))
        except FileNotFoundError:
            same = False
        try:
            yield same
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class LandingWriter:
    """Lands validated micro-batches for one writer id; never reuses a seq, even after a crash.

    One process at a time may hold a writer id (an exclusive lock on its seq file). The seq
    file holds a bound no seq handed out reaches: it is raised durably SEQ_BLOCK seqs at a time
    before the first seq of a block is used, and lowered back to the next unused seq on close.
    A crash leaves it raised, so a restarted writer skips the rest of the block.
    """

    def __init__(self, lake: Path, writer: str) -> None:
        if not _WRITER.match(writer):
            raise ValueError(f"writer id {writer!r} must be 1-32 chars of [a-z0-9_]")
        self.lake = Path(lake)
        self.writer = writer
        state = self.lake / "writers"
        state.mkdir(parents=True, exist_ok=True)
        self._seq_path = state / f"{writer}.seq"
        self._lock_path = state / f"{writer}.lock"
        self._lock = self._take_lock()
        #: The seq of this writer's latest landed events file (-1: none): the speed layer
        #: chains a writer's files by it, so a file whose fold failed is seen as a hole.
        self.last_event_seq = -1
        self._next = self._recover_next_seq()
        self._reserved = self._next  # seqs below this are durably reserved

    def _take_lock(self) -> TextIO:
        """Open and lock this writer id's lock file (held for the writer's life)."""
        lock = open(self._lock_path, "a+")  # noqa: SIM115 - held for life
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise WriterBusy(
                f"landing writer {self.writer} is held by another running process (its lock "
                f"{self._lock_path} is taken): stop that process or wait for it to finish, "
                "or use another writer id (`--writer`, or the server's writer setting)"
            ) from None
        return lock

    def _check_lock(self) -> None:
        """Make sure this process still holds the writer id: an operator who deleted (or
        replaced) the lock file lets another process take the same id. A deleted file is
        recreated and locked again; a file another process locked meanwhile stops this
        one (raises WriterBusy) before it lands anything."""
        try:
            same = os.stat(self._lock_path).st_ino == os.fstat(self._lock.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return
        try:
            fresh = self._take_lock()
        except WriterBusy:
            raise WriterBusy(
                f"the lock file {self._lock_path} of landing writer {self.writer} was "
                "deleted or replaced while this process held it, and another process holds "
                "the writer id now: stop one of them (never delete lake/writers/*.lock of a "
                "running writer)") from None
        old, self._lock = self._lock, fresh
        old.close()

    @contextmanager
    def landing(self) -> Iterator[datetime | None]:
        """Hold this writer's landing lock: from the door's claim of a landing's ids to
        their settle (or release). Ids a writer claimed while it does not hold it (dead, or
        alive between landings: a settle lost to a Redis error) are abandoned, and any
        writer whose claim meets them settles or releases them from the lake
        (`idle_landing`). Waits while another process recovers this writer's claims.
        Yields the landing floor (`landing_floor`, read under the lock): the landing is
        stamped no earlier, so an open day's batch that read the lake at that cut misses
        none of its rows (`settle_landings`)."""
        self._check_lock()
        path = landing_lock_path(self.lake, self.writer)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)  # deleted or replaced while we waited: lock the file there now
        try:
            yield landing_floor(self.lake)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _recover_next_seq(self) -> int:
        counted = 0
        if self._seq_path.exists():
            text = self._seq_path.read_text().strip()
            counted = int(text) if text.isdigit() else 0
        on_disk = 0
        for kind in ("events", "quarantine"):
            for f in landed_files(self.lake, kind=kind):
                if f.writer == self.writer:
                    on_disk = max(on_disk, f.seq + 1)
                    if kind == "events":
                        self.last_event_seq = max(self.last_event_seq, f.seq)
        return max(counted, on_disk)

    def close(self) -> None:
        if not self._lock.closed:
            try:
                if self._reserved > self._next:
                    # Still holding the lock: no other process can have used these seqs.
                    atomic_write_bytes(self._seq_path, str(self._next).encode())
                    self._reserved = self._next
            except OSError:
                pass  # the bound stays raised: the rest of the block is burned, nothing reused
            finally:
                fcntl.flock(self._lock, fcntl.LOCK_UN)
                self._lock.close()

    def __enter__(self) -> LandingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def next_seq(self) -> int:
        return self._next

    def _reserve(self) -> int:
        """The next seq, durably reserved before it is written, so it is never handed out again
        (the counter moves a block at a time; see the class)."""
        seq = self._next
        if seq >= self._reserved:
            atomic_write_bytes(self._seq_path, str(seq + SEQ_BLOCK).encode())
            self._reserved = seq + SEQ_BLOCK
        self._next = seq + 1
        return seq

    def _target(self, kind: str, day: date, seq: int) -> Path:
        return (self.lake / kind / f"ingest_date={day.isoformat()}"
                / f"part-{self.writer}-{seq:012d}.parquet")

    def land(self, events: pa.Table, ingested_at: datetime, *, backfill: bool = False
             ) -> list[LandedFile]:
        """Land validated events (EVENT_SCHEMA, plus `board` for direct scores), stamping
        ingested_at and the backfill flag.

        Files of at most BACKFILL_FILE_ROWS rows in the partition of the landing day, rows
        sorted by event_time inside a file for row-group pruning. A backfill is stamped with
        its landing time like any event; `backfill` carries "this is history" instead.
        """
        flagged = events.append_column(
            "backfill", pa.array(np.full(events.num_rows, backfill), pa.bool_()))
        if "board" not in flagged.column_names:  # match events; direct scores name theirs
            flagged = flagged.append_column("board", pa.nulls(events.num_rows, pa.string()))
        return self._write_stamped(flagged, ingested_at, "events", LANDED_SCHEMA, "event_time",
                                   _LANDED_DICTIONARY)

    def quarantine(self, rejected: pa.Table, ingested_at: datetime) -> list[LandedFile]:
        """Keep rejected rows with their reasons (QUARANTINE_SCHEMA without ingested_at; with
        `board` too for direct scores: SCORE_QUARANTINE_SCHEMA)."""
        schema = (SCORE_QUARANTINE_SCHEMA if "board" in rejected.column_names
                  else QUARANTINE_SCHEMA)
        return self._write_stamped(rejected, ingested_at, "quarantine", schema, None, True)

    def _write_stamped(self, table: pa.Table, ingested_at: datetime, kind: str,
                       schema: pa.Schema, sort_by: str | None,
                       use_dictionary: bool | list[str]) -> list[LandedFile]:
        if table.num_rows == 0:
            return []
        stamp = to_utc(ingested_at)
        micros = epoch_us(stamp)
        stamps = pa.array(np.full(table.num_rows, micros, dtype=np.int64)).view(TIMESTAMP)
        stamped = conform(table.append_column("ingested_at", stamps).select(schema.names),
                          schema)
        # Chunked by rows (a large import), every chunk in the landing day's partition.
        groups = [(stamp.date(), stamped.slice(offset, BACKFILL_FILE_ROWS))
                  for offset in range(0, stamped.num_rows, BACKFILL_FILE_ROWS)]
        written = []
        for day, part in groups:
            seq = self._reserve()
            target = self._target(kind, day, seq)
            atomic_write_parquet(part, target, sort_by=sort_by, use_dictionary=use_dictionary)
            written.append(LandedFile(self.writer, seq, day, target, part.num_rows))
            if kind == "events":
                self.last_event_seq = seq
        return written


# -- compaction records --------------------------------------------------------------------
#
# Compaction (jobs/compact.py) rewrites many small landed files of one closed partition as
# one file `part-compact-<seq>.parquet` holding the same rows. A record beside it
# (`part-compact-<seq>.compaction.json`) lists the files it replaced, so the batch still sees
# the compacted file as absorbed when every file it replaced was (no spurious full recompute).

#: The writer id of compacted files (never a landing writer's: it owns no seq file).
COMPACTION_WRITER = "compact"
COMPACTION_RECORD_SUFFIX = ".compaction.json"


def compaction_record_path(target: Path) -> Path:
    """Where the record of a compacted file lives: beside it, named after it."""
    return target.with_name(target.name.removesuffix(".parquet") + COMPACTION_RECORD_SUFFIX)


def compaction_records(lake: Path, *, days: Iterable[date] | None = None
                       ) -> dict[str, list[str]]:
    """Every compacted file (lake-relative path) -> the files it replaced (lake-relative).
    `days`: only these partitions' records (a compaction never crosses a partition).

    An unreadable record is left out: its file then looks like a new landing, which costs a
    full recompute at worst, never a wrong standing.
    """
    found: dict[str, list[str]] = {}
    partitions = (["ingest_date=*"] if days is None
                  else [f"ingest_date={d.isoformat()}" for d in sorted(set(days))])
    for path in sorted(p for partition in partitions for p in events_dir(lake).glob(
            f"{partition}/*{COMPACTION_RECORD_SUFFIX}")):
        try:
            record = json.loads(path.read_text())
            found[str(record["target"])] = [str(o["path"]) for o in record["originals"]]
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


def compacted_originals(lake: Path, relpath: str) -> list[str]:
    """The files a compacted file replaced (lake-relative), or [] for a file never compacted."""
    return compaction_records(lake).get(relpath, [])


def absorbed_with_compactions(lake: Path, absorbed: Iterable[str], *,
                              days: Iterable[date] | None = None) -> set[str]:
    """`absorbed` (lake-relative paths a version read) plus every compacted file whose
    originals were all absorbed, through any number of compactions of compactions.
    `days`: the compacted files of only these partitions (what a task about them needs)."""
    result = set(absorbed)
    pending = compaction_records(lake, days=days)
    grew = True
    while grew:
        grew = False
        for target, originals in list(pending.items()):
            if target in result:
                del pending[target]
            elif all(original in result for original in originals):
                result.add(target)
                del pending[target]
                grew = True
    return result
