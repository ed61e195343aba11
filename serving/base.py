"""The base side of the merge: one board-window of the published batch view, held in memory
as compact arrays, so a 10-million-player board costs about 30 bytes a player, not the
hundreds a Python dict of ids would.

Per player: the sort key, negated so it ascends for `searchsorted` (8 bytes); the player id in
listing order as an Arrow string array (4-byte offset + the id's bytes); and a lookup index of
32-bit id hashes, sorted, with the listing position of each (4 + 4 bytes). Score and rank are
derived from the key and the listing when asked for, not stored.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from leaderboard.batch_view import BatchView

__all__ = ["BaseBoard", "id_hashes", "load_base"]

_MULTIPLIER = np.uint64(0x100000001B3)  # FNV-1a's 64-bit prime
_OFFSET = np.uint64(0xCBF29CE484222325)
_MASK = (1 << 64) - 1


def id_hashes(ids: pa.Array) -> npt.NDArray[np.uint32]:
    """FNV-1a (64-bit, high 32 bits kept) of every id, vectorised over the Arrow buffers:
    one pass per character position, not one Python call per id."""
    ids = pc.cast(ids, pa.large_string()) if ids.type != pa.large_string() else ids
    count = len(ids)
    state = np.full(count, _OFFSET, dtype=np.uint64)
    if count == 0:
        return (state >> np.uint64(32)).astype(np.uint32)
    _, offsets_buf, data_buf = ids.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64, count=count + 1, offset=ids.offset * 8)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(
        0, np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    longest = int(lengths.max()) if count else 0
    with np.errstate(over="ignore"):
        for j in range(longest):
            live = np.flatnonzero(lengths > j)
            state[live] ^= data[starts[live] + j].astype(np.uint64)
            state[live] *= _MULTIPLIER
    return (state >> np.uint64(32)).astype(np.uint32)


def _id_hash(player: str) -> int:
    state = int(_OFFSET)
    for byte in player.encode():
        state = ((state ^ byte) * int(_MULTIPLIER)) & _MASK
    return state >> 32


@dataclass
class BaseBoard:
    """Standings of one board-window in listing order (key desc, player_id asc)."""

    negated: npt.NDArray[np.int64]  # -sort_key, ascending
    players: pa.Array  # string ids, same order
    ordinal: bool = False  # `earliest` ties: rank is the listing position
    _hashes: npt.NDArray[np.uint32] | None = None
    _slots: npt.NDArray[np.int32] | None = None

    @classmethod
    def of(cls, keys: npt.NDArray[np.int64], players: pa.Array, *,
           ordinal: bool = False) -> BaseBoard:
        """From sort keys in listing order (descending)."""
        return cls(np.negative(np.asarray(keys, dtype=np.int64)), players, ordinal)

    @property
    def size(self) -> int:
        return len(self.negated)

    def key_at(self, index: int) -> int:
        return -int(self.negated[index])

    def _index(self) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.int32]]:
        if self._hashes is None or self._slots is None:
            hashes = id_hashes(self.players)
            slots = np.argsort(hashes, kind="stable").astype(np.int32)
            self._hashes, self._slots = hashes[slots], slots
        return self._hashes, self._slots

    def position(self, player: str) -> int | None:
        """The player's listing position, or None when the base does not hold it."""
        hashes, slots = self._index()
        target = np.uint32(_id_hash(player))
        at = int(np.searchsorted(hashes, target, side="left"))
        while at < len(hashes) and hashes[at] == target:
            slot = int(slots[at])
            if self.players[slot].as_py() == player:
                return slot
            at += 1
        return None

    def key_of(self, player: str) -> int | None:
        index = self.position(player)
        return None if index is None else self.key_at(index)

    def rank_at(self, index: int) -> int:
        """The base rank of the entry at a listing position."""
        if self.ordinal:
            return index + 1
        return 1 + self.count_above(self.key_at(index))

    def count_above(self, key: int) -> int:
        """Entries with a strictly greater sort key."""
        return int(np.searchsorted(self.negated, -key, side="left"))

    def count_at_least(self, key: int) -> int:
        return int(np.searchsorted(self.negated, -key, side="right"))

    def player_at(self, index: int) -> str:
        return str(self.players[index].as_py())

    def players_in(self, start: int, stop: int) -> list[str]:
        return [str(p) for p in self.players.slice(start, max(0, stop - start)).to_pylist()]

    def nbytes(self) -> int:
        """Resident bytes of the arrays (the lookup index included once built)."""
        index = 0 if self._hashes is None or self._slots is None else (
            self._hashes.nbytes + self._slots.nbytes)
        return int(self.negated.nbytes + self.players.nbytes + index)


def load_base(view: BatchView | None, board: str, window_id: str, *,
              ordinal: bool = False) -> BaseBoard:
    """The board-window from the view (empty when the version does not have it)."""
    table = None if view is None else view.standings(board, window_id)
    if table is None or table.num_rows == 0:
        return BaseBoard.of(np.zeros(0, dtype=np.int64), pa.array([], pa.string()),
                            ordinal=ordinal)
    players = table.column("player_id")
    if isinstance(players, pa.ChunkedArray):
        players = players.combine_chunks()
    keys = np.asarray(table.column("sort_key").to_numpy(), dtype=np.int64)
    base = BaseBoard.of(keys, players, ordinal=ordinal)
    base._index()  # build now, not on the first query
    return base
