"""Write a batch version beside the live one, check it, and publish it atomically.

Standings arrive from an engine as one stream ordered by (board, window_id, rank,
player_id). They are cut into one file per (board, window kind) per run, holding every window
of that kind the run built, and checked on the way, vectorised over many windows at a time
(ranks contiguous with the right ties, percentiles, no banned player, no player twice), so a
version that fails a check is never published. An index (one row per board-window: which
file, how many rows) goes beside the manifest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jobs.spec import HISTOGRAM_SCHEMA, STANDINGS_SCHEMA
from leaderboard.lake import ROW_GROUP_SIZE, fsync_dir
from leaderboard.manifest import read_current

__all__ = [
    "FILE_SCHEMA",
    "HISTOGRAM_FILE_SCHEMA",
    "IndexEntry",
    "PublishError",
    "RewindRefused",
    "StandingsWriter",
    "check_standings",
    "not_published",
    "seal",
    "window_runs",
]

#: A standings file holds every window of one board and window kind built by one run,
#: ordered by (window_id, rank, player_id); readers prune row groups by window_id statistics.
FILE_SCHEMA = pa.schema([pa.field("window_id", pa.string()), *STANDINGS_SCHEMA])
HISTOGRAM_FILE_SCHEMA = pa.schema([pa.field("window_id", pa.string()), *HISTOGRAM_SCHEMA])
_FLUSH_ROWS = 1_000_000


class PublishError(RuntimeError):
    """A version failed a check; it is not published and the old one stays live."""


def not_published(lake: Path, as_of: date, error: PublishError) -> str:
    """The sentence an operator reads when a night's version failed one of its own checks:
    what failed, that readers are unharmed (the live version stays), and what to do next."""
    live = read_current(lake)
    served = f"the live version {live.version} is unchanged" if live else "nothing is live yet"
    return (f"the batch as of {as_of} did not publish: {error}. Readers are unaffected "
            f"({served}). Accepted input should never fail this check: keep the data dir "
            "as it is, report the message with the batch's log, and run the night again "
            f"(`leaderboard batch --as-of {as_of}`) once it is fixed")


class RewindRefused(PublishError):
    """Publishing would move `current.json` back to an earlier night than the live one."""

    @classmethod
    def check(cls, lake: Path, as_of: date) -> None:
        """Raise unless a version as of `as_of` may go live without moving the pointer back
        (a rerun of the live night is fine). The DAG's publish keeps the later version."""
        live = read_current(lake)
        if live is not None and live.as_of_date > as_of:
            raise cls(
                f"the live version {live.version} is as of {live.as_of}; publishing one as of "
                f"{as_of} would move manifests/current.json back in time, and every reader "
                f"with it. Rerun with --allow-rewind if that is what you want, or use another "
                f"data dir (--data) for an old night or another data set")


