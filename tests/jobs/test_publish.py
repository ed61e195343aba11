"""jobs.publish.check_standings: a player twice in one window is refused, in any window of a
multi-window piece, wherever the second row sits; the same player in two windows is fine."""

from __future__ import annotations

import pyarrow as pa
import pytest

from jobs.publish import PublishError, check_standings


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
