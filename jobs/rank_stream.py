"""Rank an ordered stream of integer-coded standings and give its strings back.

The DuckDB engine sorts (board-window, player) rows once, by (bw, sort_key desc, pc), with
integer codes only: sorting or carrying the strings (board, window id, player id, match id)
through that sort cost more than the sort itself. Ranks are then positions in the stream, so
they are counted here, batch by batch, and the strings are looked up by code with Arrow
`take` on the way out. The stream's consumer (jobs.publish) checks every rank again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from jobs.spec import STANDINGS_SCHEMA
from leaderboard.read_ahead import read_ahead

__all__ = ["CODED_SCHEMA", "RANKED_SCHEMA", "Prefetched", "prefetched", "rank_stream"]

#: The rows the engine hands the writer: a standings row with its board-window.
RANKED_SCHEMA = pa.schema([pa.field("board", pa.string()), pa.field("window_id", pa.string()),
                           *STANDINGS_SCHEMA])

_CODED = pa.dictionary(pa.int32(), pa.string())

#: RANKED_SCHEMA as `rank_stream` gives it: board and player_id dictionary-encoded over the
#: distinct boards and the run's distinct players (the codes the engine sorted by). The
#: writer (jobs.publish) casts them to strings on the way into the file, and checks a
#: player appearing twice in a window on the codes instead of hashing every string again.
CODED_SCHEMA = pa.schema([pa.field("board", _CODED), RANKED_SCHEMA.field("window_id"),
                          pa.field("player_id", _CODED), *list(STANDINGS_SCHEMA)[1:]])


class _Carry:
    """Where the previous batch stopped: its last board-window and sort key, that row's
    position in its board-window and its shared rank."""

    def __init__(self) -> None:
        self.bw = -1
        self.key = 0
        self.position = 0
        self.shared = 0


def _positions(bw: np.ndarray, key: np.ndarray, carry: _Carry) -> tuple[np.ndarray, np.ndarray]:
    """(position in its board-window, shared rank) of each row, 1-based, continuing from
    `carry` (updated): a shared rank is the position of the first row with the same key."""
    n = len(bw)
    index = np.arange(n, dtype=np.int64)
    previous_bw = np.concatenate([[carry.bw], bw[:-1]])
    previous_key = np.concatenate([[carry.key], key[:-1]])
    new_window = bw != previous_bw
    new_key = new_window | (key != previous_key)
    window_start = np.maximum.accumulate(np.where(new_window, index, -1))
    position = np.where(window_start >= 0, index - window_start + 1, carry.position + index + 1)
    key_start = np.maximum.accumulate(np.where(new_key, index, -1))
    shared = np.where(key_start >= 0, position[np.maximum(key_start, 0)], carry.shared)
    carry.bw, carry.key = int(bw[-1]), int(key[-1])
    carry.position, carry.shared = int(position[-1]), int(shared[-1])
    return position, shared


def _codes(column: pa.Array) -> pa.Array:
    """1-based codes as 0-based take indices; code 0 (none) is a null."""
    codes = np.asarray(column.to_numpy(), dtype=np.int64)
    return pa.array(codes - 1, mask=codes == 0)


def _ranked(batches: pa.RecordBatchReader, *, board_of: np.ndarray, boards: pa.Array,
            window_ids: pa.Array, earliest: np.ndarray, totals: np.ndarray, players: pa.Array,
            matches: pa.Array) -> Iterator[pa.RecordBatch]:
    carry = _Carry()
    timestamp = STANDINGS_SCHEMA.field("reached_at").type
    for batch in batches:
        if batch.num_rows == 0:
            continue
        bw = np.asarray(batch.column("bw").to_numpy(), dtype=np.int64) - 1
        key = np.asarray(batch.column("sort_key").to_numpy(), dtype=np.int64)
        position, shared = _positions(bw, key, carry)
        rank = np.where(earliest[bw], position, shared)
        total = totals[bw]
        percentile = 100.0 * (total - rank + 1).astype(np.float64) / total
        player = np.asarray(batch.column("pc").to_numpy(), np.int64) - 1
        yield pa.RecordBatch.from_arrays([
            pa.DictionaryArray.from_arrays(pa.array(board_of[bw]), boards),
            window_ids.take(pa.array(bw)),
            pa.DictionaryArray.from_arrays(pa.array(player.astype(np.int32)), players),
            batch.column("score"), batch.column("sort_key"), pa.array(rank),
            pa.array(percentile), batch.column("matches"),
            batch.column("reached_us").cast(timestamp),
            batch.column("first_event_at").cast(timestamp),
            batch.column("last_us").cast(timestamp),
            matches.take(_codes(batch.column("mc"))),
        ], schema=CODED_SCHEMA)


def rank_stream(batches: pa.RecordBatchReader, *, boards: pa.ChunkedArray,
                window_ids: pa.ChunkedArray, earliest: pa.ChunkedArray, totals: pa.Array,
                players: pa.ChunkedArray, matches: pa.ChunkedArray) -> pa.RecordBatchReader:
    """Standings rows (CODED_SCHEMA) from `batches` ordered by (bw, sort_key desc, pc) with
    columns bw, pc, score, sort_key, matches, reached_us, first_event_at, last_us, mc.

    Codes are 1-based: bw indexes `boards`, `window_ids`, `earliest` (that board ranks ties
    by position, not shared) and `totals` (its player count); pc indexes `players` (distinct,
    the dictionary of the player_id column), mc `matches` (0: no match, a null).
    percentile = 100 * (total - rank + 1) / total, in float64 as SQL computes it.
    """
    names = boards.combine_chunks()
    distinct, board_of = np.unique(np.asarray(names.to_numpy(zero_copy_only=False), dtype=object),
                                   return_inverse=True)
    return pa.RecordBatchReader.from_batches(CODED_SCHEMA, _ranked(
        batches, board_of=board_of.astype(np.int32), boards=pa.array(distinct, pa.string()),
        window_ids=window_ids.combine_chunks(),
        earliest=np.asarray(earliest.combine_chunks().to_numpy(zero_copy_only=False),
                            dtype=bool),
        totals=np.asarray(totals.to_numpy(zero_copy_only=False), dtype=np.int64),
        players=players.combine_chunks(), matches=matches.combine_chunks()))


#: Batches `prefetched` keeps ready ahead of its consumer (each up to 256k rows).
_AHEAD = 4


@dataclass(frozen=True)
class Prefetched:
    """A stream read ahead (`prefetched`): its batches, and `stop`, which ends the producer
    (at its next batch) and waits for it; idempotent."""

    reader: pa.RecordBatchReader
    stop: Callable[[], None]


def prefetched(reader: pa.RecordBatchReader) -> Prefetched:
    """`reader`'s batches, produced by a thread of their own up to `_AHEAD` batches ahead of
    the consumer (leaderboard.read_ahead): the engine's sort of the next part and the ranking
    run while the writer compresses the previous rows, instead of each waiting for the other.
    A consumer that stops early (a failed writer) calls `stop`, so the producer does not go
    on running the engine's query."""
    ahead = read_ahead(reader, name="standings-prefetch", depth=_AHEAD)
    return Prefetched(pa.RecordBatchReader.from_batches(reader.schema, ahead.items), ahead.stop)
