"""Voids in the speed layer: applied at once, exactly, for every aggregation (issue 12 part 3).

Every check compares the merged answers with the batch of everything with every void
applied (tests/oracle.py), on a registry with sum, max, min and last boards, both orders and
both tie policies.
"""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest
import redis
from lakes import EXOTIC, batches, day, random_stream, registry_from, write_registry
from oracle import absorbed_events, reference_standings

from app.cli import main
from jobs.batch import run_batch
from jobs.compact import SpeedWatermark
from jobs.retention import apply_retention
from leaderboard import faults
from leaderboard.lake import LandingWriter
from leaderboard.settings import Settings
from leaderboard.voids import write_void
from serving.service import Leaderboards
from speed_layer.ingest import Ingestor
from speed_layer.rate import rate_key
from speed_layer.service import SpeedLayer

pytestmark = pytest.mark.redis
START = day("2026-11-28")


def _live(speed) -> SpeedWatermark:
    """The live version's watermark, as retention reads it from the speed layer."""
    pointer = speed.current()
    return SpeedWatermark(present=True, watermark=pointer.watermark, version=pointer.version)


@pytest.fixture
def world(tmp_path, redis_client):
    config = tmp_path / "exotic.toml"
    write_registry(config, EXOTIC)
    registry = registry_from(EXOTIC)
    lake = tmp_path / "data" / "lake"
    settings = Settings.from_env({"LEADERBOARD_DATA": str(lake.parent),
                                  "LEADERBOARD_CONFIG": str(config)})
    return lake, registry, SpeedLayer(redis_client, registry, lake), settings


def ingest(speed: SpeedLayer, lake: Path, registry, events: list[dict], writer: str = "w"
           ) -> None:
    with LandingWriter(lake, writer) as landing:
        ingestor = Ingestor(registry, landing, speed)
        for at, table in batches(events):
            ingestor.ingest(table, now=at, source="t")


def assert_served_as_reference(lake: Path, registry, client: redis.Redis) -> None:
    """Every board-window's merged order and total equal the batch of everything, every
    void and ban applied."""
    served = Leaderboards(lake, registry, client, now=lambda: day("2026-12-05T00:00:00"))
    reference = reference_standings(lake, registry, None,
                                    watermark=day("2100-01-01T00:00:00"))
    for (board, window_id), rows in reference.items():
        merged = served.merged(board, window_id)
        assert [(e.player_id, e.rank) for e in merged.top(len(rows) + 3)] == [
            (r.player_id, r.rank) for r in rows], (board, window_id)
        assert merged.total() == len(rows), (board, window_id)


def _pick(events: list[dict], since=None, before=None) -> tuple[str, tuple[str, str]]:
    """A match with several players, and one (match, player) of another match."""
    chosen = [e for e in events if (since is None or e["ingested_at"] >= since)
              and (before is None or e["ingested_at"] < before)]
    by_match: dict[str, list[str]] = {}
    for event in chosen:
        by_match.setdefault(event["match_id"], []).append(event["player_id"])
    matches = sorted(m for m, p in by_match.items() if len(p) >= 2)
    return matches[0], (matches[1], by_match[matches[1]][0])


def test_voids_apply_at_once_exactly_for_every_aggregation(world, redis_client):
    """Voids of events the base absorbed and of speed events, whole matches and single
    results, and one recorded before its match lands: merged answers equal the batch of
    everything after each; then a rebase onto a batch that had not seen the voids, and a
    rebuild after a flush, keep them."""
    lake, registry, speed, settings = world
    ingest(speed, lake, registry, random_stream(51, start=START, days=1, duplicate_share=0.0))
    speed.rebase(run_batch(settings, START.date()).manifest)
    ingest(speed, lake, registry, random_stream(52, start=day("2026-11-29T00:00:00"), days=1,
                                                duplicate_share=0.0))
    watermark = day("2026-11-29T00:00:00")
    events = absorbed_events(lake, None)
    base_match, (base_single, base_player) = _pick(events, before=watermark)
    speed_match, (speed_single, speed_player) = _pick(events, since=watermark)
    at = day("2026-11-30T00:30:00")
    assert speed.void(base_match, None, at, "exploit")
    assert_served_as_reference(lake, registry, redis_client)
    assert speed.void(base_single, base_player, at, "wrong score") == [base_player]
    assert_served_as_reference(lake, registry, redis_client)
    assert speed.void(speed_match, None, at, "exploit")
    assert speed.void(speed_single, speed_player, at, "wrong score") == [speed_player]
    assert_served_as_reference(lake, registry, redis_client)
    # A void of a match not landed yet is recorded; its events do not count when they land.
    assert speed.void("m-later", None, at, "known bad server") == []
    ingest(speed, lake, registry, [
        {"match_id": "m-later", "player_id": f"late{i}", "points": 40 + i,
         "event_time": day("2026-11-30T01:00:00"), "region": "na", "mode": "ranked",
         "server_id": "s1", "ingested_at": day("2026-11-30T01:00:05")} for i in range(3)],
        writer="x")
    assert_served_as_reference(lake, registry, redis_client)
    # The batch of day 2 has not seen the voids (after its watermark): the rebase applies
    # them to the new version's base part.
    manifest = run_batch(settings, date(2026, 11, 29)).manifest
    assert manifest.inputs["voids"] == ""
    speed.rebase(manifest)
    assert speed.current().version == manifest.version
    assert_served_as_reference(lake, registry, redis_client)
    redis_client.flushall()
    speed.rebuild(day("2026-11-30T02:00:00"))
    assert_served_as_reference(lake, registry, redis_client)
    # The next batch applies them itself (in full), and the rebase keeps the answers.
    manifest = run_batch(settings, date(2026, 11, 30)).manifest
    assert manifest.inputs["voids"]
    speed.rebase(manifest)
    assert_served_as_reference(lake, registry, redis_client)


