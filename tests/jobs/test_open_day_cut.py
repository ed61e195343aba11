"""The cut of an open day's batch (`batch --allow-open-day`): a landing stamped before the
instant the batch reads the lake is in the version or stays a speed event, never neither,
whatever the interleaving of the landing's clock, its rename and the batch's listing."""

from __future__ import annotations

import subprocess
import sys
import threading
from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
import pytest
from lakes import day

from jobs import batch
from jobs.batch import run_batch
from leaderboard import faults
from leaderboard import lake as lake_module
from leaderboard.lake import LandingWriter, landed_files, landing_floor, landing_lock_path
from leaderboard.manifest import list_versions
from leaderboard.registry import load_registry
from leaderboard.schema import TIMESTAMP
from leaderboard.settings import Settings
from leaderboard.visibility import invisible_files
from serving.service import Leaderboards
from speed_layer.ingest import Ingestor
from speed_layer.service import SpeedLayer

pytestmark = pytest.mark.redis
TODAY = date(2026, 12, 1)
CUT = day("2026-12-01T13:00:00")
#: Both landings read their clock one second before the batch's cut.
BEFORE_CUT = CUT - timedelta(seconds=1)


def _one(player: str, points: int, at: datetime) -> pa.Table:
    return pa.table({"match_id": [f"m-{player}"], "player_id": [player],
                     "points": pa.array([points], pa.int64()),
                     "event_time": pa.array([at - timedelta(minutes=5)], TIMESTAMP),
                     "region": ["eu"], "mode": ["ranked"], "server_id": ["s1"]})


def _ingest(speed: SpeedLayer, writer: str, player: str, points: int, now: datetime) -> None:
    with LandingWriter(speed.lake, writer) as handle:
        report = Ingestor(speed.registry, handle, speed).ingest(
            _one(player, points, now), now=now, source="t")
    assert report.accepted == 1


def test_landings_stamped_before_an_open_days_cut_stay_on_the_live_boards(
        tmp_path, redis_client):
    """Two landings read their clock a second before the cut: one is still in flight (its
    ids claimed, its file not yet renamed) when the batch starts, and is held there until
    the batch has listed the lake or for 3 s; the other starts only after the listing. The
    batch's version reads the first, the second is stamped at the cut and folded: every
    event is on the live boards with its points, and no landed file is invisible."""
    registry = load_registry()
    lake = tmp_path / "lake"
    settings = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path)})
    speed = SpeedLayer(redis_client, registry, lake)
    _ingest(speed, "morning", "early", 5, day("2026-12-01T10:00:00"))
    released, landed = threading.Event(), threading.Event()

    def in_flight() -> None:
        try:
            _ingest(speed, "flight", "inflight", 7, BEFORE_CUT)
        finally:
            landed.set()

    flight = threading.Thread(target=in_flight)

    def hold_the_landing(_name: str) -> None:
        if threading.current_thread() is flight:
            entered.set()
            released.wait(timeout=3)

    def after_listing(_name: str) -> None:
        released.set()
        assert landed.wait(timeout=30)
        _ingest(speed, "late", "late", 9, BEFORE_CUT)

    entered = threading.Event()
    with faults.injected("ingest.after_claim", hold_the_landing), \
            faults.injected("batch.rollups", after_listing):
        flight.start()
        assert entered.wait(timeout=30)
        result = run_batch(settings, TODAY, now=CUT, allow_open_day=True)
        flight.join(timeout=30)
    manifest = result.manifest
    assert manifest.watermark_at == CUT
    speed.rebase(manifest)
    served = Leaderboards(lake, registry, redis_client, now=lambda: CUT + timedelta(hours=1))
    got = {p: served.player("global", p, "daily:2026-12-01")["score"]
           for p in ("early", "inflight", "late")}
    assert got == {"early": 5, "inflight": 7, "late": 9}
    assert invisible_files(lake, manifest) == []
    assert len(landed_files(lake)) == 3


