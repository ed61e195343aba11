"""Retention: old raw partitions go only when nothing needs them, and nothing changes."""

from __future__ import annotations

import json
import shutil
from datetime import date, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lakes import day, land, land_legacy_backfill, random_stream
from views import published_standings

from jobs import retention
from jobs.batch import run_batch
from jobs.compact import SpeedWatermark, compact_partition
from jobs.retention import (
    LEDGER,
    apply_retention,
    deleted_through,
    expired_partitions,
    partition_blocker,
    retention_cutoff,
    speed_version_tags,
    stale_speed_tags,
)
from leaderboard.lake import landed_files
from leaderboard.manifest import list_versions, read_current, watermark_for
from leaderboard.registry import load_registry
from leaderboard.schema import EVENT_SCHEMA, TIMESTAMP
from leaderboard.settings import Settings
from leaderboard.voids import write_void

START = day("2026-11-20")
D = date(2026, 11, 20)
NO_SPEED = SpeedWatermark(present=False)


def settings_for(data: Path) -> Settings:
    return Settings.from_env({"LEADERBOARD_DATA": str(data)})


def partitions(lake: Path) -> list[date]:
    return sorted({f.ingest_date for f in landed_files(lake)})


def nights(data: Path, first: date, last: date) -> None:
    as_of = first
    while as_of <= last:
        run_batch(settings_for(data), as_of)
        as_of += timedelta(days=1)


@pytest.fixture
def world(tmp_path):
    """Six days landed, nights run in order through D+5, and an untouched copy (`control`).

    No re-deliveries in this stream: a re-delivery of an event whose raw row retention
    deleted cannot be deduped any more (see docs/architecture.md), by design.
    """
    data = tmp_path / "data"
    land(data / "lake", load_registry(), random_stream(
        9, start=START, days=6, matches=120, duplicate_share=0.0, late_share=0.15))
    nights(data, D, D + timedelta(days=5))
    control = tmp_path / "control"
    shutil.copytree(data, control)
    return data, control


# -- pure -----------------------------------------------------------------------------------

def test_cutoff_and_expired_partitions():
    cutoff = retention_cutoff(date(2026, 12, 31), 30)
    assert cutoff == date(2026, 12, 1)
    days = [date(2026, 11, 30), date(2026, 12, 1), date(2026, 11, 2), date(2026, 11, 30)]
    assert expired_partitions(days, cutoff) == [date(2026, 11, 2), date(2026, 11, 30)]


def test_partition_blocker_names_what_still_needs_the_partition():
    class Live:
        version, as_of, as_of_date = "v", D.isoformat(), D

    mark = watermark_for(D)
    early = mark - timedelta(hours=3)
    ok = partition_blocker(D, [("a", early)], absorbed={"a"}, published=Live(), watermark=mark)
    assert ok is None
    assert "not absorbed" in partition_blocker(D, [("a", early), ("b", early)], absorbed={"a"},
                                               published=Live(), watermark=mark)
    assert "at or after" in partition_blocker(D, [("a", mark)], absorbed={"a"},
                                              published=Live(), watermark=mark)
    assert "newer" in partition_blocker(D + timedelta(days=1), [], absorbed=set(),
                                        published=Live(), watermark=mark)


def test_stale_speed_tags_are_every_version_but_the_live_one():
    keys = [b"lb:20261120aaaaaa:progress", "lb:20261120aaaaaa:windows",
            b"lb:20261121bbbbbb:windows", b"lb:{global|all-time}:20261119cccccc:M",
            b"lb:current", b"lb:banned", b"lb:20261122dddddd:progress"]
    assert stale_speed_tags(keys, "20261122dddddd") == {"20261120aaaaaa", "20261121bbbbbb"}


def test_retention_requires_the_data_dirs_registry(tmp_path):
    """The registry draws the safe line (its future_skew): a call without it is refused
    before anything is read or deleted, rather than drawing the line of another registry."""
    with pytest.raises(TypeError, match="registry"):
        apply_retention(tmp_path / "lake", D, 2, speed=NO_SPEED)  # type: ignore[call-arg]
    assert not (tmp_path / "lake").exists()


# -- on a lake ------------------------------------------------------------------------------