def test_a_void_recorded_already_changes_nothing_and_a_half_applied_one_is_applied(
        world, redis_client, monkeypatch):
    """Regression (noted in session 8): the same void again (a retried request) wrote a
    second record and answered every player of it as changed. Now nothing is recorded,
    `players` is empty and `earlier` names the void that stands; a whole match's void
    leaves out the players a void of their own result already took. A void recorded but
    not applied (Redis failed while it recomputed) is applied by the retry, which then
    names its players, or by its whole match's void, which then names them too."""
    from leaderboard.voids import read_voids

    lake, registry, speed, _settings = world
    ingest(speed, lake, registry, random_stream(56, start=START, days=1, duplicate_share=0.0))
    events = absorbed_events(lake, None)
    match, (single, player) = _pick(events)
    everyone = sorted({e["player_id"] for e in events if e["match_id"] == match})
    at = day("2026-11-29T01:00:00")
    assert speed.void(match, everyone[0], at, "first") == [everyone[0]]
    again = speed.void_applied(match, everyone[0], at, "again")
    assert again.players == []
    assert again.earlier is not None
    assert again.earlier.reason == "first"
    whole = speed.void_applied(match, None, at, "whole")
    assert (whole.earlier, whole.players) == (None, everyone[1:])
    covered = speed.void_applied(match, everyone[1], at, "late")
    assert covered.players == []
    assert covered.earlier is not None
    assert covered.earlier.player_id is None
    assert len(read_voids(lake)) == 2
    assert_served_as_reference(lake, registry, redis_client)

    def redis_fails(*_args: object) -> None:
        raise redis.ConnectionError("injected")

    monkeypatch.setattr(speed, "_recompute", redis_fails)
    with pytest.raises(redis.ConnectionError):
        speed.void(single, player, at, "exploit")
    monkeypatch.undo()
    retried = speed.void_applied(single, player, at, "exploit")
    assert retried.earlier is not None
    assert retried.players == [player]
    assert len(read_voids(lake)) == 3
    assert_served_as_reference(lake, registry, redis_client)
    # A player's void left unapplied, then their whole match's: that player's standing
    # changes, and the answer says so (it left them out as covered).
    other = next(m for m in sorted({e["match_id"] for e in events} - {match, single})
                 if len({e["player_id"] for e in events if e["match_id"] == m}) >= 2)
    first = sorted({e["player_id"] for e in events if e["match_id"] == other})[0]
    monkeypatch.setattr(speed, "_recompute", redis_fails)
    with pytest.raises(redis.ConnectionError):
        speed.void(other, first, day("2026-11-29T00:59:00"), "exploit")
    monkeypatch.undo()
    assert first in speed.void(other, None, at, "whole")
    assert_served_as_reference(lake, registry, redis_client)
    # Its own void again: the whole match's, in effect, stands; nothing changes (it picked
    # the unapplied one and named the player as changed).
    assert speed.void(other, first, at, "exploit") == []


def test_a_void_racing_a_live_fold_leaves_none_of_its_rows(world, redis_client):
    """The void runs while a file naming its match is being folded with the voids read
    before it: none of the match's rows count, in any board-window."""
    lake, registry, speed, _settings = world
    todo = batches(random_stream(53, start=START, days=1, duplicate_share=0.0))
    _at, table = todo[3]
    match = table.column("match_id")[0].as_py()
    with LandingWriter(lake, "w") as writer:
        ingestor = Ingestor(registry, writer, speed)
        for number, (at, table) in enumerate(todo):
            if number == 3:
                void = faults.on_hit(2, lambda _n, at=at: speed.void(match, None, at, "race"))
                with faults.injected("fold.after_script", void):
                    ingestor.ingest(table, now=at, source="t")
            else:
                ingestor.ingest(table, now=at, source="t")
    assert_served_as_reference(lake, registry, redis_client)


def test_an_unban_restores_the_player_without_their_voided_results(world, redis_client):
    """A banned player's result is voided while they are banned: the unban brings back
    their standing without it (base part recomputed, speed rows replayed without it)."""
    lake, registry, speed, settings = world
    ingest(speed, lake, registry, random_stream(54, start=START, days=1, duplicate_share=0.0))
    speed.rebase(run_batch(settings, START.date()).manifest)
    ingest(speed, lake, registry, random_stream(55, start=day("2026-11-29T00:00:00"), days=1,
                                                duplicate_share=0.0))
    events = absorbed_events(lake, None)
    player = events[0]["player_id"]
    mine = [e for e in events if e["player_id"] == player]
    speed.ban(player, day("2026-11-30T00:10:00"))
    for event in (mine[0], mine[-1]):
        assert speed.void(event["match_id"], player, day("2026-11-30T00:20:00")) == []
    speed.unban(player, day("2026-11-30T00:30:00"))
    assert_served_as_reference(lake, registry, redis_client)


def test_erasing_a_short_id_keeps_every_other_key(world, redis_client):
    """Regression: the erasure's key cleanup searched key names for the id as a substring,
    so erasing `a` (inside every `lb:{global|all-time}...` name) deleted the live state."""
    lake, registry, speed, _settings = world
    ingest(speed, lake, registry, [
        {"match_id": "m1", "player_id": player, "points": 3,
         "event_time": START, "region": "na", "mode": "ranked", "server_id": "s1",
         "ingested_at": START} for player in ("a", "ab", "b")])
    before = {k for k in redis_client.scan_iter() if b":rate:" not in k}
    redis_client.set(rate_key("a", 123), 1)
    speed.erase("a", keep=speed.current().tag)
    assert redis_client.get(rate_key("a", 123)) is None
    assert {k for k in redis_client.scan_iter()} == before


