"""jobs.rank_stream: ranks counted across batch boundaries equal ranks of the whole list.

The engine cuts its sorted stream into batches anywhere: inside a board-window, inside a run
of tied keys, at a batch of one row. The oracle ranks each board-window on its own in plain
Python (shared: 1 + rows with a larger key; earliest: the position).
"""

from __future__ import annotations

import gc
import itertools
import threading
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobs.rank_stream import CODED_SCHEMA, RANKED_SCHEMA, prefetched, rank_stream


@st.composite
def _streams(draw: st.DrawFn) -> dict[str, Any]:
    windows = draw(st.integers(1, 4))
    earliest = draw(st.lists(st.booleans(), min_size=windows, max_size=windows))
    rows = []
    for bw in range(1, windows + 1):
        keys = draw(st.lists(st.integers(-3, 3), max_size=12))
        players = draw(st.permutations(range(1, 13)))[:len(keys)]
        rows += [(bw, k, p) for k, p in zip(keys, players, strict=False)]
    rows.sort(key=lambda r: (r[0], -r[1], r[2]))
    cuts = sorted(draw(st.sets(st.integers(1, max(len(rows) - 1, 1)), max_size=6)))
    return {"windows": windows, "earliest": earliest, "rows": rows, "cuts": cuts}


def _reader(rows: list[tuple[int, int, int]], cuts: list[int]) -> pa.RecordBatchReader:
    schema = pa.schema([("bw", pa.int32()), ("pc", pa.int32()), ("score", pa.int64()),
                        ("sort_key", pa.int64()), ("matches", pa.int64()),
                        ("reached_us", pa.int64()),
                        ("first_event_at", pa.timestamp("us", tz="UTC")),
                        ("last_us", pa.int64()), ("mc", pa.int32())])
    n = len(rows)
    table = pa.table({
        "bw": pa.array([r[0] for r in rows], pa.int32()),
        "pc": pa.array([r[2] for r in rows], pa.int32()),
        "score": pa.array([r[1] * 10 for r in rows], pa.int64()),
        "sort_key": pa.array([r[1] for r in rows], pa.int64()),
        "matches": pa.array([1] * n, pa.int64()),
        "reached_us": pa.array([5] * n, pa.int64()),
        "first_event_at": pa.array([0] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        "last_us": pa.array([7] * n, pa.int64()),
        "mc": pa.array([1 + i % 2 for i in range(n)], pa.int32()),
    }, schema=schema)
    bounds = [0, *[c for c in cuts if c < n], n]
    batches = [b for start, end in itertools.pairwise(bounds)
               for b in table.slice(start, end - start).to_batches()]
    return pa.RecordBatchReader.from_batches(schema, batches)


@given(_streams())
def test_ranks_across_batches_equal_ranks_of_each_window(stream: dict[str, Any]) -> None:
    rows, windows, earliest = stream["rows"], stream["windows"], stream["earliest"]
    totals = [sum(1 for r in rows if r[0] == bw) for bw in range(1, windows + 1)]
    reader = rank_stream(
        _reader(rows, stream["cuts"]),
        boards=pa.chunked_array([pa.array([f"b{bw}" for bw in range(1, windows + 1)])]),
        window_ids=pa.chunked_array([pa.array([f"daily:{bw}" for bw in range(1, windows + 1)])]),
        earliest=pa.chunked_array([pa.array(earliest)]),
        totals=pa.array(totals, pa.int64()),
        players=pa.chunked_array([pa.array([f"p{i:02d}" for i in range(1, 13)])]),
        matches=pa.chunked_array([pa.array(["m1", "m2"])]))
    got = reader.read_all()
    assert got.schema == CODED_SCHEMA
    got = got.cast(RANKED_SCHEMA)
    want_rank, want_percentile = [], []
    for bw, key, player in rows:
        mine = [r for r in rows if r[0] == bw]
        if earliest[bw - 1]:
            rank = mine.index((bw, key, player)) + 1
        else:
            rank = 1 + sum(1 for r in mine if r[1] > key)
        want_rank.append(rank)
        total = totals[bw - 1]
        want_percentile.append(100.0 * (total - rank + 1) / total)
    assert got.column("rank").to_pylist() == want_rank
    assert np.array_equal(got.column("percentile").to_numpy(), np.array(want_percentile))
    assert got.column("board").to_pylist() == [f"b{r[0]}" for r in rows]
    assert got.column("window_id").to_pylist() == [f"daily:{r[0]}" for r in rows]
    assert got.column("player_id").to_pylist() == [f"p{r[2]:02d}" for r in rows]
    assert got.column("last_match_id").to_pylist() == [f"m{1 + i % 2}" for i in range(len(rows))]
    assert got.column("score").to_pylist() == [r[1] * 10 for r in rows]
    assert got.column("reached_at").to_pylist() == got.column("reached_at").cast(
        pa.int64()).cast(pa.timestamp("us", tz="UTC")).to_pylist()
    assert all(v == 5 for v in got.column("reached_at").cast(pa.int64()).to_pylist())
    assert all(v == 7 for v in got.column("last_event_at").cast(pa.int64()).to_pylist())


def _numbers(count: int, *, fail_at: int | None = None) -> pa.RecordBatchReader:
    schema = pa.schema([("n", pa.int64())])

    def batches() -> Any:
        for n in range(count):
            if n == fail_at:
                raise ValueError("the engine failed")
            yield pa.record_batch([pa.array([n], pa.int64())], schema=schema)

    return pa.RecordBatchReader.from_batches(schema, batches())


def test_prefetched_gives_every_batch_in_order() -> None:
    assert prefetched(_numbers(50)).reader.read_all().column("n").to_pylist() == list(range(50))


def test_prefetched_raises_the_producers_error_after_the_batches_before_it() -> None:
    seen: list[int] = []

    def drain() -> None:
        for batch in prefetched(_numbers(20, fail_at=12)).reader:
            seen.append(batch.column(0)[0].as_py())

    with pytest.raises(ValueError, match="the engine failed"):
        drain()
    assert seen == list(range(12))


def test_prefetched_stops_its_producer_when_the_consumer_stops() -> None:
    reader = prefetched(_numbers(1000)).reader
    first = reader.read_next_batch()
    del reader  # as when the writer fails: the stream is dropped, its producer joined
    gc.collect()
    assert first.column(0)[0].as_py() == 0
    assert not [t for t in threading.enumerate() if t.name == "standings-prefetch"]


def test_prefetched_stop_ends_its_producer_while_the_stream_is_still_held() -> None:
    """A failed writer's traceback keeps the stream alive: `stop` ends the producer all the
    same (at its next batch), and a second stop is harmless."""
    ahead = prefetched(_numbers(1000))
    first = ahead.reader.read_next_batch()
    assert first.column(0)[0].as_py() == 0
    ahead.stop()
    ahead.stop()
    assert not [t for t in threading.enumerate() if t.name == "standings-prefetch"]


def test_prefetched_stop_before_any_read_starts_nothing() -> None:
    ahead = prefetched(_numbers(10))
    ahead.stop()
    assert not [t for t in threading.enumerate() if t.name == "standings-prefetch"]
