"""Re-deliveries across days: an event the base absorbed, landed again days later (past the
door's horizon), never counts twice once the speed state is recomputed from the lake (a
rebuild, an unban, a void's recompute, a rebase, the erasure's rebase)."""

from __future__ import annotations

from datetime import timedelta

import pyarrow.parquet as pq
import pytest
from lakes import batches, day, random_stream
from oracle import reference_standings
from views import live_ranked

from app.erasure import erase_player
from jobs.batch import run_batch
from jobs.compact import SpeedWatermark, compact_partition
from leaderboard.lake import LandingWriter
from leaderboard.registry import load_registry
from leaderboard.settings import Settings
from serving.service import Leaderboards
from speed_layer import dedupe, service
from speed_layer.ingest import Ingestor
from speed_layer.service import SpeedLayer

pytestmark = pytest.mark.redis
START = day("2026-11-20")
#: When the re-delivery lands: three days after the night that absorbed the first copy.
AGAIN = day("2026-11-23T10:00:00")


def _ingest(speed: SpeedLayer, writer: LandingWriter, registry, events: list[dict]) -> None:
    ingestor = Ingestor(registry, writer, speed)
    for at, table in batches(events):
        ingestor.ingest(table, now=at, source="t")


def _expected(lake, registry) -> dict:
    reference = reference_standings(lake, registry, None, watermark=day("2100-01-01T00:00:00"))
    return {k: [(r.player_id, r.score, r.rank) for r in rows]
            for k, rows in reference.items() if rows}


@pytest.fixture
def redelivered(tmp_path, redis_client):
    """Day 1 ingested and batched (version 1 live); on day 2 a match of the player lands;
    on day 4 a copy of one of the player's day-1 events and one of that day-2 match land
    again with other points, beside a new match of that player and another. Returns (lake,
    registry, speed, settings, the player, the other, the new match)."""
    registry = load_registry()
    lake = tmp_path / "lake"
    settings = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path)})
    speed = SpeedLayer(redis_client, registry, lake)
    first = random_stream(61, start=START, days=1, duplicate_share=0.0, late_share=0.0)
    first = [e for e in first if e["ingested_at"] < START + timedelta(hours=23)]
    original = first[0]
    player = original["player_id"]
    other = next(e["player_id"] for e in first if e["player_id"] != player)
    again = dict(original, points=original["points"] + 7, ingested_at=AGAIN)
    since = dict(original, match_id="m61-since", points=5,
                 event_time=START + timedelta(days=1, hours=9),
                 ingested_at=START + timedelta(days=1, hours=10))
    since_again = dict(since, points=9, ingested_at=AGAIN)
    new_match = "m61-new"
    fresh = [dict(original, match_id=new_match, player_id=p, points=3,
                  event_time=AGAIN - timedelta(minutes=30), ingested_at=AGAIN)
             for p in (player, other)]
    with LandingWriter(lake, "w") as writer:
        _ingest(speed, writer, registry, first)
        speed.rebase(run_batch(settings, START.date()).manifest)
        _ingest(speed, writer, registry, [since])
        _ingest(speed, writer, registry, [again, since_again, *fresh])
    for match in (original["match_id"], since["match_id"]):
        copies = [r for f in sorted((lake / "events").rglob("*.parquet"))
                  for r in pq.read_table(f).to_pylist()
                  if (r["match_id"], r["player_id"]) == (match, player)]
        assert len(copies) == 2  # past the door's horizon: the copy landed
    return lake, registry, speed, settings, player, other, new_match


def _served(lake, registry, redis_client) -> tuple[dict, dict]:
    served = Leaderboards(lake, registry, redis_client, now=lambda: day("2026-11-24T00:00:00"))
    expected = _expected(lake, registry)
    return live_ranked(served, expected), expected


def _where_voided(live: dict, expected: dict) -> tuple[dict, dict]:
    """Only the board-windows the void recomputes the player in: of those where the voided
    match counts, the copy counts in the month, the season and all-time."""
    expected = {k: v for k, v in expected.items()
                if k[1].partition(":")[0] in ("monthly", "season", "all-time")}
    return {k: live[k] for k in expected}, expected


@pytest.mark.parametrize("path", ["rebuild", "unban", "void", "rebase", "erase"])
def test_a_recompute_from_the_lake_counts_a_re_delivery_once(redelivered, redis_client, path):
    """After each path that recomputes the speed state from the lake, every player's live
    score and rank in every board-window equal a batch of the whole lake: the copy of an
    event the base absorbed, landed days later, counts nowhere (the batch keeps the first
    ingested copy), nor does the later copy of an event folded since the watermark."""
    lake, registry, speed, settings, player, other, new_match = redelivered
    if path == "rebuild":
        redis_client.flushall()
        speed.rebuild(AGAIN + timedelta(hours=2))
    elif path == "unban":
        speed.ban(player, AGAIN + timedelta(hours=1))
        speed.unban(player, AGAIN + timedelta(hours=2))
    elif path == "void":
        speed.void(new_match, player, AGAIN + timedelta(hours=1))
    elif path == "rebase":  # the next night: the copy still lands after its watermark
        speed.rebase(run_batch(settings, START.date() + timedelta(days=1)).manifest)
    else:
        erase_player(settings, speed, other, settle=0.0, sleep=lambda _s: None)
    live, expected = _served(lake, registry, redis_client)
    if path == "void":
        live, expected = _where_voided(live, expected)
    assert live == expected


@pytest.mark.parametrize(("path", "listing"), [("unban", (dedupe, "absorbed_files")),
                                               ("void", (dedupe, "absorbed_files")),
                                               ("void", (service, "landed_files"))])
def test_a_recompute_reading_the_base_while_compaction_replaces_its_files_counts_once(
        redelivered, redis_client, monkeypatch, path, listing):
    """Compaction of a partition the base absorbed, run between the recompute's listing of
    the lake and its read (the originals deleted once the compacted file is written): the
    unban or void completes, and every live score and rank still equal a batch of the whole
    lake (the copy of an event the base absorbed counts once)."""
    lake, registry, speed, _settings, player, _other, new_match = redelivered
    module, name = listing
    listed = getattr(module, name)
    compacted: list[int] = []

    def compaction_meanwhile(*args, **kwargs):
        files = listed(*args, **kwargs)
        if not compacted and any(f.ingest_date == START.date() for f in files):
            version = speed.current()
            report = compact_partition(lake, START.date(), speed=SpeedWatermark(
                present=True, watermark=version.watermark, version=version.version))
            compacted.append(sum(c["originals"] for c in report.compacted))
        return files

    if path == "unban":
        speed.ban(player, AGAIN + timedelta(hours=1))
        monkeypatch.setattr(module, name, compaction_meanwhile)
        speed.unban(player, AGAIN + timedelta(hours=2))
    else:
        monkeypatch.setattr(module, name, compaction_meanwhile)
        speed.void(new_match, player, AGAIN + timedelta(hours=1))
    assert compacted[0] > 1, "files listed were deleted before being read"
    live, expected = _served(lake, registry, redis_client)
    if path == "void":
        live, expected = _where_voided(live, expected)
    assert live == expected