def test_old_absorbed_partitions_go_and_later_nights_publish_the_same(world):
    data, control = world
    lake = data / "lake"
    as_of = D + timedelta(days=5)
    report = apply_retention(lake, as_of, 2, speed=NO_SPEED, registry=load_registry())
    cutoff = as_of - timedelta(days=2)
    assert report.cutoff == cutoff
    assert [date.fromisoformat(d) for d in report.deleted] == [
        d for d in partitions(control / "lake") if d < cutoff]
    assert all(d >= cutoff for d in partitions(lake))
    assert not (lake / "events" / f"ingest_date={D}").exists()
    assert deleted_through(lake) == cutoff - timedelta(days=1)
    # rollups, standings and manifests are untouched: the live version reads as before
    assert published_standings(lake) == published_standings(control / "lake")
    assert len(list_versions(lake)) == len(list_versions(control / "lake"))
    # rerunning is a no-op; later incremental nights equal the untouched lake's
    assert apply_retention(lake, as_of, 2, speed=NO_SPEED, registry=load_registry()).deleted == []
    for later in (as_of + timedelta(days=1), as_of + timedelta(days=3)):
        ours, theirs = run_batch(settings_for(data), later), run_batch(settings_for(control),
                                                                      later)
        assert ours.mode == theirs.mode == "incremental"
        assert ours.events == theirs.events
        assert published_standings(lake) == published_standings(control / "lake")


def test_a_full_recompute_to_publish_after_retention_is_refused_before_any_work(world):
    """Regression (found by the stateful model: a night run with --full after retention
    published standings without the deleted events' results; only the DAG's validation
    refused it): refused before any work, the live version stays; the night runs
    incremental, equal to the untouched lake's."""
    from jobs.batch import FullAfterRetention

    data, control = world
    lake = data / "lake"
    as_of = D + timedelta(days=5)
    apply_retention(lake, as_of, 2, speed=NO_SPEED, registry=load_registry())
    live = read_current(lake)
    with pytest.raises(FullAfterRetention, match="without --full"):
        run_batch(settings_for(data), as_of + timedelta(days=1), full=True)
    assert read_current(lake) == live
    ours = run_batch(settings_for(data), as_of + timedelta(days=1))
    theirs = run_batch(settings_for(control), as_of + timedelta(days=1))
    assert (ours.mode, ours.events) == ("incremental", theirs.events)
    assert published_standings(lake) == published_standings(control / "lake")


def test_a_compacted_partition_goes_like_any_other(world):
    data, _control = world
    lake = data / "lake"
    compact_partition(lake, D, speed=NO_SPEED)
    assert any(f.writer == "compact" and f.ingest_date == D for f in landed_files(lake))
    report = apply_retention(lake, D + timedelta(days=5), 2, speed=NO_SPEED,
                             registry=load_registry())
    assert D.isoformat() in report.deleted
    assert not (lake / "events" / f"ingest_date={D}").exists()


def test_partitions_something_still_needs_stay(world):
    data, _control = world
    lake = data / "lake"
    # a backfill file in partition D with a row stamped after the live watermark
    late_stamp = watermark_for(D + timedelta(days=5)) + timedelta(hours=1)
    rows = [{"match_id": "bf", "player_id": f"p{i}", "points": 1, "event_time": START,
             "region": "na", "mode": "ranked", "server_id": "s"} for i in range(2)]
    backfill = land_legacy_backfill(lake, "bf", pa.Table.from_pylist(rows, schema=EVENT_SCHEMA),
                                    pa.array([START, late_stamp], TIMESTAMP))
    assert backfill.ingest_date == D
    # the speed layer on an older version keeps what it may still fold
    behind = SpeedWatermark(present=True, watermark=watermark_for(D + timedelta(days=1)))
    report = apply_retention(lake, D + timedelta(days=5), 2, speed=behind, dry_run=True,
                             registry=load_registry())
    # (it folds rows from D+2 00:00 on: partition D+1 is done with, D+2 is not)
    assert str(D + timedelta(days=2)) in report.kept
    assert str(D + timedelta(days=1)) in report.deleted
    assert apply_retention(lake, D + timedelta(days=5), 2,
                           speed=SpeedWatermark(present=True), registry=load_registry()).skipped
    report = apply_retention(lake, D + timedelta(days=5), 2, speed=NO_SPEED,
                             registry=load_registry())
    assert str(D) in report.kept
    assert str(D) not in report.deleted
    assert backfill.path.exists()
    assert len(report.deleted) >= 1