def test_a_player_voided_down_to_nothing_over_the_base_starts_again_from_zero(world,
                                                                              redis_client):
    """A void of the only result the base counted for a player hides their base part and
    leaves them nothing; their next event must count from zero, not from the hidden base
    again (found by the stateful model: served base + delta, the voided result back)."""
    lake, registry, speed, settings = world

    def event(match: str, points: int, at: str) -> dict:
        return {"match_id": match, "player_id": "solo", "points": points,
                "event_time": day(at), "region": "na", "mode": "ranked", "server_id": "s1",
                "ingested_at": day(at)}

    ingest(speed, lake, registry, [
        *random_stream(53, start=START, days=1, duplicate_share=0.0),
        event("m-solo-1", 7, "2026-11-28T10:00:00")])
    speed.rebase(run_batch(settings, START.date()).manifest)
    assert speed.void("m-solo-1", "solo", day("2026-11-29T00:30:00"), "wrong score") == [
        "solo"]
    assert_served_as_reference(lake, registry, redis_client)
    ingest(speed, lake, registry, [event("m-solo-2", 5, "2026-11-29T01:00:00")], writer="x")
    assert_served_as_reference(lake, registry, redis_client)


def test_a_void_keeps_a_direct_score_sharing_a_match_id_with_the_players_event(world,
                                                                              redis_client):
    """A direct score and a match event of one player under one match_id are two identities
    (board, match, player): a void of the player's other base result recomputes their base
    part from their raw rows, and that dedupe kept one row per match_id, so whichever of
    the two sorted first (same landing instant: the file name) dropped the other (found by
    the stateful model: a global all-time total short of the match event's points)."""
    lake, registry, speed, settings = world
    at = day("2026-11-28T10:00:00")

    def row(match: str, player: str, points: int) -> dict:
        return {"match_id": match, "player_id": player, "points": points, "event_time": at,
                "region": "na", "mode": "ranked", "server_id": "s1", "ingested_at": at}

    # Writer "a" lands the direct score, writer "b" the match events, at the same instant:
    # "part-a-..." sorts before "part-b-...".
    with LandingWriter(lake, "a") as landing:
        _at, table = batches([row("m-shared", "dee", 4)])[0]
        Ingestor(registry, landing, speed).ingest(table, now=at, source="t",
                                                  board=registry.board("coins"))
    with LandingWriter(lake, "b") as landing:
        _at, table = batches([row("m-shared", "dee", 5), row("m-shared", "ann", 6),
                              row("m-other", "dee", 3)])[0]
        Ingestor(registry, landing, speed).ingest(table, now=at, source="t")
    speed.rebase(run_batch(settings, START.date()).manifest)
    assert speed.void("m-other", "dee", day("2026-11-29T00:30:00"), "wrong score") == ["dee"]
    served = Leaderboards(lake, registry, redis_client, now=lambda: day("2026-12-05T00:00:00"))
    assert served.player("global", "dee", "all-time")["score"] == 5
    assert served.player("coins", "dee", "all-time")["score"] == 4
    assert_served_as_reference(lake, registry, redis_client)


def submit_coins(speed: SpeedLayer, lake: Path, registry, rows: list[dict]) -> None:
    """Submit `rows` as scores to the direct board `coins`, each landed at its own time."""
    with LandingWriter(lake, "d") as landing:
        ingestor = Ingestor(registry, landing, speed)
        for at, table in batches(rows):
            ingestor.ingest(table, now=at, source="t", board=registry.board("coins"))


def _row(match: str, player: str, points: int, at: str) -> dict:
    """One ranked match event in na, landed at its own time."""
    return {"match_id": match, "player_id": player, "points": points, "event_time": day(at),
            "region": "na", "mode": "ranked", "server_id": "s1", "ingested_at": day(at)}


def test_a_void_applied_before_the_first_retention_stays_applied(world, redis_client):
    """The first retention ends full recomputes (a full one would miss the deleted events),
    so a void the live batch version had not applied yet could never reach the batch: the
    next version counted the voided result again and, the void being before its
    watermark, the rebase left it there: a voided result came back with no new input.
    Retention waits until the live version has every void in the lake."""
    lake, registry, speed, settings = world

    ingest(speed, lake, registry, [_row("m-old", "ann", 2, "2026-11-26T10:00:00"),
                                   _row("m-bad", "dee", 5, "2026-11-27T10:00:00"),
                                   _row("m-ok", "ann", 1, "2026-11-27T11:00:00")])
    speed.rebase(run_batch(settings, date(2026, 11, 27)).manifest)
    served = Leaderboards(lake, registry, redis_client, now=lambda: day("2026-11-28T12:00:00"))

    def dee() -> str:
        served._pointer = None
        return str(served.player("global", "dee", "all-time")["status"])

    assert dee() == "ranked"
    assert speed.void("m-bad", None, day("2026-11-28T00:30:00"), "exploit") == ["dee"]
    assert dee() == "unranked"
    pointer = speed.current()
    live = SpeedWatermark(present=True, watermark=pointer.watermark, version=pointer.version)
    waited = apply_retention(lake, date(2026, 11, 28), 1, speed=live, registry=registry)
    assert waited.deleted == []
    assert waited.skipped is not None
    assert "void" in waited.skipped
    speed.rebase(run_batch(settings, date(2026, 11, 28)).manifest)  # full: applies the void
    assert dee() == "unranked"
    pointer = speed.current()
    live = SpeedWatermark(present=True, watermark=pointer.watermark, version=pointer.version)
    assert apply_retention(lake, date(2026, 11, 28), 1, speed=live,
                           registry=registry).deleted == ["2026-11-26"]
    speed.rebase(run_batch(settings, date(2026, 11, 29)).manifest)
    assert dee() == "unranked"
    redis_client.flushall()
    speed.rebuild(day("2026-11-30T01:00:00"))
    assert dee() == "unranked"


