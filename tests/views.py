"""Published standings as plain rows, for comparing lakes by content rather than file names."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from leaderboard.batch_view import BatchView, open_current
from leaderboard.manifest import Manifest
from serving.service import Leaderboards

__all__ = ["Ranked", "Standings", "live_ranked", "published_standings", "version_standings"]

#: (board, window_id) -> the standings rows in rank order, as tuples.
Standings = dict[tuple[str, str], list[tuple]]


#: (board, window_id) -> [(player_id, score, rank)] in rank order.
Ranked = dict[tuple[str, str], list[tuple[str, int, int]]]


def live_ranked(served: Leaderboards, windows: Iterable[tuple[str, str]]) -> Ranked:
    """Every player's score and rank the serving layer answers (base merged with the speed
    layer) in these board-windows."""
    found: Ranked = {}
    for board, window_id in windows:
        merged = served.merged(board, window_id)
        found[(board, window_id)] = [(e.player_id, e.score, e.rank)
                                     for e in merged.top(merged.total() + 1)]
    return found


def version_standings(lake: Path, manifest: Manifest) -> Standings:
    """Every board-window of one written version."""
    view = BatchView(lake, manifest)
    found: Standings = {}
    for board, window_id in view.windows():
        table = view.standings(board, window_id)
        assert table is not None
        found[(board, window_id)] = [tuple(r.values()) for r in table.to_pylist()]
    return found


def published_standings(lake: Path) -> Standings:
    """Every board-window of the live version."""
    view = open_current(lake)
    assert view is not None, f"no published version under {lake}"
    return version_standings(lake, view.manifest)
