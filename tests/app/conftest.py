"""What the app's tests share: the CLI tests' published lake (`publish_cli_lake`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

#: A valid match event; the CLI tests vary it.
GOOD = {"match_id": "m1", "player_id": "alice", "points": 5,
        "event_time": "2026-12-01T10:00:00Z", "region": "na", "mode": "ranked"}
#: Five players' history: (player, points, region).
HISTORY = [("alice", 10, "na"), ("bob", 8, "na"), ("carol", 6, "eu"), ("dave", 4, "na"),
           ("erin", 2, "eu")]


def _publish(folder: Path, *, nights: int = 1) -> Path:
    """Through the CLI, in the environment's data dir (`folder/data`): five players'
    history of 2026-11-28 backfilled and published, then dave's live 7 points today
    (LEADERBOARD_NOW 2026-12-01T12:00Z) lift him from 4th to 1st. `nights=1`: one batch,
    as of 2026-11-30. `nights=2`: as of 2026-11-29, then erin's 5 points of 2026-11-30
    landed and published as of 2026-11-30 (a version of yesterday to compare with)."""
    from app.cli import main

    history = folder / "history.jsonl"
    history.write_text("".join(
        json.dumps(dict(GOOD, match_id=f"h{i}", player_id=name, points=points, region=region,
                        event_time="2026-11-28T10:00:00Z")) + "\n"
        for i, (name, points, region) in enumerate(HISTORY)))
    live = folder / "live.jsonl"
    live.write_text(json.dumps(dict(GOOD, match_id="l1", player_id="dave", points=7)) + "\n")
    # A backfill is stamped at landing: landed on 11-29, the batch as of 11-29 absorbs it.
    assert main(["--now", "2026-11-29T12:00:00Z", "ingest", "--backfill", str(history)]) == 0
    if nights == 2:
        second = folder / "second.jsonl"
        second.write_text(json.dumps(dict(GOOD, match_id="s1", player_id="erin", points=5,
                                          region="eu", event_time="2026-11-30T10:00:00Z"))
                          + "\n")
        assert main(["batch", "--as-of", "2026-11-29"]) == 0
        assert main(["--now", "2026-11-30T12:00:00Z", "ingest", str(second)]) == 0
    assert main(["batch", "--as-of", "2026-11-30"]) == 0
    assert main(["ingest", str(live)]) == 0
    return folder / "data"


@pytest.fixture(scope="session")
def publish_cli_lake() -> Callable[..., Path]:
    """The builder of the CLI tests' lake (`_publish`): each test module's `served` calls it
    with its own scope and data dir."""
    return _publish