def test_voids_on_a_direct_min_board_with_earliest_ties(tmp_path, redis_client):
    """A best-lap board (direct, min, asc, earliest ties): a void of a player's best lap the
    base absorbed brings back their next best (and when they reached it), a void of a speed
    lap likewise, and a void of a match also removes the laps submitted under its id; the
    merged answers equal the batch of everything after each, and after a rebase and a
    rebuild."""
    raw = {**EXOTIC, "boards": [*EXOTIC["boards"], {
        "name": "lap", "source": "direct", "aggregation": "min", "order": "asc",
        "ties": "earliest", "windows": ["weekly", "all-time"], "min_points": 1,
        "max_points": 1000000}]}
    config = tmp_path / "lap.toml"
    write_registry(config, raw)
    registry = registry_from(raw)
    lake = tmp_path / "data" / "lake"
    settings = Settings.from_env({"LEADERBOARD_DATA": str(lake.parent),
                                  "LEADERBOARD_CONFIG": str(config)})
    speed = SpeedLayer(redis_client, registry, lake)

    def laps(rows: list[tuple[str, str, int, str]], writer: str) -> None:
        with LandingWriter(lake, writer) as landing:
            ingestor = Ingestor(registry, landing, speed)
            for match, player, ms, at in rows:
                _at, table = batches([{"match_id": match, "player_id": player, "points": ms,
                                       "event_time": day(at), "region": "", "mode": "",
                                       "server_id": "s1", "ingested_at": day(at)}])[0]
                ingestor.ingest(table, now=day(at), source="t", board=registry.board("lap"))

    laps([("r1", "ann", 900, "2026-11-28T09:00:00"), ("r1", "bob", 900, "2026-11-28T09:00:00"),
          ("r2", "ann", 800, "2026-11-28T10:00:00"), ("r2", "cy", 850, "2026-11-28T10:00:00"),
          ("r3", "bob", 800, "2026-11-28T11:00:00")], "a")
    ingest(speed, lake, registry, [
        {"match_id": "r2", "player_id": "cy", "points": 7, "event_time": day("2026-11-28T10:00:00"),
         "region": "na", "mode": "ranked", "server_id": "s1",
         "ingested_at": day("2026-11-28T10:00:00")}], writer="b")
    speed.rebase(run_batch(settings, START.date()).manifest)
    laps([("r4", "cy", 700, "2026-11-29T09:00:00"), ("r5", "ann", 750, "2026-11-29T10:00:00"),
          ("r5", "bob", 760, "2026-11-29T10:00:00")], "a")
    assert_served_as_reference(lake, registry, redis_client)
    at = day("2026-11-29T12:00:00")
    assert speed.void("r2", "ann", at, "cut the track") == ["ann"]  # absorbed best
    assert_served_as_reference(lake, registry, redis_client)
    assert speed.void("r4", "cy", at, "cut the track") == ["cy"]  # a speed lap
    assert_served_as_reference(lake, registry, redis_client)
    # The match: cy's lap and event; ann's lap there went with her own void above, so her
    # standing does not change (the answer named her too before session 9).
    assert speed.void("r2", None, at, "bad server") == ["cy"]
    assert_served_as_reference(lake, registry, redis_client)
    speed.rebase(run_batch(settings, date(2026, 11, 28)).manifest)
    assert_served_as_reference(lake, registry, redis_client)
    redis_client.flushall()
    speed.rebuild(day("2026-11-29T13:00:00"))
    assert_served_as_reference(lake, registry, redis_client)
    speed.rebase(run_batch(settings, date(2026, 11, 29)).manifest)
    assert_served_as_reference(lake, registry, redis_client)


def test_a_void_does_not_bring_back_the_history_of_a_player_unbanned_across_the_watermark(
        world, redis_client):
    """A player the base left out (banned before its watermark) and unbanned since is served
    the events since the watermark until the next batch (docs/architecture.md, known
    limits). A void of one of their older results made the unban recompute their base part
    from raw rows, so they got their whole history back at once, only because a void named
    it: 7 served, not 2."""
    lake, registry, speed, settings = world

    ingest(speed, lake, registry, [_row("m1", "p", 5, "2026-11-28T09:00:00"),
                                   _row("m1", "q", 1, "2026-11-28T09:00:00"),
                                   _row("m2", "p", 3, "2026-11-28T10:00:00")])
    speed.ban("p", day("2026-11-28T12:00:00"))
    speed.rebase(run_batch(settings, date(2026, 11, 28)).manifest)
    ingest(speed, lake, registry, [_row("m3", "p", 2, "2026-11-29T09:00:00")], writer="x")
    speed.void("m2", "p", day("2026-11-29T10:00:00"), "wrong score")
    speed.unban("p", day("2026-11-29T11:00:00"))
    served = Leaderboards(lake, registry, redis_client, now=lambda: day("2026-11-30T12:00:00"))
    assert served.player("global", "p", "all-time")["score"] == 2
    speed.rebase(run_batch(settings, date(2026, 11, 29)).manifest)
    served._pointer = None
    assert served.player("global", "p", "all-time")["score"] == 7
    assert_served_as_reference(lake, registry, redis_client)


# -- after retention ------------------------------------------------------------------------

RETAINED_START = day("2026-11-20T00:00:00")
R = date(2026, 11, 20)  # the first event date; retention at R+5 keeping 3 days deletes R, R+1
LIVE = day("2026-11-26T00:00:00")  # the live version's watermark (as of R+5)


def all_time_score(lake: Path, registry, client: redis.Redis, now: str,
                   player: str = "p000") -> int:
    """The player's merged global all-time score, served at `now`."""
    served = Leaderboards(lake, registry, client, now=lambda: day(now))
    return int(served.player("global", player, "all-time")["score"])


def assert_served_exactly(lake: Path, reference_lake: Path, registry, client: redis.Redis,
                          now: str = "2026-11-27T00:00:00") -> None:
    """Every board-window's merged order, scores, sort keys and total equal the batch of
    everything in `reference_lake` (the same lake without retention), every void applied."""
    served = Leaderboards(lake, registry, client, now=lambda: day(now))
    reference = reference_standings(reference_lake, registry, None,
                                    watermark=day("2100-01-01T00:00:00"))
    for (board, window_id), rows in reference.items():
        merged = served.merged(board, window_id)
        assert [(e.player_id, e.rank, e.score, e.sort_key)
                for e in merged.top(len(rows) + 3)] == [
            (r.player_id, r.rank, r.score, r.sort_key) for r in rows], (board, window_id)
        assert merged.total() == len(rows), (board, window_id)


