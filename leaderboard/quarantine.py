"""Reading the quarantine for review: rows with stable ids, and the ledger of releases.

A quarantined row is named by where it lies and what it holds:
`<ingest_date>.<writer>.<seq>.<row>.<digest>` (its file `quarantine/ingest_date=D/
part-<writer>-<seq>.parquet`, its row in that file, 8 hex digits of a hash of its values
and reason), e.g. `2026-12-01.http.12.3.5f0c2a9e`. Quarantine files are written once; an
erasure may rewrite one without a player's rows, moving later rows up, so a row is found
by its digest at or above the row number it was listed at, and the ledger keys a release
by file and a 16-digit fingerprint of the row (`QuarantineRow.key`; the id's 8 digits
collide within a large file), not by row number. A listing walks files in (ingest_date,
writer, seq) order, and its cursor is the id of the last row returned: the next page resumes
after that row wherever it now lies (found by its digest, as a release finds it), so an
erasure between pages skips nothing; if the erasure removed that very row, the cursor is
stale (`StaleCursor`: list again from the start). A cursor naming a file that is gone
resumes after its place (an erasure that emptied a file leaves nothing of it to list).

A release re-lands chosen rows (`speed_layer.review`). Its ledger is one JSON file per
release under `lake/quarantine_releases/`, written before the rows land, naming the ids
(no player id: an erasure has nothing to scrub there) and the seq of the events file that
lands them, and marked `landed` once it
has. A release counts as done when marked, or when that file exists (it died between
landing and marking; compaction's records count as the file), so one that died before
landing is done again by the next, and compaction or retention removing the file later
does not undo a marked release.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from leaderboard.lake import (
    LandedFile,
    atomic_write_bytes,
    compaction_records,
    landed_files,
    parse_landed_name,
)
from leaderboard.schema import INPUT_FIELDS
from leaderboard.timeutil import format_instant, to_utc

__all__ = ["QUARANTINE_ID_PATTERN", "RELEASE_WRITER", "QuarantineRow", "Release",
           "StaleCursor", "find_rows", "list_quarantine", "moved_ids", "moved_to",
           "parse_quarantine_id", "read_releases", "released_at", "released_ids", "row_key",
           "rows_in", "write_release"]

#: The id of a quarantined row (see the module docstring).
QUARANTINE_ID_PATTERN = (r"^\d{4}-\d{2}-\d{2}\.[a-z0-9_]{1,32}\.\d{1,12}\.\d{1,9}\."
                         r"[0-9a-f]{8}$")
_ID = re.compile(QUARANTINE_ID_PATTERN)
#: The landing writer that re-lands released rows (one release at a time per lake).
RELEASE_WRITER = "release"
_LEDGER = "quarantine_releases"


def parse_quarantine_id(text: str) -> tuple[str, str, int, int, str] | None:
    """(ingest_date text, writer, seq, row, digest), or None when `text` is not an id."""
    if not _ID.match(text):
        return None
    day, writer, seq, row, digest = text.split(".")
    return day, writer, int(seq), int(row), digest


def row_key(row_id: str) -> str:
    """What names a row whatever its row number: the id without it (file and digest)."""
    day, writer, seq, _, digest = row_id.split(".")
    return f"{day}.{writer}.{seq}.{digest}"


def _digest(values: Sequence[str | None], size: int = 4) -> str:
    text = "\x1f".join("\x00" if v is None else v for v in values)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=size).hexdigest()


@dataclass(frozen=True)
class QuarantineRow:
    """One quarantined row: its id, the values as sent (text), why, and when it came."""

    id: str
    values: dict[str, str | None]
    reason: str
    detail: str
    source: str
    ingested_at: datetime
    #: 16 hex digits of a hash of the values and reason: with the file, what the ledger
    #: keys a release by. The id's 8 digits alone collide within a file of ~100k rows
    #: (birthday bound), and a release of one row would then count as the other's.
    fingerprint: str = ""
    #: The direct board a quarantined score was submitted to (None: a match event).
    board: str | None = None

    def as_dict(self, released: bool = False, moved_to: str | None = None) -> dict[str, Any]:
        """The listing's row: `released` (a release landed it) and `moved_to` (a release
        quarantined it again under that id instead: nothing landed, that row is the one to
        release)."""
        return {"id": self.id, **self.values, "board": self.board, "reason": self.reason,
                "detail": self.detail, "source": self.source,
                "ingested_at": format_instant(self.ingested_at), "released": released,
                "moved_to": moved_to}

    @property
    def identity(self) -> tuple[str | None, str | None, str | None]:
        """(board, match_id, player_id): a score's board is part of its identity."""
        return self.board, self.values.get("match_id"), self.values.get("player_id")

    @property
    def key(self) -> str:
        """The ledger's key of this row: its file and fingerprint (`released_at`)."""
        return f"{row_key(self.id)}.{self.fingerprint}"


