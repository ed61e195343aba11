"""Published standings as plain rows, for comparing lakes by content rather than file names."""

from __future__ import annotations

from pathlib import Path

from leaderboard.batch_view import BatchView, open_current
from leaderboard.manifest import Manifest

__all__ = ["Standings", "published_standings", "version_standings"]

#: (board, window_id) -> the standings rows in rank order, as tuples.
Standings = dict[tuple[str, str], list[tuple]]


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