@pytest.fixture
def retained(tmp_path, redis_client):
    """Six days of match events and direct scores on a registry of every aggregation, order
    and tie policy (tests/lakes.py EVERY_KIND), published as of R+5; `control` is a
    copy that retention never touches; in `data` retention (3 days at R+5) deletes the raw
    partitions of R and R+1, so the safe line is R+3. The speed layer is live on the
    version of R+5, with the next morning's events folded."""
    import shutil

    from lakes import EVERY_KIND, land, random_scores

    config = tmp_path / "every.toml"
    write_registry(config, EVERY_KIND)
    registry = registry_from(EVERY_KIND)
    data, control = tmp_path / "data", tmp_path / "control"
    events = [e for e in random_stream(61, start=RETAINED_START, days=6, matches=70,
                                       regions=("na", "eu", "asia"), duplicate_share=0.05,
                                       late_share=0.1)
              + random_scores(62, registry, start=RETAINED_START, days=6, scores=25)
              if e["ingested_at"] < day("2026-11-26T12:00:00")]

    def settings(root: Path) -> Settings:
        return Settings.from_env({"LEADERBOARD_DATA": str(root),
                                  "LEADERBOARD_CONFIG": str(config)})

    land(data / "lake", registry, [e for e in events if e["ingested_at"] < LIVE])
    run_batch(settings(data), date(2026, 11, 25))
    shutil.copytree(data, control)
    speed = SpeedLayer(redis_client, registry, data / "lake")
    speed.rebuild(LIVE)  # landed without a speed layer: built from the lake
    pointer = speed.current()
    assert pointer.watermark == LIVE
    live = SpeedWatermark(present=True, watermark=pointer.watermark, version=pointer.version)
    report = apply_retention(data / "lake", date(2026, 11, 25), 3, speed=live, registry=registry)
    assert report.deleted == ["2026-11-20", "2026-11-21"]
    later = [e for e in events if e["ingested_at"] >= LIVE]
    land(data / "lake", registry, later, writer="x", speed=speed)
    land(control / "lake", registry, later, writer="x")
    return registry, speed, data, control, events, settings


def _absorbed_on(events: list[dict], when: date) -> list[dict]:
    """Events the live version absorbed with event date `when`, first copies only."""
    seen: set[tuple] = set()
    found = []
    for event in sorted(events, key=lambda e: e["ingested_at"]):
        identity = (event.get("board"), event["match_id"], event["player_id"])
        if identity not in seen and event["ingested_at"] < LIVE:
            seen.add(identity)
            if event["event_time"].date() == when:
                found.append(event)
    return found


def test_after_retention_a_void_of_an_absorbed_result_applies_at_once_on_every_aggregation(
        retained, redis_client):
    """After retention, a void of results the live version absorbed (a whole match, one
    player's result, a direct board's best lap) left the live boards only at the next batch
    (the seed of the player's base part gave up once retention had run): the merged
    answers kept the voided results. Now the base part is recomputed as the next batch
    will: rollup rows for dates at or before the safe line, raw rows after it. The merged
    answers (order, scores, sort keys, totals of every board-window: sum both orders and
    ties, max, min, last, direct min and sum) equal the batch of everything less the voided
    rows at once, and still after the next batch and the rebase."""
    registry, speed, data, control, events, settings = retained
    lake, twin = data / "lake", control / "lake"
    assert_served_exactly(lake, twin, registry, redis_client)
    before = reference_standings(twin, registry, None, watermark=day("2100-01-01T00:00:00"))
    on_r4 = _absorbed_on(events, date(2026, 11, 24))
    on_r5 = _absorbed_on(events, date(2026, 11, 25))
    match = next(e["match_id"] for e in on_r4 if not e.get("board"))
    single = max((e for e in on_r5 if not e.get("board")), key=lambda e: e["points"])
    lap = min((e for e in on_r4 + on_r5 if e.get("board") == "best-lap"),
              key=lambda e: e["points"])
    at = day("2026-11-26T13:00:00")
    voids = [(match, None), (single["match_id"], single["player_id"]),
             (lap["match_id"], lap["player_id"])]
    for match_id, player_id in voids:
        write_void(twin, match_id, player_id, at, "exploit")
        applied = speed.void_applied(match_id, player_id, at, "exploit")
        assert applied.players
        assert applied.limit is None
        assert_served_exactly(lake, twin, registry, redis_client)
    after = reference_standings(twin, registry, None, watermark=day("2100-01-01T00:00:00"))
    changed = {registry.board(b).aggregation + ("/direct" if registry.board(b).direct else "")
               for (b, w), rows in after.items() if rows != before.get((b, w))}
    assert changed >= {"sum", "max", "min", "last", "min/direct"}, changed
    told: list[str] = []
    manifest = run_batch(settings(data), date(2026, 11, 26), step=told.append).manifest
    assert any("recomputing the rollups of" in m for m in told), told
    speed.rebase(manifest)
    run_batch(settings(control), date(2026, 11, 26))
    assert_served_exactly(lake, twin, registry, redis_client)


