"""Releasing quarantined rows (issue 12 part 5): validated again, landed once, counted
once by the speed layer and the batch; a second release is a no-op that says so."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.batch import run_batch
from leaderboard.lake import LandingWriter, landed_files
from leaderboard.quarantine import list_quarantine
from leaderboard.registry import load_registry
from leaderboard.schema import TIMESTAMP
from leaderboard.settings import Settings
from serving.service import Leaderboards
from speed_layer.ingest import Ingestor, IngestReport
from speed_layer.review import release_rows
from speed_layer.service import SpeedLayer

pytestmark = pytest.mark.redis

NOW = datetime(2026, 12, 1, 12, 0, 10, tzinfo=UTC)
PLAYED = datetime(2026, 12, 1, 11, tzinfo=UTC)
LATER = NOW + timedelta(hours=1)


def _registry_file(tmp_path: Path, limit: int, regions: str = '"na", "eu", "sa", "asia"'
                   ) -> Path:
    text = (resources.files("leaderboard") / "registries" / "default.toml").read_text()
    text = text.replace("# player_events_per_minute = 120", f"player_events_per_minute = {limit}")
    text = text.replace('regions = ["na", "eu", "sa", "asia"]', f"regions = [{regions}]")
    path = tmp_path / f"registry-{limit}-{len(regions)}.toml"
    path.write_text(text)
    return path


def _settings(tmp_path: Path, limit: int = 2) -> Settings:
    return Settings.from_env({"LEADERBOARD_DATA": str(tmp_path / "data"),
                              "LEADERBOARD_CONFIG": str(_registry_file(tmp_path, limit))})


def _ingest(settings: Settings, speed: SpeedLayer, rows: list[tuple[str, str, int, str]],
            now: datetime = NOW) -> IngestReport:
    table = pa.table({
        "match_id": [r[0] for r in rows], "player_id": [r[1] for r in rows],
        "points": pa.array([r[2] for r in rows], pa.int64()),
        "event_time": pa.array([PLAYED] * len(rows), TIMESTAMP),
        "region": [r[3] for r in rows], "mode": ["ranked"] * len(rows),
        "server_id": ["s1"] * len(rows)})
    with LandingWriter(settings.lake_dir, "w") as writer:
        return Ingestor(speed.registry, writer, speed).ingest(table, now=now, source="test")


def _top(settings: Settings, client: Any) -> list[tuple[str, int]]:
    boards = Leaderboards(settings.lake_dir, settings.registry, client,
                          now=lambda: NOW + timedelta(days=1))
    return [(e["player_id"], e["score"])
            for e in boards.top("global", 10, window="all-time")["entries"]]


def _events(lake: Path) -> list[tuple[str, str]]:
    return sorted((r["match_id"], r["player_id"]) for f in landed_files(lake)
                  for r in pq.read_table(f.path, columns=["match_id", "player_id"]).to_pylist())


def test_a_held_event_is_released_once_and_counted_once_everywhere(tmp_path, redis_client):
    settings = _settings(tmp_path)
    speed = SpeedLayer(redis_client, settings.registry, settings.lake_dir)
    _ingest(settings, speed, [("m1", "alice", 5, "na"), ("m2", "alice", 5, "na"),
                              ("m3", "alice", 40, "na"), ("m1", "bob", 20, "na"),
                              ("m9", "carol", 1, "moon")])
    assert _top(settings, redis_client) == [("bob", 20), ("alice", 10)]
    rows, cursor = list_quarantine(settings.lake_dir, reason="implausible_rate")
    assert cursor is None
    assert [(r.values["match_id"], r.reason) for r in rows] == [("m3", "implausible_rate")]
    held = rows[0].id

    outcomes, fold_error = release_rows(speed, [held, held, "2026-12-01.w.999.0.00000000"], LATER)
    assert fold_error is None
    assert [(o.id, o.status) for o in outcomes] == [(held, "released"),
                                                    ("2026-12-01.w.999.0.00000000", "not_found")]
    assert _top(settings, redis_client) == [("alice", 50), ("bob", 20)]
    # Again: a no-op that says so; the client's own retry of the event is a retry.
    again, _ = release_rows(speed, [held], LATER)
    assert [(o.status, o.detail) for o in again] == [
        ("already_released", "released at 2026-12-01T13:00:10Z; nothing more lands")]
    retry = _ingest(settings, speed, [("m3", "alice", 40, "na")], LATER + timedelta(minutes=5))
    assert (retry.accepted, retry.retries) == (0, 1)
    assert _events(settings.lake_dir).count(("m3", "alice")) == 1
    listed, _ = list_quarantine(settings.lake_dir)
    assert [r.values["match_id"] for r in listed] == ["m3", "m9"]  # the quarantine keeps both
    # The ledger names rows, not players: an erasure has nothing to scrub there.
    ledger = list((settings.lake_dir / "quarantine_releases").glob("*.json"))
    assert ledger
    assert not [f for f in ledger if b"alice" in f.read_bytes()]
    # The batch of everything agrees with the merged answers.
    speed.rebase(run_batch(settings, date(2026, 12, 1)).manifest)
    assert _top(settings, redis_client) == [("alice", 50), ("bob", 20)]


def test_a_row_that_still_fails_validation_stays(tmp_path, redis_client):
    settings = _settings(tmp_path)
    speed = SpeedLayer(redis_client, settings.registry, settings.lake_dir)
    _ingest(settings, speed, [("m9", "carol", 1, "moon")])
    [row], _ = list_quarantine(settings.lake_dir)
    [outcome], _ = release_rows(speed, [row.id], LATER)
    assert (outcome.status, outcome.reason) == ("rejected", "unknown_region")
    assert "it stays in the quarantine" in outcome.detail
    assert _events(settings.lake_dir) == []


def test_a_corrected_resend_makes_the_release_a_duplicate(tmp_path, redis_client):
    """A row quarantined for an unknown region; the game resent the event corrected (same
    identity, accepted); then the region joins the registry. Releasing the old row would
    count the match twice: the door says it already counts."""
    settings = _settings(tmp_path)
    speed = SpeedLayer(redis_client, settings.registry, settings.lake_dir)
    _ingest(settings, speed, [("m9", "carol", 1, "oc")])
    _ingest(settings, speed, [("m9", "carol", 1, "na")], NOW + timedelta(minutes=2))
    wider = load_registry(_registry_file(tmp_path, 2, '"na", "eu", "sa", "asia", "oc"'))
    [row], _ = list_quarantine(settings.lake_dir)
    [outcome], _ = release_rows(SpeedLayer(redis_client, wider, settings.lake_dir), [row.id],
                                LATER)
    assert outcome.status == "duplicate"
    assert _events(settings.lake_dir) == [("m9", "carol")]


def test_a_release_that_died_before_landing_is_done_by_the_next(tmp_path, redis_client,
                                                                 monkeypatch):
    settings = _settings(tmp_path, limit=1)
    speed = SpeedLayer(redis_client, settings.registry, settings.lake_dir)
    _ingest(settings, speed, [("m1", "dan", 1, "na"), ("m2", "dan", 2, "na")])
    [row], _ = list_quarantine(settings.lake_dir)

    def fail(*_args: object, **_kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(LandingWriter, "land", fail)
    with pytest.raises(OSError, match="disk full"):
        release_rows(speed, [row.id], LATER)
    monkeypatch.undo()
    assert list_quarantine(settings.lake_dir)[0][0].id == row.id
    [outcome], _ = release_rows(speed, [row.id], LATER)
    assert outcome.status == "released"
    assert _events(settings.lake_dir) == [("m1", "dan"), ("m2", "dan")]
    assert _top(settings, redis_client) == [("dan", 3)]


def test_a_release_stays_done_after_compaction_removes_its_file(tmp_path, redis_client):
    """Nightly compaction replaces the release's small events file: the ledger's `landed`
    mark (and, for a release that died before marking, the compaction record) keeps the
    release done. Before, the missing file read as "died before landing" and a second
    release landed the event again."""
    import json

    from jobs.compact import SpeedWatermark, compact_partition
    from leaderboard.manifest import watermark_for

    settings = _settings(tmp_path, limit=1)
    speed = SpeedLayer(redis_client, settings.registry, settings.lake_dir)
    _ingest(settings, speed, [("m1", "gus", 1, "na"), ("m2", "gus", 2, "na")])
    [row], _ = list_quarantine(settings.lake_dir)
    assert release_rows(speed, [row.id], LATER)[0][0].status == "released"
    speed.rebase(run_batch(settings, date(2026, 12, 1)).manifest)
    compacted = compact_partition(settings.lake_dir, date(2026, 12, 1), speed=SpeedWatermark(
        present=True, watermark=watermark_for(date(2026, 12, 1))))
    assert compacted.compacted, compacted.left
    assert not [f for f in landed_files(settings.lake_dir) if f.writer == "release"]
    assert release_rows(speed, [row.id], LATER)[0][0].status == "already_released"
    [entry] = (settings.lake_dir / "quarantine_releases").glob("*.json")
    unmarked = json.loads(entry.read_text())
    entry.write_text(json.dumps({**unmarked, "landed": False}))
    assert release_rows(speed, [row.id], LATER)[0][0].status == "already_released"
    assert _events(settings.lake_dir) == [("m1", "gus"), ("m2", "gus")]


def test_rows_whose_short_digests_collide_are_released_apart(tmp_path, redis_client):
    """Two held rows of one quarantine file whose ids carry the same 8-digit digest (a
    pair found by search; ~1 such pair is expected in a file of 100k rows): releasing one
    neither marks nor blocks the other. Before, the ledger keyed releases by file and that
    digest, so the second was listed `released` and answered `already_released` without
    ever landing."""
    from leaderboard.quarantine import released_at, released_ids

    settings = _settings(tmp_path, limit=1)
    speed = SpeedLayer(redis_client, settings.registry, settings.lake_dir)
    _ingest(settings, speed, [("m0", "zed", 1, "na"), ("m80564", "zed", 1, "na"),
                              ("m137919", "zed", 1, "na")])
    first, second = list_quarantine(settings.lake_dir)[0]
    assert first.id.rsplit(".", 1)[1] == second.id.rsplit(".", 1)[1]  # the premise
    assert [o.status for o in release_rows(speed, [first.id], LATER)[0]] == ["released"]
    done = released_ids(settings.lake_dir)
    listed, _ = list_quarantine(settings.lake_dir)
    assert [(r.values["match_id"], released_at(done, r) is not None) for r in listed] == [
        ("m80564", True), ("m137919", False)]
    assert [o.status for o in release_rows(speed, [second.id], LATER)[0]] == ["released"]
    assert [o.status for o in release_rows(speed, [second.id], LATER)[0]] == [
        "already_released"]
    assert _events(settings.lake_dir).count(("m137919", "zed")) == 1
    assert _top(settings, redis_client) == [("zed", 3)]


def test_an_erased_players_rows_are_never_released(tmp_path, redis_client):
    """A held row of a player erased since it was quarantined (the erasure raced the
    ingest, or the row was listed before it) is refused by the erasure ledger; a row
    quarantined `erased` (it holds only a hash of the id) is refused as such. Before, the
    release validated without the ledger and landed the erased player's event again."""
    from leaderboard.erasure import record_erasure

    settings = _settings(tmp_path)
    speed = SpeedLayer(redis_client, settings.registry, settings.lake_dir)
    _ingest(settings, speed, [(f"m{n}", "vic", 1, "na") for n in range(3)])
    record_erasure(settings.lake_dir, "vic", NOW)  # its held row is still quarantined
    record_erasure(settings.lake_dir, "una", NOW)
    _ingest(settings, speed, [("m9", "una", 9, "na")], NOW + timedelta(minutes=1))
    rows, _ = list_quarantine(settings.lake_dir)
    assert [r.reason for r in rows] == ["implausible_rate", "erased"]
    outcomes, _ = release_rows(speed, [r.id for r in rows], LATER)
    assert [(o.status, o.reason) for o in outcomes] == [("rejected", "erased"),
                                                        ("rejected", "erased")]
    assert _events(settings.lake_dir) == [("m0", "vic"), ("m1", "vic")]


