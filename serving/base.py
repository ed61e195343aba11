"""The base side of the merge: one board-window of the published batch view, held in memory
as compact arrays (sort keys descending, player ids in rank order, a position index)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from leaderboard.batch_view import BatchView

__all__ = ["BaseBoard", "load_base"]


@dataclass
class BaseBoard:
    """Standings of one board-window in listing order (key desc, player_id asc)."""

    keys: npt.NDArray[np.int64]  # descending
    players: pa.Array  # string, same order
    scores: npt.NDArray[np.int64]
    ranks: npt.NDArray[np.int64]
    _position: dict[str, int] | None = None
    _negated: npt.NDArray[np.int64] | None = None

    @property
    def size(self) -> int:
        return len(self.keys)

    def position(self, player: str) -> int | None:
        if self._position is None:
            self._position = {p: i for i, p in enumerate(self.players.to_pylist())}
        return self._position.get(player)

    def key_of(self, player: str) -> int | None:
        index = self.position(player)
        return None if index is None else int(self.keys[index])

    def count_above(self, key: int) -> int:
        """Entries with a strictly greater sort key."""
        if self._negated is None:
            self._negated = -self.keys  # ascending, for searchsorted
        return int(np.searchsorted(self._negated, -key, side="left"))

    def count_at_least(self, key: int) -> int:
        if self._negated is None:
            self._negated = -self.keys
        return int(np.searchsorted(self._negated, -key, side="right"))

    def player_at(self, index: int) -> str:
        return str(self.players[index].as_py())

    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.players.nbytes + self.scores.nbytes
                   + self.ranks.nbytes)


def load_base(view: BatchView | None, board: str, window_id: str) -> BaseBoard:
    """The board-window from the view (empty when the version does not have it)."""
    table = None if view is None else view.standings(board, window_id)
    if table is None or table.num_rows == 0:
        empty = np.zeros(0, dtype=np.int64)
        return BaseBoard(empty, pa.array([], pa.string()), empty, empty)
    players = table.column("player_id")
    if isinstance(players, pa.ChunkedArray):
        players = players.combine_chunks()
    return BaseBoard(
        keys=np.asarray(table.column("sort_key").to_numpy(), dtype=np.int64),
        players=players,
        scores=np.asarray(table.column("score").to_numpy(), dtype=np.int64),
        ranks=np.asarray(table.column("rank").to_numpy(), dtype=np.int64),
    )

