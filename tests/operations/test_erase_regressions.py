"""Defects the stateful model's erase rule found, replayed as fixed sequences of its rules
(tests/operations/test_stateful_model.py), each checked against the model after every step."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from operations.test_stateful_model import OperationsMachine

pytestmark = pytest.mark.redis


class _Draws:
    """What `data.draw` returns, in order (the example's draws)."""

    def __init__(self, *values: Any) -> None:
        self.values = list(values)

    def draw(self, _strategy: Any) -> Any:
        return self.values.pop(0)


def test_a_ban_before_the_new_watermark_stays_out_after_an_erasure_and_retention(
        redis_server: Any) -> None:
    """Regression: after an erasure, a retention and the next rebase, a player banned before
    the new watermark was put in a window's touched set T although the new base leaves them
    out (the ban read their key from an earlier version's standings file that the new
    version still names for other windows), so that window's total was one short (top:
    total 0 with one entry). Now only the file the index names for a board-window counts."""
    m = OperationsMachine(redis_server.url)
    try:
        steps = [
            lambda: m.nightly_batch_and_rebase(full=True) if m._next_as_of() else None,
            m.retention_night, m.compaction_night,
            lambda: m.time_passes(hours=4, minutes=0),
            lambda: m.same_retry_at_two_writers_at_once(matches=[
                {"region": "na", "mode": "casual", "age_minutes": 833,
                 "players": [("cy", 3), ("dee", 2), ("bob", -1)]},
                {"region": "eu", "mode": "casual", "age_minutes": 196, "players": [("cy", 5)]}]),
            lambda: m.erase_a_player(data=_Draws("cy"), writer="b"),
            lambda: setattr(m, "now", m.now + timedelta(days=3)),
            lambda: m.redis_loses_everything_while_ingest_goes_on(matches=[
                {"region": "na", "mode": "casual", "age_minutes": 13,
                 "players": [("ann", -1), ("dee", 20)]}], retry=True, writer="b"),
            lambda: m.moderate(action="unban", player="cy"),
            lambda: m.time_passes(hours=10, minutes=30),
            lambda: m.same_retry_at_two_writers_at_once(matches=[
                {"region": "eu", "mode": "casual", "age_minutes": 54,
                 "players": [("bob", 5), ("dee", 2)]},
                {"region": "na", "mode": "casual", "age_minutes": 120,
                 "players": [("bob", 0), ("ann", 20), ("cy", 3)]}]),
            lambda: m.nightly_batch_and_rebase(full=False),
            lambda: m.redis_loses_everything_while_ingest_goes_on(matches=[
                {"region": "eu", "mode": "casual", "age_minutes": 902,
                 "players": [("cy", 2), ("bob", 0), ("ann", 1)]}], retry=True, writer="a"),
            lambda: m.trusted_backfill(matches=[
                {"region": "eu", "mode": "casual", "age_minutes": 327,
                 "players": [("cy", 0), ("bob", 20)]},
                {"region": "eu", "mode": "ranked", "age_minutes": 800, "players": [("bob", 2)]}]),
            m.retention_night,
            lambda: m.time_passes(hours=3, minutes=30),
            lambda: m.moderate(action="ban", player="dee"),
            lambda: m.time_passes(hours=6, minutes=0),
            lambda: m.moderate(action="ban", player="eve"),
            m.compaction_night, m.retention_night, m.compaction_night,
            lambda: m.erase_a_player(data=_Draws("eve"), writer="a"),
            lambda: m.time_passes(hours=11, minutes=7),
            lambda: m.rebase_with_a_file_landing_before_the_flip(full=True, matches=[
                {"region": "eu", "mode": "ranked", "age_minutes": 856, "players": [("eve", 0)]},
                {"region": "na", "mode": "ranked", "age_minutes": 500, "players": [("dee", -1)]}],
                writer="b"),
        ]
        m.merged_answers_equal_the_model()
        for step in steps:
            step()
            m.merged_answers_equal_the_model()
    finally:
        m.teardown()