def _scores(settings: Settings, speed: SpeedLayer, rows: list[tuple[str, str, int]],
            now: datetime = NOW, played: datetime = PLAYED) -> IngestReport:
    """Scores to the default registry's direct board `best-lap` (min), as the HTTP route
    submits them."""
    table = pa.table({
        "match_id": [r[0] for r in rows], "player_id": [r[1] for r in rows],
        "points": pa.array([r[2] for r in rows], pa.int64()),
        "event_time": pa.array([played] * len(rows), TIMESTAMP),
        "server_id": ["s1"] * len(rows)})
    with LandingWriter(settings.lake_dir, "w") as writer:
        return Ingestor(speed.registry, writer, speed).ingest(
            table, now=now, source="test", board=settings.registry.board("best-lap"))


def _laps(settings: Settings, client: Any) -> list[tuple[str, int]]:
    boards = Leaderboards(settings.lake_dir, settings.registry, client,
                          now=lambda: NOW + timedelta(days=1))
    return [(e["player_id"], e["score"])
            for e in boards.top("best-lap", 10, window="all-time")["entries"]]


def test_a_held_score_is_released_once_onto_its_board(tmp_path, redis_client):
    """Regression (direct scores had no per-player rate hold, and a quarantined score could
    not be released: it was validated as a match event, with no region): scores count
    against the player's minute with their events; the held one keeps its board in the
    quarantine, a release lands it there once, and the batch agrees."""
    settings = _settings(tmp_path)
    speed = SpeedLayer(redis_client, settings.registry, settings.lake_dir)
    _ingest(settings, speed, [("m1", "alice", 5, "na")])
    report = _scores(settings, speed, [("lap-1", "alice", 900), ("lap-2", "alice", 700)])
    assert (report.accepted, report.reasons["implausible_rate"]) == (1, 1)
    assert _laps(settings, redis_client) == [("alice", 900)]
    [row], _ = list_quarantine(settings.lake_dir, reason="implausible_rate")
    assert (row.board, row.values["match_id"]) == ("best-lap", "lap-2")
    assert row.as_dict()["board"] == "best-lap"
    # The held score's retry is a retry (its claim stands), not a new event.
    retry = _scores(settings, speed, [("lap-2", "alice", 700)], NOW + timedelta(minutes=5))
    assert (retry.accepted, retry.retries) == (0, 1)

    [outcome], fold_error = release_rows(speed, [row.id], LATER)
    assert (outcome.status, fold_error) == ("released", None)
    assert _laps(settings, redis_client) == [("alice", 700)]
    [again], _ = release_rows(speed, [row.id], LATER)
    assert again.status == "already_released"
    landed = [r for f in landed_files(settings.lake_dir)
              for r in pq.read_table(f.path, columns=["match_id", "board"]).to_pylist()]
    assert landed.count({"match_id": "lap-2", "board": "best-lap"}) == 1
    speed.rebase(run_batch(settings, date(2026, 12, 1)).manifest)
    assert _laps(settings, redis_client) == [("alice", 700)]
    assert _top(settings, redis_client) == [("alice", 5)]  # the lap counts on best-lap only