#: A process that takes a landing lock, says so, and stops itself (SIGSTOP) while holding it:
#: a writer suspended in the middle of a landing.
_HOLDER = """
import fcntl, os, signal, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""


def test_an_open_days_batch_refuses_a_writer_stopped_inside_a_landing(
        tmp_path, redis_client, monkeypatch, capsys):
    """A writer's process stopped while it holds its landing lock: `batch --allow-open-day`
    waits a bounded time, saying for which writer, then exits 2 naming it and what to do;
    nothing is published and the recorded cut stays. Once the writer is gone the same batch
    publishes a version of the open day at its cut."""
    registry = load_registry()
    lake = tmp_path / "lake"
    speed = SpeedLayer(redis_client, registry, lake)
    _ingest(speed, "cli", "early", 5, day("2026-12-01T10:00:00"))
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER,
                               str(landing_lock_path(lake, "cli"))],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        monkeypatch.setattr(lake_module, "LANDING_SETTLE_WAIT", timedelta(seconds=0.2))
        monkeypatch.setenv("LEADERBOARD_NOW", CUT.isoformat())
        code = batch.main(["--as-of", "2026-12-01", "--allow-open-day",
                           "--data", str(tmp_path)])
        err = capsys.readouterr().err
        assert code == 2
        assert "waiting for writer cli's landing in flight" in err
        assert "error: writer cli has held its landing lock for 0.2 s" in err
        assert "resume or stop that writer, then run the batch again" in err
        assert "Traceback" not in err
        assert list_versions(lake) == []
        assert landing_floor(lake) == CUT
    finally:
        holder.kill()
        holder.wait()
    settings = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path)})
    result = run_batch(settings, TODAY, now=CUT, allow_open_day=True)
    assert result.manifest.watermark_at == CUT


def test_an_open_days_batch_refuses_a_clock_ahead_of_the_wall_clock(tmp_path, monkeypatch,
                                                                   capsys):
    """`--allow-open-day` with LEADERBOARD_NOW two days ahead of the wall clock exits 2
    saying so (its cut would stamp every later landing at that future instant): no cut is
    recorded, nothing is published."""
    ahead = datetime.now(UTC) + timedelta(days=2)
    monkeypatch.setenv("LEADERBOARD_NOW", ahead.isoformat())
    code = batch.main(["--as-of", ahead.date().isoformat(), "--allow-open-day",
                       "--data", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert "error: --allow-open-day with a clock ahead of the wall clock" in err
    assert "Run it without --now / LEADERBOARD_NOW" in err
    lake = tmp_path / "lake"
    assert landing_floor(lake) is None
    assert list_versions(lake) == []


def test_the_cut_is_shown_while_ahead_of_the_clock_and_retired_once_a_version_passes_it(
        tmp_path, redis_client):
    """The open day's own version keeps its cut; the next night's version, whose watermark
    is past it, retires it. A cut recorded ahead of the wall clock is shown by the speed
    layer's status (`speed status`, the console) until then; one in the past is not."""
    registry = load_registry()
    lake = tmp_path / "lake"
    settings = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path)})
    speed = SpeedLayer(redis_client, registry, lake)
    _ingest(speed, "cli", "early", 5, day("2026-12-01T10:00:00"))
    speed.rebase(run_batch(settings, TODAY, now=CUT, allow_open_day=True).manifest)
    assert landing_floor(lake) == CUT
    assert speed.status().as_dict()["open_day_cut_ahead"] is None
    night = run_batch(settings, TODAY, now=day("2026-12-02T01:00:00"))
    assert night.manifest.watermark_at > CUT
    assert landing_floor(lake) is None
    speed.rebase(night.manifest)
    ahead = (datetime.now(UTC) + timedelta(days=6)).replace(microsecond=0)
    lake_module.settle_landings(lake, ahead)
    assert speed.status().as_dict()["open_day_cut_ahead"] == ahead.isoformat()
