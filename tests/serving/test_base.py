"""The compact base arrays: id lookup through the hash index, ranks, bytes per player."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

import serving.base as base_module
from serving.base import BaseBoard, _id_hash, id_hashes


@given(st.lists(st.text(min_size=0, max_size=40), max_size=50))
def test_vectorised_hashes_equal_the_scalar_hash(ids):
    got = id_hashes(pa.array(ids, pa.string()))
    assert [int(h) for h in got] == [_id_hash(i) for i in ids]


def test_hashes_of_a_sliced_array_use_its_offset():
    ids = pa.array(["a", "bb", "ccc", "dddd"], pa.string()).slice(1, 2)
    assert [int(h) for h in id_hashes(ids)] == [_id_hash("bb"), _id_hash("ccc")]


def _board(n: int, *, ordinal: bool = False) -> tuple[BaseBoard, list[str], np.ndarray]:
    rng = np.random.default_rng(7)
    keys = np.sort(rng.integers(0, n // 3 + 1, n))[::-1].astype(np.int64)
    ids = [f"p{i:09d}" for i in rng.permutation(n)]
    order = sorted(range(n), key=lambda i: (-keys[i], ids[i]))
    keys, ids = keys[order], [ids[i] for i in order]
    return BaseBoard.of(keys, pa.array(ids, pa.string()), ordinal=ordinal), ids, keys


def test_every_player_is_found_and_strangers_are_not():
    board, ids, keys = _board(5000)
    for index in range(0, 5000, 7):
        assert board.position(ids[index]) == index
        assert board.key_of(ids[index]) == keys[index]
    assert board.position("nobody") is None
    assert board.key_of("p") is None


def test_colliding_hashes_are_told_apart_by_the_id(monkeypatch):
    monkeypatch.setattr(base_module, "_id_hash", lambda _player: 5)
    monkeypatch.setattr(base_module, "id_hashes",
                        lambda ids: np.full(len(ids), 5, dtype=np.uint32))
    board, ids, _ = _board(300)
    assert [board.position(p) for p in ids] == list(range(300))
    assert board.position("nobody") is None


@pytest.mark.parametrize("ordinal", [False, True])
def test_ranks_are_competition_or_listing_order(ordinal):
    board, _, keys = _board(2000, ordinal=ordinal)
    for index in range(0, 2000, 13):
        want = index + 1 if ordinal else 1 + int(np.sum(keys > keys[index]))
        assert board.rank_at(index) == want


def test_at_most_32_bytes_resident_per_player():
    """The issue's goal, for ids of the generator's width (p + 9 digits)."""
    board, ids, _ = _board(200_000)
    board.position(ids[0])  # builds the index
    assert board.nbytes() / board.size <= 32