def _position(found: LandedFile) -> tuple[str, str, int]:
    return found.ingest_date.isoformat(), found.writer, found.seq


def _columns(table: pa.Table) -> dict[str, list[Any]]:
    return {name: table.column(name).to_pylist() for name in table.column_names}


def _row_digest(columns: dict[str, list[Any]], row: int, size: int = 4) -> str:
    return _digest([columns[name][row] if name in columns else None
                    for name in (*INPUT_FIELDS, "reason")], size)


def _rows_of(found: LandedFile, columns: dict[str, list[Any]],
             rows: Iterable[int]) -> Iterator[QuarantineRow]:
    day, writer, seq = _position(found)
    for row in rows:
        yield QuarantineRow(
            id=f"{day}.{writer}.{seq}.{row}.{_row_digest(columns, row)}",
            values={name: columns[name][row] if name in columns else None
                    for name in INPUT_FIELDS},
            reason=columns["reason"][row], detail=columns["detail"][row],
            source=columns["source"][row], ingested_at=to_utc(columns["ingested_at"][row]),
            fingerprint=_row_digest(columns, row, 8),
            board=columns["board"][row] if "board" in columns else None)


def rows_in(found: LandedFile) -> list[QuarantineRow]:
    """Every row of one quarantine file, in file order (e.g. the file a writer just wrote)."""
    columns = _columns(pq.read_table(found.path))
    return list(_rows_of(found, columns, range(len(columns["reason"]))))


class StaleCursor(ValueError):
    """The row a listing's cursor names is no longer in its file (an erasure removed it)."""


def _find(columns: dict[str, list[Any]], row: int, digest: str) -> int | None:
    """Where the row listed at `row` with `digest` lies now: at that number or above it
    (rows move up when an erasure removes rows before them); None if it is gone."""
    count = len(columns["reason"])
    return next((r for r in range(min(row, count - 1), -1, -1)
                 if _row_digest(columns, r) == digest), None)


def list_quarantine(lake: Path, *, reason: str | None = None, since: datetime | None = None,
                    limit: int = 100, after: str | None = None
                    ) -> tuple[list[QuarantineRow], str | None]:
    """Up to `limit` rows (of `reason`, landed at or after `since`) past the row `after`
    names, and the cursor of the next page (None: this is the last)."""
    start = parse_quarantine_id(after) if after else None
    since = None if since is None else to_utc(since)
    found: list[QuarantineRow] = []
    for landed in sorted(landed_files(lake, kind="quarantine"), key=_position):
        position = _position(landed)
        if since is not None and landed.ingest_date < since.date():
            continue
        if start is not None and position < start[:3]:
            continue
        table = pq.read_table(landed.path)
        columns = _columns(table)
        keep = pa.array([True] * table.num_rows)
        if reason is not None:
            keep = pc.and_(keep, pc.equal(table.column("reason"), reason))
        if since is not None:
            keep = pc.and_(keep, pc.greater_equal(
                table.column("ingested_at"),
                pa.scalar(since, table.schema.field("ingested_at").type)))
        rows = [i for i, ok in enumerate(pc.fill_null(keep, False).to_pylist()) if ok]
        if start is not None and position == start[:3]:
            at = _find(columns, start[3], start[4])
            if at is None:
                raise StaleCursor(
                    f"cursor {after}: that row is no longer in the quarantine (an erasure "
                    "removed it since the page was listed); list again without a cursor "
                    "(`since` skips what you have seen)")
            rows = [i for i in rows if i > at]
        for row in _rows_of(landed, columns, rows):
            if len(found) == limit:
                return found, found[-1].id
            found.append(row)
    return found, None


def find_rows(lake: Path, ids: list[str]) -> dict[str, QuarantineRow]:
    """The rows the ids name, keyed by the id asked for (ids naming nothing are left out).
    A row is looked for at its row number, then above it (rows move up when an erasure
    removes rows before them), by its digest."""
    wanted: dict[tuple[str, str, int], list[tuple[int, str, str]]] = {}
    for text in ids:
        parsed = parse_quarantine_id(text)
        if parsed is not None:
            wanted.setdefault(parsed[:3], []).append((parsed[3], parsed[4], text))
    found: dict[str, QuarantineRow] = {}
    if not wanted:
        return found
    for landed in landed_files(lake, kind="quarantine"):
        asked = wanted.get(_position(landed))
        if not asked:
            continue
        columns = _columns(pq.read_table(landed.path))
        for row, digest, text in asked:
            at = _find(columns, row, digest)
            if at is not None:
                found[text] = next(_rows_of(landed, columns, [at]))
    return found