def test_nothing_goes_before_a_version_is_published(tmp_path):
    lake = tmp_path / "lake"
    land(lake, load_registry(), random_stream(3, start=START, days=2, matches=20))
    before = landed_files(lake)
    report = apply_retention(lake, D + timedelta(days=30), 1, speed=NO_SPEED,
                             registry=load_registry())
    assert report.skipped
    assert landed_files(lake) == before
    assert not (lake / LEDGER).exists()


def test_dry_run_deletes_nothing(world):
    lake = world[0] / "lake"
    before = landed_files(lake)
    report = apply_retention(lake, D + timedelta(days=5), 2, speed=NO_SPEED, dry_run=True,
                             registry=load_registry())
    assert report.deleted
    assert landed_files(lake) == before
    assert deleted_through(lake) is None


def test_the_ledger_accumulates(world):
    lake = world[0] / "lake"
    apply_retention(lake, D + timedelta(days=3), 2, speed=NO_SPEED, registry=load_registry())
    apply_retention(lake, D + timedelta(days=5), 2, speed=NO_SPEED, registry=load_registry())
    ledger = json.loads((lake / LEDGER).read_text())
    assert ledger["deleted_through"] == str(D + timedelta(days=2))
    assert ledger["partitions"] == sorted(ledger["partitions"])
    assert read_current(lake) is not None


@pytest.mark.redis
def test_speed_version_tags_skips_versions_already_expiring(redis_client):
    from leaderboard.speed_keys import progress_key, windows_key

    for tag in ("20261120aaaaaa", "20261121bbbbbb"):
        redis_client.hset(progress_key(tag), "t", 3)
        redis_client.sadd(windows_key(tag), "global|all-time")
    redis_client.expire(progress_key("20261121bbbbbb"), 60)
    redis_client.expire(windows_key("20261121bbbbbb"), 60)
    assert speed_version_tags(redis_client) == {"20261120aaaaaa"}


def test_main_reports_a_dry_run_from_the_command_line(world, clean_env, capsys):
    from jobs.retention import main

    data, _control = world
    before = landed_files(data / "lake")
    assert main(["--as-of", str(D + timedelta(days=5)), "--data", str(data), "--dry-run"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cutoff"] == str(D + timedelta(days=5 - 30))  # the shipped 30 days
    assert report["deleted"] == []
    assert landed_files(data / "lake") == before


def test_retention_lists_only_the_expired_partitions(world, partitions_listed):
    """Retention lists the files and compaction records of the partitions past the horizon
    only (it listed every partition's files: with a long retention_days, a cost that grew
    with the history), and still deletes an expired compacted one."""
    data, _control = world
    lake = data / "lake"
    compact_partition(lake, D, speed=NO_SPEED)
    as_of = D + timedelta(days=5)
    expired = {d.isoformat() for d in partitions(lake) if d < as_of - timedelta(days=3)}
    partitions_listed.clear()
    report = apply_retention(lake, as_of, 3, speed=NO_SPEED, registry=load_registry())
    assert set(report.deleted) == expired
    assert partitions_listed == expired
    assert not (lake / "events" / f"ingest_date={D}").exists()


def test_a_late_void_is_found_while_compaction_replaces_the_files_it_reads(world,
                                                                          monkeypatch):
    """Compaction of a partition run between retention's listing of the lake and its read
    of the files (the originals deleted once the compacted file is written): the result a
    void the live version has not absorbed names is still found there, as without the
    compaction, so the safe line stays before it."""
    data, _control = world
    lake = data / "lake"
    published = read_current(lake)
    assert published is not None
    row = pq.read_table(landed_files(lake, days=[D])[0].path).to_pylist()[0]
    write_void(lake, row["match_id"], row["player_id"],
               published.watermark_at + timedelta(hours=1), reason="late")
    expected = retention._late_result(lake, published, NO_SPEED)
    assert expected is not None
    assert expected.day == row["event_time"].date()
    listed = retention.landed_files
    compacted: list[int] = []

    def compaction_meanwhile(*args, **kwargs):
        files = listed(*args, **kwargs)
        if not compacted:
            report = compact_partition(lake, D, speed=NO_SPEED)
            compacted.append(sum(c["originals"] for c in report.compacted))
        return files

    monkeypatch.setattr(retention, "landed_files", compaction_meanwhile)
    assert retention._late_result(lake, published, NO_SPEED) == expected
    assert compacted[0] > 1, "files listed were deleted before being read"
