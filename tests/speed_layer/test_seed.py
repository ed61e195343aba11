"""The seed of a recompute after retention (speed_layer.seed): rollup rows and raw rows as
FOLD_SCRIPT lines, summed as the batch sums them."""

from __future__ import annotations

from datetime import date

import pyarrow as pa
from lakes import registry_from

from leaderboard.schema import LANDED_SCHEMA
from leaderboard.sortkey import saturate
from speed_layer.seed import seed_updates

SUMS = {"regions": ["na"], "modes": ["ranked"], "boards": [
    {"scope": "global"},
    {"scope": "global", "name": "early", "ties": "earliest", "windows": ["all-time"]}]}


def _rollups(player: str, sums: list[int]) -> pa.Table:
    """One rollup row per event date (from 2026-11-20) of `player` with these points."""
    n = len(sums)
    at = pa.array([1_795_000_000_000_000 + i for i in range(n)], pa.timestamp("us", tz="UTC"))
    return pa.table({
        "player_id": [player] * n,
        "event_date": pa.array([date(2026, 11, 20 + i) for i in range(n)], pa.date32()),
        "region": ["na"] * n, "mode": ["ranked"] * n, "mask": pa.array([-1] * n, pa.int64()),
        "matches": pa.array([1] * n, pa.int64()), "points_sum": pa.array(sums, pa.int64()),
        "max_points": pa.array(sums, pa.int64()), "max_at": at,
        "min_points": pa.array(sums, pa.int64()), "min_at": at,
        "last_points": pa.array(sums, pa.int64()), "last_match": ["m"] * n,
        "last_event_at": at})


def test_a_seed_sums_a_players_rollup_rows_before_it_saturates_once():
    """FOLD_SCRIPT clamps a sum at each line it applies, and the seed sent one line per
    rollup row: rows of L+5 and -10 points gave L-10 on the live boards where the batch,
    which sums every row first and saturates once, serves L-5. Now a sum board's seed is one
    line per (board-window, player), saturated once: for both tie policies, at the limit."""
    registry = registry_from(SUMS)
    for name in ("global", "early"):
        board = registry.board(name)
        limit = registry.layout(board, "all-time").limit
        updates = [u for u in seed_updates(LANDED_SCHEMA.empty_table(),
                                           _rollups("ann", [limit + 5, -10]), registry)
                   if u.board.name == name and u.window.kind == "all-time"]
        assert len(updates) == 1
        assert updates[0].players.to_pylist() == ["ann"]  # one line
        assert int(updates[0].values[0][0].as_py()) == saturate(limit + 5 - 10, limit)
        assert saturate(saturate(limit + 5, limit) - 10, limit) == limit - 10  # per line