@dataclass(frozen=True)
class Release:
    """One release in the ledger: the rows it lands and the seq of its events file."""

    seq: int
    released_at: datetime
    rows: tuple[str, ...]  # the ids of the rows it lands
    #: Set once the events file landed: from then on the entry alone says "done", so
    #: compaction or retention removing that file later changes nothing.
    landed: bool = False
    #: The rows' `QuarantineRow.key`s (empty in entries written before keys were kept:
    #: those count by `row_key` of their ids).
    keys: tuple[str, ...] = ()
    #: For rows quarantined again rather than landed (`speed_layer.review`: a score whose
    #: board left the registry), the new rows' ids in the order of `rows` (each id names
    #: its file, so every file the writer split them into is recorded); empty for a landing.
    moved_to: tuple[str, ...] = ()


def _ledger(lake: Path) -> Path:
    return lake / _LEDGER


def write_release(lake: Path, release: Release) -> None:
    """Record a release durably: before its rows land, and again marked `landed` after
    (see the module docstring)."""
    # Row ids only (file, row, digest): no player id is written here, so an erasure has
    # nothing to scrub in the ledger.
    payload = {"seq": release.seq, "released_at": format_instant(release.released_at),
               "landed": release.landed, "rows": list(release.rows),
               "keys": list(release.keys)}
    if release.moved_to:
        payload["moved_to"] = list(release.moved_to)
    atomic_write_bytes(_ledger(lake) / f"{release.seq:012d}.json",
                       json.dumps(payload, indent=1).encode())


def read_releases(lake: Path) -> list[Release]:
    """Every release whose rows landed, oldest first: marked landed, or (a release that
    died between landing and marking) its events file exists, as itself or among the
    originals of a compacted file."""
    folder = _ledger(lake)
    entries = [json.loads(path.read_text())
               for path in (sorted(folder.glob("*.json")) if folder.is_dir() else [])]
    landed: set[int] | None = None
    found = []
    for raw in entries:
        if not raw.get("landed"):
            if landed is None:
                landed = _release_seqs(lake)
            if raw["seq"] not in landed:
                continue  # died before landing: not released
        found.append(Release(
            raw["seq"], to_utc(datetime.fromisoformat(raw["released_at"])),
            tuple(raw["rows"]), True, tuple(raw.get("keys", ())),
            tuple(raw.get("moved_to", ()))))
    return found


def _release_seqs(lake: Path) -> set[int]:
    """Seqs of the release writer's events files, present or compacted into another."""
    seqs = {f.seq for f in landed_files(lake) if f.writer == RELEASE_WRITER}
    for originals in compaction_records(lake).values():
        for original in originals:
            parsed = parse_landed_name(Path(original))
            if parsed is not None and parsed[0] == RELEASE_WRITER:
                seqs.add(parsed[1])
    return seqs


def released_ids(lake: Path) -> dict[str, datetime]:
    """The key of every row a done release landed -> when (`QuarantineRow.key`, or
    `row_key` of its id for an entry written before keys were kept); ask with
    `released_at`."""
    return {key: release.released_at for release in read_releases(lake)
            for key in (release.keys or tuple(row_key(i) for i in release.rows))}


def released_at(done: dict[str, datetime], row: QuarantineRow) -> datetime | None:
    """When a done release (`released_ids`) landed `row`, None if none did."""
    return done.get(row.key, done.get(row_key(row.id)))


def moved_ids(lake: Path) -> dict[str, str]:
    """The key of every row a release quarantined again instead of landing it (`Release.
    moved_to`) -> the new row's id; ask with `moved_to`. Such a row is in `released_ids`
    too (the ledger marks it done), and is listed `moved_to` the new row, not `released`."""
    return {key: new for release in read_releases(lake) if release.moved_to
            for key, new in zip(release.keys or tuple(row_key(i) for i in release.rows),
                                release.moved_to, strict=True)}


def moved_to(moved: dict[str, str], row: QuarantineRow) -> str | None:
    """The id `row` was quarantined again as (`moved_ids`), None if it was not."""
    return moved.get(row.key, moved.get(row_key(row.id)))
