"""The operator's drill on a generated season: after each of a ban, its unban, a rebuild of
the speed state and a void, every live answer equals a full batch over the same lake."""

from __future__ import annotations

import shutil
from datetime import date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import redis
from views import Ranked, live_ranked

from app.generate import GenerateSpec
from app.season import generate_season
from jobs.batch import run_batch
from leaderboard.batch_view import open_current
from leaderboard.lake import landed_files
from leaderboard.manifest import read_current
from leaderboard.schema import identity_match_ids
from leaderboard.settings import Settings
from leaderboard.speed_keys import windows_key
from serving.service import Leaderboards
from speed_layer.service import SpeedLayer

pytestmark = [pytest.mark.redis, pytest.mark.slow]

#: A season with the generator's dirty rows (re-deliveries across days among them): two
#: nights batched, the last two days the speed layer's.
SPEC = GenerateSpec(players=10_000, days=4, events_per_day=50_000, start=date(2026, 9, 1),
                    seed=21, dirty=0.05, writer="gen")
#: What a batch writes: a full batch starts from the rest of the lake.
_BATCH_OUTPUTS = {"manifests", "standings", "rollups", "histograms", "runs"}


def _landed(lake: Path) -> pa.Table:
    return pa.concat_tables(
        [pq.read_table(f.path, columns=["match_id", "player_id", "board", "ingested_at"])
         for f in landed_files(lake)], promote_options="default")


def _straddling(rows: pa.Table, watermark: datetime) -> pa.Table:
    """The rows whose identity has a copy on each side of the watermark."""
    ids = pc.binary_join_element_wise(identity_match_ids(rows), rows.column("player_id"),
                                      "\x00")
    before = pc.less(rows.column("ingested_at"), pa.scalar(watermark, rows.column(
        "ingested_at").type))
    early = pc.unique(ids.filter(before))
    late = pc.unique(ids.filter(pc.invert(before)))
    both = pc.is_in(late, value_set=early)
    return rows.filter(pc.and_(pc.invert(before), pc.is_in(ids, value_set=late.filter(both))))


def _full_batch(lake: Path, scratch: Path, as_of: date) -> Ranked:
    """Every board-window of one full batch over a copy of the lake's inputs."""
    target = scratch / "lake"
    shutil.copytree(lake, target, ignore=lambda where, names: [
        n for n in names if Path(where) == lake and n in _BATCH_OUTPUTS])
    result = run_batch(Settings.from_env({"LEADERBOARD_DATA": str(scratch)}), as_of)
    assert result.mode == "full"
    view = open_current(target)
    assert view is not None
    found: Ranked = {}
    for board, window_id in view.windows():
        table = view.standings(board, window_id)
        assert table is not None
        found[(board, window_id)] = list(zip(table.column("player_id").to_pylist(),
                                             table.column("score").to_pylist(),
                                             table.column("rank").to_pylist(), strict=True))
    return found


def _speed_windows(client: redis.Redis, speed: SpeedLayer) -> set[tuple[str, str]]:
    """Every board-window the live speed version holds state in."""
    held = set()
    for raw in client.smembers(windows_key(speed.current().tag)):
        board, _, window_id = raw.decode().partition("|")
        held.add((board, window_id))
    return held


def _live_equals_a_full_batch(settings: Settings, speed: SpeedLayer, client: redis.Redis,
                              scratch: Path, now: datetime, step: str,
                              batch: Ranked | None = None) -> Ranked:
    """Every live board-window (the batch's and those only the speed layer holds) equals a
    full batch over a copy of the lake as it is now (`batch`: one already run on the same
    lake); returns that batch."""
    if batch is None:
        batch = _full_batch(settings.lake_dir, scratch / step, now.date())
    served = Leaderboards(settings.lake_dir, settings.registry, client, now=lambda: now,
                          pointer_ttl=3600.0)
    windows = sorted(set(batch) | _speed_windows(client, speed))
    live = live_ranked(served, windows)
    for key in windows:
        assert live[key] == batch.get(key, []), (step, key)
    return batch


@pytest.mark.timeout(900)
def test_after_each_step_of_a_ban_unban_rebuild_void_drill_live_equals_a_full_batch(
        tmp_path, redis_client):
    """After each step of the drill (a ban, its unban, a rebuild of the speed state, a
    void), every player's live score and rank, in every live board-window (those only the
    speed layer holds too, which a batch has empty), equal a full batch over the same lake,
    re-delivered events (copies on both sides of the watermark) and the moved players
    included."""
    settings = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path / "live")})
    registry, lake = settings.registry, settings.lake_dir
    generate_season(SPEC, registry, lake)
    for night in (SPEC.start, SPEC.start + timedelta(days=1)):
        run_batch(settings, night)
    manifest = read_current(lake)
    assert manifest is not None
    speed = SpeedLayer(redis_client, registry, lake)
    speed.rebase(manifest)
    watermark = speed.current().watermark
    assert watermark is not None
    rows = _landed(lake)
    copies = _straddling(rows, watermark)
    assert copies.num_rows > 0, "the season re-delivers events across the watermark"
    after = max(rows.column("ingested_at").to_pylist()) + timedelta(hours=1)
    moved = sorted(set(copies.column("player_id").to_pylist()))
    banned, voided = moved[0], moved[-1]
    scratch = tmp_path / "full"

    speed.ban(banned, after)
    _live_equals_a_full_batch(settings, speed, redis_client, scratch, after, "ban")
    speed.unban(banned, after + timedelta(minutes=1))
    unbanned = _live_equals_a_full_batch(settings, speed, redis_client, scratch, after,
                                         "unban")
    speed.rebuild(after + timedelta(minutes=2))  # the lake is as at the unban
    _live_equals_a_full_batch(settings, speed, redis_client, scratch, after, "rebuild",
                              unbanned)
    voided_match = copies.filter(pc.equal(copies.column("player_id"), voided)).column(
        "match_id")[0].as_py()
    speed.void(voided_match, voided, after + timedelta(minutes=3))
    _live_equals_a_full_batch(settings, speed, redis_client, scratch, after, "void")