def test_after_retention_a_void_of_results_whose_raw_events_are_gone_says_so(
        retained, redis_client):
    """A void of results on event dates at or before the safe line cannot be applied by
    either layer (their raw events may be gone): before, it was silently not applied. Now
    the void's answer names the results that stay (or says no raw event of it is left),
    the batch's run log says so too, and the live boards keep them, as the batch does."""
    registry, speed, data, control, events, settings = retained
    lake, twin = data / "lake", control / "lake"
    gone = next(e["match_id"] for e in _absorbed_on(events, date(2026, 11, 20))
                if not e.get("board") and all(  # every copy in a deleted partition
                    o["ingested_at"] < day("2026-11-22T00:00:00")
                    for o in events if o["match_id"] == e["match_id"]))
    kept = next(e for e in _absorbed_on(events, date(2026, 11, 22))
                if not e.get("board") and e["ingested_at"] >= day("2026-11-22T00:00:00"))
    at = day("2026-11-26T13:00:00")
    unseen = speed.void_applied(gone, None, at, "exploit").limit
    assert unseen is not None
    assert unseen.unseen
    assert unseen.line == date(2026, 11, 23)
    assert "retention deleted its raw events" in unseen.message()
    applied = speed.void_applied(kept["match_id"], kept["player_id"], at, "exploit")
    assert applied.players == []  # nothing of the player changed
    stays = applied.limit
    assert stays is not None
    assert not stays.unseen
    assert stays.kept == ((kept["player_id"], date(2026, 11, 22)),)
    assert kept["player_id"] in stays.message()
    assert "could not be removed" in stays.message()
    assert_served_exactly(lake, twin, registry, redis_client)  # twin: no void: the same
    told: list[str] = []
    speed.rebase(run_batch(settings(data), date(2026, 11, 26), step=told.append).manifest)
    run_batch(settings(control), date(2026, 11, 26))
    assert any("names no raw event still in the lake" in m for m in told), told
    assert any("retention deleted raw events of 2026-11-22" in m for m in told), told
    assert_served_exactly(lake, twin, registry, redis_client)


def test_after_retention_a_void_on_a_date_whose_raw_events_do_not_add_up_stays_on_both_layers(
        world, redis_client):
    """A result landed twice with different event times (its first copy on 11-20, in a
    partition retention deleted; the copy on 11-24 kept) makes the raw events of 11-24
    count one result more than the base's rollups of that date: the batch refuses to
    recompute 11-24 for every player (leaderboard.retained.redoable, per date). The live
    layer checked only the voided player's rows, removed another player's voided result of
    11-24 at once and answered it removed; the next batch and rebase brought it back. Now
    both decide per date over all players: the void's answer says the result stays, the
    live boards keep it, and the batch agrees."""
    lake, registry, speed, settings = world
    ingest(speed, lake, registry, [_row("xdup", "pq1", 7, "2026-11-20T10:00:00"),
                                   _row("m-a", "ann", 3, "2026-11-20T11:00:00"),
                                   _row("xdup", "pq1", 7, "2026-11-24T10:00:00"),
                                   _row("m-bad", "p000", 10, "2026-11-24T11:00:00"),
                                   _row("m-ok", "p000", 5, "2026-11-24T12:00:00"),
                                   _row("m-b", "ann", 4, "2026-11-25T09:00:00")])
    speed.rebase(run_batch(settings, date(2026, 11, 25)).manifest)

    def score() -> int:
        return all_time_score(lake, registry, redis_client, "2026-11-26T12:00:00")

    assert score() == 15
    pointer = speed.current()
    live = SpeedWatermark(present=True, watermark=pointer.watermark, version=pointer.version)
    assert "2026-11-20" in apply_retention(lake, date(2026, 11, 25), 3, speed=live,
                                           registry=registry).deleted
    applied = speed.void_applied("m-bad", "p000", day("2026-11-26T01:00:00"), "exploit")
    assert applied.players == []  # nothing of p000 changes
    assert applied.limit is not None
    assert applied.limit.kept == (("p000", date(2026, 11, 24)),)
    assert "could not be removed" in applied.limit.message()
    assert "2026-11-24" in applied.limit.message()
    assert score() == 15
    told: list[str] = []
    speed.rebase(run_batch(settings, date(2026, 11, 26), step=told.append).manifest)
    assert any("raw events of 2026-11-24" in m for m in told), told
    assert score() == 15


def test_retention_waits_for_the_live_version_before_deleting_raw_events_a_void_needs(
        world, redis_client):
    """The live layer applies a late void from raw rows the version it serves absorbed.
    Retention checked only the published version: with a newer version published but the
    live layer not rebased yet, it deleted the partition of the voided result, and the next
    recompute of the player on the live version (a ban and an unban) found nothing to
    recompute and brought the voided result back. Now retention waits until the live layer
    serves the published version when a void is late for the live one."""
    lake, registry, speed, settings = world
    ingest(speed, lake, registry, [_row("m-a", "ann", 3, "2026-11-20T11:00:00"),
                                   _row("m-bad", "p000", 10, "2026-11-24T11:00:00"),
                                   _row("m-ok", "p000", 5, "2026-11-24T12:00:00"),
                                   _row("m-b", "ann", 4, "2026-11-25T09:00:00")])
    speed.rebase(run_batch(settings, date(2026, 11, 25)).manifest)

    def score() -> int:
        return all_time_score(lake, registry, redis_client, "2026-11-28T12:00:00")

    assert apply_retention(lake, date(2026, 11, 25), 3, speed=_live(speed),
                           registry=registry).deleted == [
        "2026-11-20"]
    speed.void_applied("m-bad", "p000", day("2026-11-26T01:00:00"), "exploit")
    assert score() == 5
    published = run_batch(settings, date(2026, 11, 26)).manifest  # no rebase yet
    waited = apply_retention(lake, date(2026, 11, 28), 3, speed=_live(speed), registry=registry)
    assert waited.deleted == []
    assert waited.skipped is not None
    assert "rebase" in waited.skipped
    speed.ban("p000", day("2026-11-26T02:00:00"))
    speed.unban("p000", day("2026-11-26T03:00:00"))
    assert score() == 5
    speed.rebase(published)
    assert "2026-11-24" in apply_retention(lake, date(2026, 11, 28), 3, speed=_live(speed),
                                           registry=registry).deleted
    speed.ban("p000", day("2026-11-26T04:00:00"))
    speed.unban("p000", day("2026-11-26T05:00:00"))
    assert score() == 5