def _np(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    return np.asarray(array.to_numpy(zero_copy_only=False))


def window_runs(keys: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """Start offsets and lengths of runs of equal values in an ordered column."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    n = len(keys)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    same = _np(pc.equal(keys.slice(1), keys.slice(0, n - 1))).astype(bool)
    starts = np.concatenate([[0], np.flatnonzero(~same) + 1]).astype(np.int64)
    lengths = np.diff(np.concatenate([starts, [n]])).astype(np.int64)
    return starts, lengths


def check_standings(table: pa.Table, *, earliest: bool, banned: set[str], where: str,
                    player_codes: np.ndarray | None = None, players: int = 0) -> None:
    """The invariants of one or more whole board-windows (rows with a `window_id` column,
    or one window without it); raises PublishError naming the first break.

    `player_codes`: each row's player as a code below `players`, one code per distinct
    player_id (the writer's from a dictionary-encoded stream, whose dictionary it checked
    distinct); without them the player_id strings are encoded here."""
    n = table.num_rows
    if n == 0:
        return
    windows = (table.column("window_id") if "window_id" in table.column_names
               else pa.array(np.zeros(n, dtype=np.int8)))
    starts, lengths = window_runs(windows)
    window_of = np.repeat(np.arange(len(starts)), lengths)
    first = starts[window_of]
    position = np.arange(n) - first + 1
    keys = _np(table.column("sort_key")).astype(np.int64)
    ranks = _np(table.column("rank")).astype(np.int64)
    new_window = position == 1
    if np.any((np.diff(keys) > 0) & ~new_window[1:]):
        bad = int(np.flatnonzero((np.diff(keys) > 0) & ~new_window[1:])[0]) + 1
        raise PublishError(f"{where} {_window_name(windows, bad)}: rows are not ordered by "
                           "sort_key descending")
    if earliest:
        expected = position
    else:
        new_key = new_window.copy()
        new_key[1:] |= keys[1:] != keys[:-1]
        marker = np.maximum.accumulate(np.where(new_key, np.arange(n), 0))
        expected = marker - first + 1
    if not np.array_equal(ranks, expected):
        bad = int(np.flatnonzero(ranks != expected)[0])
        raise PublishError(f"{where} {_window_name(windows, bad)}: rank {ranks[bad]} at "
                           f"position {position[bad]} should be {expected[bad]}")
    total = lengths[window_of]
    percentile = _np(table.column("percentile")).astype(np.float64)
    if not np.allclose(percentile, 100.0 * (total - ranks + 1) / total, rtol=0, atol=1e-9):
        raise PublishError(f"{where}: percentiles do not match 100 * (total - rank + 1) / total")
    # Distinct (window, player) pairs as integers: the player's dictionary code beside the
    # window's number (a sort of integers; several times cheaper than grouping strings).
    if player_codes is None:
        encoded = pc.dictionary_encode(table.column("player_id")).combine_chunks()
        player_codes, players = _np(encoded.indices), len(encoded.dictionary)
    codes = np.asarray(player_codes, dtype=np.int64)
    pairs = np.sort(window_of.astype(np.int64) * max(players, 1) + codes)
    # Sorted, a repeat is a neighbour (np.unique finds the same by hashing: ~25x slower on
    # numpy 2.4, a third of the writer's CPU).
    if np.any(pairs[1:] == pairs[:-1]):
        raise PublishError(f"{where}: a player appears twice in one window")
    if banned and pc.any(pc.is_in(table.column("player_id"),
                                  value_set=pa.array(sorted(banned)))).as_py():
        raise PublishError(f"{where}: a banned player is in the standings")


def _distinct(values: pa.Array) -> bool:
    """Whether no value repeats: strictly ascending (the engine's player dictionary, in
    player_id order: one pass of comparisons), else by hashing."""
    n = len(values)
    if n < 2:
        return True
    if pc.all(pc.less(values.slice(0, n - 1), values.slice(1)), skip_nulls=False).as_py():
        return True
    return len(pc.unique(values)) == n


def _codes_or_values(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A dictionary column's codes (its runs are the values' runs when the dictionary is
    distinct, as a coded stream's board dictionary is), else the column."""
    if not pa.types.is_dictionary(column.type):
        return column
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return column.indices


def _window_name(windows: pa.Array | pa.ChunkedArray, index: int) -> str:
    value = windows[index].as_py()
    return value if isinstance(value, str) else ""


def _kind(window_id: str) -> str:
    return window_id.split(":", 1)[0]


class IndexEntry(NamedTuple):
    """One board-window the writer wrote: a row of the version's standings index."""

    board: str
    window_id: str
    path: str  # relative to the lake
    rows: int
    score_total: int


@dataclass
class StandingsWriter:
    """Cuts an ordered standings stream into checked files, one per (board, window kind).

    Files are written in place (not temp + rename): no reader can see them until the
    manifest that names them is published, and `seal()` makes them durable first.
    """

    lake: Path
    as_of: str
    run: str
    earliest_boards: set[str]
    banned: set[str]
    #: one entry per board-window written
    entries: list[IndexEntry] = field(default_factory=list)
    histogram_entries: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)
    paths: list[Path] = field(default_factory=list)
    _group: tuple[str, str] | None = None
    _writer: pq.ParquetWriter | None = None
    _target: Path | None = None
    _buffer: list[pa.Table] = field(default_factory=list)
    #: each buffered part's player codes (None: its player_id was not dictionary-encoded)
    _codes: list[np.ndarray | None] = field(default_factory=list)
    _buffered: int = 0
    #: the player dictionaries found distinct (by buffer address and length), and the
    #: one the buffered codes refer to with its size
    _distinct: set[tuple[int, ...]] = field(default_factory=set)
    _dictionary: tuple[tuple[int, ...], int] | None = None
    _seen: set[tuple[str, str]] = field(default_factory=set)

    def path(self, kind: str, board: str, window_kind: str) -> Path:
        return (self.lake / kind / f"as_of={self.as_of}" / f"board={board}"
                / f"window={window_kind}" / f"part-{self.run}.parquet")

    def write_stream(self, reader: pa.RecordBatchReader) -> int:
        """Consume the ordered stream; returns rows written."""
        rows = 0
        for batch in reader:
            if batch.num_rows == 0:
                continue
            starts, lengths = window_runs(_codes_or_values(
                batch.column(batch.schema.get_field_index("board"))))
            for start, length in zip(starts.tolist(), lengths.tolist(), strict=True):
                piece = pa.Table.from_batches([batch.slice(start, length)])
                board = piece.column("board")[0].as_py()
                kinds = pc.utf8_slice_codeunits(piece.column("window_id"), 0, 3)
                k_starts, k_lengths = window_runs(kinds)
                for k_start, k_length in zip(k_starts.tolist(), k_lengths.tolist(),
                                             strict=True):
                    part = piece.slice(k_start, k_length)
                    self._add(board, _kind(part.column("window_id")[0].as_py()), part)
                    rows += k_length
        self._finish_group()
        return rows

    def _add(self, board: str, window_kind: str, part: pa.Table) -> None:
        if self._group != (board, window_kind):
            self._finish_group()
            if (board, window_kind) in self._seen:
                raise PublishError(f"{board} {window_kind}: standings stream is not ordered "
                                   "by board-window")
            self._seen.add((board, window_kind))
            self._group = (board, window_kind)
            self._target = self.path("standings", board, window_kind)
            self._target.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(self._target, FILE_SCHEMA, compression="zstd")
            self.paths.append(self._target)
        self._codes.append(self._player_codes(part.column("player_id")))
        self._buffer.append(part.select(FILE_SCHEMA.names).cast(FILE_SCHEMA))
        self._buffered += part.num_rows
        if self._buffered >= _FLUSH_ROWS:
            self._flush(final=False)

    def _player_codes(self, column: pa.ChunkedArray) -> np.ndarray | None:
        """A dictionary-encoded player_id's codes, once its dictionary is known to hold
        distinct players (checked once per dictionary); None for strings, or when the
        dictionary is not the one the buffered codes refer to (they would not compare)."""
        if not pa.types.is_dictionary(column.type) or column.num_chunks != 1:
            return None
        chunk = column.chunk(0)
        dictionary = chunk.dictionary
        key = (len(dictionary), *(b.address if b is not None else 0
                                  for b in dictionary.buffers()))
        if key not in self._distinct:
            if not _distinct(dictionary):
                return None
            self._distinct.add(key)
        if self._codes and self._dictionary is not None and self._dictionary[0] != key:
            return None
        self._dictionary = (key, len(dictionary))
        return _np(chunk.indices)

    def _flush(self, *, final: bool) -> None:
        """Check and write the buffered rows, up to the last window boundary (all if final)."""
        if not self._buffer:
            return
        table = pa.concat_tables(self._buffer)
        codes = (np.concatenate([c for c in self._codes if c is not None])
                 if self._dictionary is not None and all(c is not None for c in self._codes)
                 else None)
        keep = table.slice(0, 0)
        if not final:
            starts, _ = window_runs(table.column("window_id"))
            cut = int(starts[-1])  # the last window may continue in the next batch
            table, keep = table.slice(0, cut), table.slice(cut)
        self._buffer = [keep] if keep.num_rows else []
        self._codes = [codes[table.num_rows:]] if keep.num_rows and codes is not None else (
            [None] if keep.num_rows else [])
        self._buffered = keep.num_rows
        if table.num_rows == 0:
            return
        assert self._group is not None
        assert self._writer is not None
        assert self._target
        board = self._group[0]
        check_standings(table, earliest=board in self.earliest_boards, banned=self.banned,
                        where=board,
                        player_codes=None if codes is None else codes[:table.num_rows],
                        players=self._dictionary[1] if self._dictionary is not None else 0)
        self._writer.write_table(table, row_group_size=ROW_GROUP_SIZE)
        starts, lengths = window_runs(table.column("window_id"))
        totals = np.add.reduceat(_np(table.column("score")).astype(np.int64), starts)
        relative = str(self._target.relative_to(self.lake))
        for start, length, total in zip(starts.tolist(), lengths.tolist(), totals.tolist(),
                                        strict=True):
            window_id = table.column("window_id")[start].as_py()
            self.entries.append(IndexEntry(board, window_id, relative, length, int(total)))

    def _finish_group(self) -> None:
        self._flush(final=True)
        if self._writer is not None:
            self._writer.close()
        self._writer = None
        self._group = None

    def write_empty(self, missing: list[tuple[str, str]]) -> None:
        """Windows open on as_of without data: entries with no rows, in a file of their own."""
        by_group: dict[tuple[str, str], list[str]] = {}
        for board, window_id in missing:
            by_group.setdefault((board, _kind(window_id)), []).append(window_id)
        for (board, window_kind), window_ids in sorted(by_group.items()):
            target = self.path("standings", board, window_kind)
            if (board, window_kind) not in self._seen:
                target.parent.mkdir(parents=True, exist_ok=True)
                pq.write_table(FILE_SCHEMA.empty_table(), target, compression="zstd")
                self.paths.append(target)
                self._seen.add((board, window_kind))
            relative = str(target.relative_to(self.lake))
            self.entries.extend(IndexEntry(board, w, relative, 0, 0) for w in window_ids)

    def write_histograms(self, histograms: pa.Table) -> None:
        """One histogram file per (board, window kind); depth buckets must hold every player."""
        histograms = histograms.sort_by([("board", "ascending"), ("window_id", "ascending"),
                                         ("kind", "ascending"), ("bucket", "ascending")])
        depth = histograms.filter(pc.equal(histograms.column("kind"), "depth"))
        counted = depth.group_by(["board", "window_id"]).aggregate([("players", "sum")])
        players = {(b, w): p for b, w, p in zip(counted.column("board").to_pylist(),
                                                counted.column("window_id").to_pylist(),
                                                counted.column("players_sum").to_pylist(),
                                                strict=True)}
        for entry in self.entries:
            board, window_id, rows = entry.board, entry.window_id, entry.rows
            if players.get((board, window_id), 0) != rows:
                raise PublishError(f"{board} {window_id}: depth histogram holds "
                                   f"{players.get((board, window_id), 0)} players, "
                                   f"standings {rows}")
        groups = pc.binary_join_element_wise(
            histograms.column("board"), pc.utf8_slice_codeunits(histograms.column("window_id"),
                                                                0, 3), "\x00")
        starts, lengths = window_runs(groups)
        written: set[tuple[str, str]] = set()
        for start, length in zip(starts.tolist(), lengths.tolist(), strict=True):
            part = histograms.slice(start, length)
            board = part.column("board")[0].as_py()
            window_kind = _kind(part.column("window_id")[0].as_py())
            target = self.path("histograms", board, window_kind)
            target.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(part.select(HISTOGRAM_FILE_SCHEMA.names).cast(HISTOGRAM_FILE_SCHEMA),
                           target, compression="zstd")
            self.paths.append(target)
            written.add((board, window_kind))
            w_starts, w_lengths = window_runs(part.column("window_id"))
            relative = str(target.relative_to(self.lake))
            for w_start, w_length in zip(w_starts.tolist(), w_lengths.tolist(), strict=True):
                self.histogram_entries[(board, part.column("window_id")[w_start].as_py())] = (
                    relative, w_length)
        for entry in self.entries:
            board, window_id = entry.board, entry.window_id
            if (board, window_id) in self.histogram_entries:
                continue
            window_kind = _kind(window_id)
            target = self.path("histograms", board, window_kind)
            if (board, window_kind) not in written:
                target.parent.mkdir(parents=True, exist_ok=True)
                pq.write_table(HISTOGRAM_FILE_SCHEMA.empty_table(), target, compression="zstd")
                self.paths.append(target)
                written.add((board, window_kind))
            self.histogram_entries[(board, window_id)] = (str(target.relative_to(self.lake)), 0)

    def close(self) -> None:
        self._finish_group()


def seal(paths: list[Path]) -> None:
    """Make freshly written version files durable before a manifest names them."""
    for path in paths:
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
    for folder in sorted({p.parent for p in paths}):
        fsync_dir(folder)
