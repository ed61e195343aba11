"""The CLI's chart (`leaderboard report`): its top-x% cut-offs are the percentiles route's,
on either order, and a heavy tail gets a log score axis."""

from __future__ import annotations

import copy
from datetime import UTC, date, datetime, timedelta

import pytest
from lakes import EXOTIC, land, write_registry

from jobs.batch import run_batch
from jobs.report import score_distribution_png
from leaderboard.manifest import read_current
from leaderboard.settings import Settings
from serving.service import Leaderboards
from speed_layer.service import SpeedLayer

pytestmark = pytest.mark.redis

_AS_OF = date(2026, 12, 2)
_AT = datetime(2026, 12, 2, 10, tzinfo=UTC)


def _event(player: str, points: int, region: str) -> dict:
    return {"match_id": f"m-{player}", "player_id": player, "points": points,
            "event_time": _AT, "region": region, "mode": "ranked", "server_id": "s1",
            "ingested_at": _AT + timedelta(minutes=5)}


@pytest.fixture
def published(redis_client, tmp_path):
    """One event per player, published as of 2026-12-02: na players score 100..349 (the
    `asc` board worst:na holds them alone), eu players 1..20 and five of them 50,000 (global
    holds all 500: a heavy tail). Yields (settings, the serving layer on that version)."""
    raw = copy.deepcopy(EXOTIC)
    raw["board_defaults"] = {"min_points": 0, "max_points": 100_000}
    write_registry(tmp_path / "registry.toml", raw)
    settings = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path),
                                  "LEADERBOARD_CONFIG": str(tmp_path / "registry.toml")})
    events = [_event(f"na{i:03d}", 100 + (i * 37) % 250, "na") for i in range(250)]
    events += [_event(f"eu{i:03d}", 50_000 if i < 5 else 1 + i % 20, "eu") for i in range(250)]
    land(settings.lake_dir, settings.registry, events)
    run_batch(settings, _AS_OF)
    SpeedLayer(redis_client, settings.registry, settings.lake_dir).rebase(
        read_current(settings.lake_dir))
    boards = Leaderboards(settings.lake_dir, settings.registry, redis_client,
                          now=lambda: _AT + timedelta(days=1))
    return settings, boards


#: (board, the chart's labels, the route's scores for the top 1/10/50 %, players, log axis)
_CASES = {
    # worst:na (lower is better), 250 players scoring 100..349: the top 1% takes rank
    # ceil(2.5) = 3, a score of 102 or less (it said 'from 100', the single best), the top
    # 10% rank 25 (124), the top 50% rank 125 (224); no heavy tail: a linear axis.
    "asc": ("worst:na", ["top 1%: 102 or less (rank 3)", "top 10%: 124 or less (rank 25)",
                         "top 50%: 224 or less (rank 125)"], [102, 124, 224], 250, False),
    # global, 500 players: five at 50,000, then 349..100, then 20..1. The top score is 10x
    # the median (105) and more, the console's rule for a log score axis.
    "heavy desc": ("global", ["top 1%: 50,000 or more (rank 5)",
                              "top 10%: 305 or more (rank 50)",
                              "top 50%: 105 or more (rank 250)"], [50_000, 305, 105], 500, True),
}


@pytest.mark.parametrize("case", list(_CASES))
def test_the_charts_cut_offs_are_the_routes_and_a_heavy_tail_gets_a_log_axis(
        published, tmp_path, case):
    """The chart marks the score at rank ceil(x/100 * players) for the top 1%, 10% and 50%,
    on an `asc` board too, as the percentiles route answers; a board whose top score is 10x
    its median or more is drawn on a log score axis."""
    board, marks, route, players, log_scale = _CASES[case]
    settings, boards = published
    chart = score_distribution_png(settings.lake_dir, settings.registry.board(board),
                                   "all-time", _AS_OF, tmp_path / "chart.png")
    assert chart.marks == marks
    assert [row["score"] for row in
            boards.percentiles(board, "all-time", tops=[1, 10, 50])["top_percent"]] == route
    assert (chart.players, chart.log_scale) == (players, log_scale)
    assert chart.path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