def test_after_retention_a_whole_match_void_says_results_in_deleted_partitions_may_stay(
        world, redis_client):
    """A whole match's void after retention lists the results it sees in kept partitions
    on dates at or before the safe line; a result of the same match whose raw row was in a
    deleted partition is not seen, so the list alone read as complete. The message now says
    that results in deleted partitions may stay too, when the void is of a whole match."""
    lake, registry, speed, settings = world
    late = dict(_row("m-x", "dee", 6, "2026-11-21T23:00:00"),
                ingested_at=day("2026-11-22T01:00:00"))
    ingest(speed, lake, registry, [_row("m-x", "ann", 4, "2026-11-21T22:00:00"), late,
                                   _row("m-b", "ann", 4, "2026-11-25T09:00:00")])
    speed.rebase(run_batch(settings, date(2026, 11, 25)).manifest)
    pointer = speed.current()
    live = SpeedWatermark(present=True, watermark=pointer.watermark, version=pointer.version)
    assert apply_retention(lake, date(2026, 11, 25), 3, speed=live, registry=registry).deleted == [
        "2026-11-21"]
    limit = speed.void_applied("m-x", None, day("2026-11-26T01:00:00"), "exploit").limit
    assert limit is not None
    assert limit.kept == (("dee", date(2026, 11, 21)),)
    assert "deleted partitions" in limit.message()
    assert "may" in limit.message()
    one = speed.void_applied("m-b", "ann", day("2026-11-26T02:00:00"), "exploit").limit
    assert one is None  # 11-25 is after the line: removed


def test_after_retention_a_whole_match_void_with_its_late_half_live_says_results_may_stay(
        world, redis_client):
    """A match spanning midnight: ann's result of 11-21 22:50 landed in the partition
    retention deletes, bob's of 11-22 00:10 came late, after the watermark (live). The
    void removes bob's result, and ann's still counts (its raw row is gone), but the
    answer was None, "applied in full": partial was read only from the absorbed results
    that stay. Now it says results in deleted partitions may stay, and names none kept."""
    lake, registry, speed, settings = world
    ingest(speed, lake, registry, [_row("m-z", "ann", 4, "2026-11-21T22:50:00"),
                                   _row("m-b", "ann", 4, "2026-11-25T09:00:00")])
    speed.rebase(run_batch(settings, date(2026, 11, 25)).manifest)
    pointer = speed.current()
    live = SpeedWatermark(present=True, watermark=pointer.watermark, version=pointer.version)
    report = apply_retention(lake, date(2026, 11, 25), 3, speed=live, registry=registry)
    assert report.deleted == ["2026-11-21"], (report.kept, report.skipped)
    ingest(speed, lake, registry, [dict(_row("m-z", "bob", 6, "2026-11-22T00:10:00"),
                                        ingested_at=day("2026-11-26T01:00:00"))])
    assert all_time_score(lake, registry, redis_client, "2026-11-26T02:30:00", "bob") == 6
    applied = speed.void_applied("m-z", None, day("2026-11-26T03:00:00"), "exploit")
    assert applied.players == ["bob"]
    assert applied.limit is not None
    assert (applied.limit.kept, applied.limit.partial) == ((), True)
    assert "deleted partitions" in applied.limit.message()
    assert "may still count" in applied.limit.message()
    assert applied.limit.as_dict()["results"] == []
    assert all_time_score(lake, registry, redis_client, "2026-11-26T03:30:00", "ann") == 8
    one = speed.void_applied("m-b", "ann", day("2026-11-26T04:00:00"), "exploit").limit
    assert one is None  # one player's result after the line: removed in full


def test_a_void_between_midnight_and_that_nights_retention_stays_removed(
        world, redis_client, tmp_path):
    """A void recorded after midnight, before that night's batch and retention, of a
    result on a date after the safe line: the live layer removes it at once (54 -> 4) and
    carries it at the night's rebase. Retention must not then move the safe line onto the
    result's date while no batch has the void: the next batch could not recompute that
    date (the base's rows would stand) and the live layer, its version having the void,
    would not apply it again. The voided result stays removed on every live board and in
    every batch after, as the batch of everything with the void gives."""
    import shutil

    from leaderboard.batch_view import BatchView
    from leaderboard.manifest import read_current

    lake, registry, speed, settings = world
    ingest(speed, lake, registry, [_row("m-a", "ann", 3, "2026-11-20T11:00:00"),
                                   _row("m-c", "ann", 2, "2026-11-22T11:00:00"),
                                   _row("m-bad", "p000", 50, "2026-11-24T11:00:00"),
                                   _row("m-ok", "p000", 4, "2026-11-24T12:00:00"),
                                   _row("m-b", "ann", 4, "2026-11-25T09:00:00")])
    speed.rebase(run_batch(settings, date(2026, 11, 25)).manifest)
    twin = tmp_path / "twin"
    shutil.copytree(lake, twin / "lake")

    def score(now: str) -> int:
        return all_time_score(lake, registry, redis_client, now)

    assert apply_retention(lake, date(2026, 11, 25), 3, speed=_live(speed),
                           registry=registry).deleted == ["2026-11-20"]
    assert score("2026-11-27T00:10:00") == 54
    at = day("2026-11-27T00:30:00")  # after midnight, before the night of 11-26 runs
    write_void(twin / "lake", "m-bad", "p000", at, "wrong score")
    applied = speed.void_applied("m-bad", "p000", at, "wrong score")
    assert (applied.players, applied.limit) == (["p000"], None)  # told: removed
    assert score("2026-11-27T00:40:00") == 4
    # The night of 11-26: batch (the void is after its watermark), rebase, retention.
    speed.rebase(run_batch(settings, date(2026, 11, 26)).manifest)
    assert score("2026-11-27T01:00:00") == 4
    waited = apply_retention(lake, date(2026, 11, 26), 3, speed=_live(speed), registry=registry)
    assert "2026-11-22" in waited.kept
    assert "void" in waited.kept["2026-11-22"]
    # The next night absorbs the void; its retention deletes what the last one kept.
    speed.rebase(run_batch(settings, date(2026, 11, 27)).manifest)
    assert score("2026-11-28T01:00:00") == 4
    assert "2026-11-22" in apply_retention(lake, date(2026, 11, 27), 3, speed=_live(speed),
                                           registry=registry).deleted
    speed.ban("p000", day("2026-11-28T02:00:00"))  # a recompute of the player from the lake
    speed.unban("p000", day("2026-11-28T03:00:00"))
    speed.rebase(run_batch(settings, date(2026, 11, 28)).manifest)
    assert score("2026-11-29T01:00:00") == 4
    view = BatchView(lake, read_current(lake))
    rows = view.standings("global", "all-time").to_pylist()
    assert [r["score"] for r in rows if r["player_id"] == "p000"] == [4]
    assert_served_exactly(lake, twin / "lake", registry, redis_client,
                          now="2026-11-29T01:00:00")


