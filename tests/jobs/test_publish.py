"""jobs.publish.check_standings: a player twice in one window is refused, in any window of a
multi-window piece, wherever the second row sits; the same player in two windows is fine.
The writer does the same on a coded stream's player codes, and writes its rows as strings."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from jobs.publish import PublishError, StandingsWriter, check_standings
from jobs.rank_stream import CODED_SCHEMA, RANKED_SCHEMA


def _windows(players: list[list[str]]) -> pa.Table:
    """Rows of consecutive windows, one score each: every player of a window ties at rank 1."""
    window_ids, ids = [], []
    for number, names in enumerate(players):
        window_ids += [f"daily:2026-11-{number + 1:02d}"] * len(names)
        ids += names
    n = len(ids)
    percentile = []
    for names in players:
        percentile += [100.0] * len(names)
    return pa.table({"window_id": window_ids, "player_id": ids, "score": [5] * n,
                     "sort_key": [5] * n, "rank": [1] * n, "percentile": percentile,
                     "matches": [1] * n})


def test_the_same_player_in_two_windows_passes():
    check_standings(_windows([["a", "b"], ["b", "a", "c"]]), earliest=False, banned=set(),
                    where="t")


@pytest.mark.parametrize("players", [
    [["a", "a"]],
    [["a", "b"], ["c", "d", "c"]],
    [["x", "y", "z"], ["b"], ["q", "r", "s", "q"]],
])
def test_a_player_twice_in_one_window_is_refused(players):
    with pytest.raises(PublishError, match="a player appears twice in one window"):
        check_standings(_windows(players), earliest=False, banned=set(), where="t")


def _coded(players: list[str], codes: list[int]) -> pa.RecordBatchReader:
    """One global daily window as the DuckDB engine's coded stream (CODED_SCHEMA): every
    row ties at rank 1; player_id is `codes` into the dictionary `players`."""
    n = len(codes)
    utc = pa.timestamp("us", tz="UTC")
    batch = pa.record_batch([
        pa.DictionaryArray.from_arrays(pa.array([0] * n, pa.int32()), pa.array(["global"])),
        pa.array(["daily:2026-11-01"] * n),
        pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(players)),
        pa.array([5] * n, pa.int64()), pa.array([5] * n, pa.int64()),
        pa.array([1] * n, pa.int64()), pa.array([100.0] * n),
        pa.array([1] * n, pa.int64()), pa.array([0] * n, utc), pa.array([0] * n, utc),
        pa.array([0] * n, utc), pa.array(["m1"] * n),
    ], schema=CODED_SCHEMA)
    return pa.RecordBatchReader.from_batches(CODED_SCHEMA, [batch])


def _writer(lake: Path) -> StandingsWriter:
    return StandingsWriter(lake=lake, as_of="2026-11-01", run="r", earliest_boards=set(),
                           banned=set())


def test_a_coded_stream_writes_the_bytes_of_the_same_rows_as_strings(tmp_path: Path) -> None:
    """The writer casts the coded board and player_id to strings: the file is the one the
    same rows as plain strings give."""
    files = []
    for name, coded in (("coded", True), ("plain", False)):
        reader = _coded(["a", "b", "c"], [2, 0, 1])
        if not coded:
            table = reader.read_all().cast(RANKED_SCHEMA)
            reader = pa.RecordBatchReader.from_batches(RANKED_SCHEMA, table.to_batches())
        writer = _writer(tmp_path / name)
        assert writer.write_stream(reader) == 3
        writer.close()
        files.append(writer.paths[0].read_bytes())
    assert files[0] == files[1]


@pytest.mark.parametrize(("players", "codes"), [
    (["a", "b", "c"], [0, 2, 0]),  # one code twice
    (["a", "b", "a"], [0, 1, 2]),  # two codes of one player: the dictionary is not distinct
])
def test_a_player_twice_in_a_coded_window_is_refused(tmp_path: Path, players: list[str],
                                                     codes: list[int]) -> None:
    """The duplicate check on the stream's codes: a code twice in a window is refused, and a
    dictionary holding one player_id twice is not trusted (its strings are checked)."""
    with pytest.raises(PublishError, match="a player appears twice in one window"):
        _writer(tmp_path).write_stream(_coded(players, codes))