def test_a_refused_score_is_validated_again_as_a_score_to_its_board(tmp_path, redis_client):
    """Regression: a score refused for a time ahead of the clock was released as a match
    event (refused again: no region); now it is judged as a score to its board, and lands
    there once its time has come."""
    settings = _settings(tmp_path)
    speed = SpeedLayer(redis_client, settings.registry, settings.lake_dir)
    report = _scores(settings, speed, [("lap-9", "bob", 650)], played=NOW + timedelta(hours=1))
    assert report.reasons == {"event_time_in_future": 1}
    [row], _ = list_quarantine(settings.lake_dir)
    assert row.board == "best-lap"
    [early], _ = release_rows(speed, [row.id], NOW)
    assert (early.status, early.reason) == ("rejected", "event_time_in_future")
    [outcome], _ = release_rows(speed, [row.id], LATER + timedelta(minutes=1))
    assert outcome.status == "released", outcome
    assert _laps(settings, redis_client) == [("bob", 650)]


def test_a_score_whose_board_left_the_registry_is_quarantined_as_unknown_board(
        tmp_path, redis_client):
    """Regression (issue 12: `unknown_board` was only an answer of the release, the score
    stayed listed under its old reason, so `?reason=unknown_board` never found it): released
    after its board left the registry, a score is quarantined again with reason
    `unknown_board` (the old row marked released), never lost; released again while the
    board is still gone it stays put; once the board is back it lands there once."""
    settings = _settings(tmp_path)
    speed = SpeedLayer(redis_client, settings.registry, settings.lake_dir)
    report = _scores(settings, speed, [("lap-7", "cy", 640)], played=NOW + timedelta(hours=1))
    assert report.reasons == {"event_time_in_future": 1}
    [row], _ = list_quarantine(settings.lake_dir)
    text = _registry_file(tmp_path, 2).read_text()
    without = tmp_path / "without-best-lap.toml"
    without.write_text(text.replace('name = "best-lap"', 'name = "best-lap-2"'))
    gone = Settings.from_env({"LEADERBOARD_DATA": str(settings.data_dir),
                              "LEADERBOARD_CONFIG": str(without)})
    other = SpeedLayer(redis_client, gone.registry, gone.lake_dir)

    [outcome], _ = release_rows(other, [row.id], LATER + timedelta(minutes=1))
    assert (outcome.status, outcome.reason) == ("requarantined", "unknown_board")
    [moved], _ = list_quarantine(settings.lake_dir, reason="unknown_board")
    assert moved.id in outcome.detail
    assert (moved.board, moved.values["match_id"], moved.values["points"]) == (
        "best-lap", "lap-7", "640")
    assert moved.values["event_time"] == row.values["event_time"]  # as sent
    # Nothing landed from the old row: released again, it names its new row (review s6:
    # it answered already_released, "an earlier release landed it").
    [again], _ = release_rows(other, [row.id], LATER + timedelta(minutes=1))
    assert (again.status, again.reason) == ("requarantined", "unknown_board")
    assert moved.id in again.detail
    assert "nothing landed" in again.detail
    [stays], _ = release_rows(other, [moved.id], LATER + timedelta(minutes=2))
    assert (stays.status, stays.reason) == ("rejected", "unknown_board")
    assert len(list_quarantine(settings.lake_dir)[0]) == 2  # nothing more written

    [landed], _ = release_rows(speed, [moved.id], LATER + timedelta(minutes=3))
    assert landed.status == "released", landed
    assert _laps(settings, redis_client) == [("cy", 640)]
    assert _events(settings.lake_dir).count(("lap-7", "cy")) == 1