def test_a_direct_score_void_between_a_nights_batch_and_its_retention_stays_removed(
        world, redis_client, tmp_path):
    """Scores submitted to a direct board (`coins`) under one match id over several days,
    absorbed by the live version; after a night's batch and before its retention, a void
    of the whole match: the live layer removes them at once. Retention must not move the
    safe line onto or past their dates while no batch has the void, so the next batch and
    the live boards keep them removed, as the batch of everything with the void gives."""
    import shutil

    lake, registry, speed, settings = world

    def submit(rows: list[dict]) -> None:
        submit_coins(speed, lake, registry, rows)

    ingest(speed, lake, registry, [_row("m-a", "ann", 3, "2026-11-20T11:00:00"),
                                   _row("m-c", "ann", 2, "2026-11-22T11:00:00")])
    submit([_row("m0", "bob", 15, "2026-11-24T10:00:00"),
            _row("m0", "ann", 12, "2026-11-24T11:00:00"),
            _row("m-ok", "ann", 4, "2026-11-24T12:00:00"),
            _row("m0", "eve", 0, "2026-11-25T09:00:00")])
    speed.rebase(run_batch(settings, date(2026, 11, 25)).manifest)
    twin = tmp_path / "twin"
    shutil.copytree(lake, twin / "lake")

    def coins(now: str, player: str) -> int | None:
        served = Leaderboards(lake, registry, redis_client, now=lambda: day(now))
        found = served.player("coins", player, "all-time")
        return None if found.get("score") is None else int(found["score"])

    assert apply_retention(lake, date(2026, 11, 25), 3, speed=_live(speed),
                           registry=registry).deleted == ["2026-11-20"]
    assert (coins("2026-11-27T00:10:00", "ann"), coins("2026-11-27T00:10:00", "bob")) == (
        16, 15)
    # The night of 11-26: the batch, then a whole-match void of m0, then retention.
    speed.rebase(run_batch(settings, date(2026, 11, 26)).manifest)
    at = day("2026-11-27T00:30:00")
    write_void(twin / "lake", "m0", None, at, "exploit")
    speed.void("m0", None, at, "exploit")
    assert (coins("2026-11-27T00:40:00", "ann"), coins("2026-11-27T00:40:00", "bob")) == (
        4, None)
    waited = apply_retention(lake, date(2026, 11, 26), 3, speed=_live(speed), registry=registry)
    assert "void" in waited.kept.get("2026-11-22", ""), waited.as_dict()
    speed.rebase(run_batch(settings, date(2026, 11, 27)).manifest)
    assert (coins("2026-11-28T01:00:00", "ann"), coins("2026-11-28T01:00:00", "bob")) == (
        4, None)
    assert "2026-11-22" in apply_retention(lake, date(2026, 11, 27), 3, speed=_live(speed),
                                           registry=registry).deleted
    speed.rebase(run_batch(settings, date(2026, 11, 28)).manifest)
    assert (coins("2026-11-29T01:00:00", "ann"), coins("2026-11-29T01:00:00", "bob")) == (
        4, None)
    assert_served_exactly(lake, twin / "lake", registry, redis_client,
                          now="2026-11-29T01:00:00")


def test_a_direct_match_void_after_retention_says_its_deleted_results_may_still_count(
        world, redis_client, redis_server, monkeypatch, capsys):
    """A direct board's scores under one match id over several days; retention deletes the
    partition of the first one. A void of the whole match sees only the later score: its
    answer (HTTP and CLI) must not claim every result is removed. It says the match is
    partial and that results ingested on or before the deleted partition may still count,
    which they do (bob's first score stays on the live board)."""
    lake, registry, speed, settings = world

    def submit(rows: list[dict]) -> None:
        submit_coins(speed, lake, registry, rows)

    ingest(speed, lake, registry, [_row("m-a", "ann", 3, "2026-11-20T11:00:00")])
    submit([_row("m0", "bob", 15, "2026-11-20T10:00:00"),
            _row("m0", "eve", 7, "2026-11-25T09:00:00")])
    speed.rebase(run_batch(settings, date(2026, 11, 25)).manifest)
    pointer = speed.current()
    assert apply_retention(lake, date(2026, 11, 25), 3, registry=registry,
                           speed=SpeedWatermark(present=True, watermark=pointer.watermark,
                                                version=pointer.version)
                           ).deleted == ["2026-11-20"]
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    monkeypatch.setenv("LEADERBOARD_DATA", str(settings.lake_dir.parent))
    monkeypatch.setenv("LEADERBOARD_CONFIG", str(settings.config))
    monkeypatch.setenv("LEADERBOARD_NOW", "2026-11-26T00:30:00Z")
    capsys.readouterr()
    assert main(["void", "m0", "--reason", "exploit"]) == 0
    sentence = capsys.readouterr().out
    assert "may still count" in sentence
    assert "2026-11-20" in sentence
    assert main(["void", "m0", "--reason", "exploit", "--json"]) == 0
    said = json.loads(capsys.readouterr().out)["not_removed"]
    assert said is not None, "the answer claims every result of m0 was removed"
    assert said["partial"] is True
    assert said["results"] == []
    assert not said["unseen"]
    assert said["deleted_through"] == "2026-11-20"
    assert "2026-11-20" in said["message"]
    assert "may still count" in said["message"]
    served = Leaderboards(lake, registry, redis_client, now=lambda: day("2026-11-26T00:40:00"))
    assert served.player("coins", "bob", "all-time").get("score") == 15
    assert served.player("coins", "eve", "all-time").get("score") is None
