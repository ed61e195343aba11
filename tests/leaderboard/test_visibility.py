"""Health's check for accepted events on no live board (`invisible_files`): the same answer
as a look at the whole lake, while it lists again only partitions that changed."""

from __future__ import annotations

import os
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa

import leaderboard.visibility as visibility
from jobs.batch import run_batch
from leaderboard.lake import LandingWriter, landed_files
from leaderboard.manifest import read_current
from leaderboard.schema import TIMESTAMP
from leaderboard.settings import Settings

DAY = datetime(2026, 11, 28, tzinfo=UTC)


def _land(lake: Path, writer: str, at: datetime) -> None:
    """One event landed at `at` (its event_time too), by a bare writer: no door, no cut."""
    with LandingWriter(lake, writer) as handle:
        handle.land(pa.table({
            "match_id": [f"m-{writer}-{at:%d%H}"], "player_id": ["p1"],
            "points": pa.array([5], pa.int64()), "event_time": pa.array([at], TIMESTAMP),
            "region": ["eu"], "mode": ["ranked"], "server_id": ["s1"]}), at)


def _settle(lake: Path) -> None:
    """Age every partition directory's mtime, as if nothing had landed for a while."""
    past = time.time() - 60
    for partition in (lake / "events").iterdir():
        os.utime(partition, (past, past))


def test_health_lists_only_changed_partitions_and_still_finds_a_late_landing(
        tmp_path, monkeypatch):
    """At one version, a second look lists no partition; a file landed afterwards with a
    clock in the past (rows before the watermark, unread) is found at the next look, which
    lists its partition only; the answer equals the check over the whole lake."""
    lake = tmp_path / "lake"
    for offset in range(3):
        _land(lake, "a", DAY + timedelta(days=offset, hours=10))
    run_batch(Settings.from_env({"LEADERBOARD_DATA": str(tmp_path)}), date(2026, 11, 30))
    version = read_current(lake)
    _settle(lake)
    assert visibility.invisible_files(lake, version) == []
    listed: list[list[date] | None] = []

    def spy(lake: Path, **kwargs):
        days = kwargs.get("days")
        listed.append(None if days is None else sorted(days))
        return landed_files(lake, **kwargs)

    monkeypatch.setattr(visibility, "landed_files", spy)
    assert visibility.invisible_files(lake, version) == []
    assert listed == []
    _land(lake, "late", DAY + timedelta(hours=11))  # the first day's partition, unread
    found = visibility.invisible_files(lake, version)
    assert [f.writer for f in found] == ["late"]
    assert listed == [[DAY.date()]]
    assert found == visibility.unread_before(lake, version, landed_files(lake))


def _counting(monkeypatch) -> list[str]:
    """The names of the files whose footer health reads (`stamp_range`), in order."""
    read: list[str] = []

    def counted(path: Path, *args):
        read.append(path.name)
        return landed_stamp_range(path, *args)

    landed_stamp_range = visibility.stamp_range
    monkeypatch.setattr(visibility, "stamp_range", counted)
    return read


def test_under_steady_ingest_an_open_days_health_reads_each_new_file_once(
        tmp_path, monkeypatch):
    """An open day's version (watermark 13:00) while files keep landing in its day: each look
    answers as the check over the whole lake, and reads the footer of the files landed since
    the previous look only; a file landed with a clock before the watermark is found."""
    lake = tmp_path / "lake"
    _land(lake, "a", DAY + timedelta(hours=10))
    cut = DAY + timedelta(hours=13)
    run_batch(Settings.from_env({"LEADERBOARD_DATA": str(tmp_path)}), DAY.date(), now=cut,
              allow_open_day=True)
    version = read_current(lake)
    assert version.watermark_at == cut
    read = _counting(monkeypatch)

    def look() -> list[str]:
        """The writers of the invisible files; `read` keeps the footers this look read."""
        read.clear()
        found = visibility.invisible_files(lake, version)
        reads = list(read)
        assert found == visibility.unread_before(lake, version, landed_files(lake))
        read[:] = reads
        return [f.writer for f in found]

    for minute in range(3):
        _land(lake, f"w{minute}", cut + timedelta(minutes=minute))
    assert look() == []
    assert sorted(read) == sorted(f.path.name for f in landed_files(lake) if f.writer != "a")
    _land(lake, "next", cut + timedelta(minutes=5))
    assert look() == []
    assert read == [f.path.name for f in landed_files(lake) if f.writer == "next"]
    assert look() == []
    assert read == []
    _land(lake, "behind", cut - timedelta(minutes=5))  # a clock behind the cut, no door
    assert look() == ["behind"]
    assert read == [f.path.name for f in landed_files(lake) if f.writer == "behind"]


def test_health_never_lists_the_day_of_a_midnight_watermark(tmp_path, monkeypatch):
    """After an ended night's version (watermark at the next midnight) files landing that
    next day are never listed nor read: none can hold rows before the watermark."""
    lake = tmp_path / "lake"
    _land(lake, "a", DAY + timedelta(hours=10))
    run_batch(Settings.from_env({"LEADERBOARD_DATA": str(tmp_path)}), DAY.date())
    version = read_current(lake)
    _settle(lake)
    assert visibility.invisible_files(lake, version) == []
    listed: list[list[date] | None] = []

    def spy(lake: Path, **kwargs):
        listed.append(sorted(kwargs.get("days") or []))
        return landed_files(lake, **kwargs)

    monkeypatch.setattr(visibility, "landed_files", spy)
    read = _counting(monkeypatch)
    for hour in (1, 2):
        _land(lake, f"today{hour}", DAY + timedelta(days=1, hours=hour))
        assert visibility.invisible_files(lake, version) == []
    assert listed == []
    assert read == []