def test_scores_requarantined_into_several_files_each_name_their_new_row(
        tmp_path, redis_client, monkeypatch):
    """Review s6: the ledger kept only the first new file's seq when the writer split the
    moved rows into several files, and a second release of an old id answered
    `already_released`. Every old id answers `requarantined` with its own new row's id, at
    once and when released again; nothing lands, and each new row lands once the board is
    back."""
    import leaderboard.lake as lake_module

    settings = _settings(tmp_path)
    speed = SpeedLayer(redis_client, settings.registry, settings.lake_dir)
    _scores(settings, speed, [("lap-7", "cy", 640), ("lap-8", "di", 610)],
            played=NOW + timedelta(hours=1))
    old = list_quarantine(settings.lake_dir)[0]
    without = tmp_path / "without-best-lap.toml"
    without.write_text(_registry_file(tmp_path, 2).read_text().replace(
        'name = "best-lap"', 'name = "best-lap-2"'))
    gone = Settings.from_env({"LEADERBOARD_DATA": str(settings.data_dir),
                              "LEADERBOARD_CONFIG": str(without)})
    other = SpeedLayer(redis_client, gone.registry, gone.lake_dir)
    monkeypatch.setattr(lake_module, "BACKFILL_FILE_ROWS", 1)  # one new file per row

    first, _ = release_rows(other, [r.id for r in old], LATER + timedelta(minutes=1))
    moved = list_quarantine(settings.lake_dir, reason="unknown_board")[0]
    assert len({m.id.split(".")[2] for m in moved}) == 2  # two files, two seqs
    by_match = {m.values["match_id"]: m.id for m in moved}
    want = [by_match[r.values["match_id"]] for r in old]
    for outcomes in (first, release_rows(other, [r.id for r in old],
                                         LATER + timedelta(minutes=2))[0]):
        assert [o.status for o in outcomes] == ["requarantined"] * 2
        assert [re.search(r"quarantined again as (\S+) with", o.detail)[1]  # type: ignore
                for o in outcomes] == want
    assert _events(settings.lake_dir) == []

    monkeypatch.undo()
    landed, _ = release_rows(speed, want, LATER + timedelta(minutes=3))
    assert [o.status for o in landed] == ["released"] * 2
    assert _laps(settings, redis_client) == [("di", 610), ("cy", 640)]
