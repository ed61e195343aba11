"""The operations summary: the published run's figures and quarantine counts by reason."""

from __future__ import annotations

from collections import Counter
from datetime import date, datetime

import pyarrow.parquet as pq
import pytest

from app.console.ops import QuarantineTally, batch_run, ops_status
from leaderboard.lake import landed_files
from leaderboard.manifest import Manifest, read_current
from speed_layer.service import SpeedLayer

pytestmark = pytest.mark.redis


def _quarantined(lake) -> Counter[str]:
    rows: Counter[str] = Counter()
    for landed in landed_files(lake, kind="quarantine"):
        rows.update(pq.read_table(landed.path).column("reason").to_pylist())
    return rows


def test_counts_every_quarantined_row_by_reason(console_data):
    lake = console_data.lake_dir
    expected = _quarantined(lake)
    assert sum(expected.values()) == 10, expected  # the fixture's bad rows
    counts = QuarantineTally().count(lake, date(2026, 12, 1))
    assert counts.days[0] == "2026-11-25"
    assert counts.days[-1] == "2026-12-01"
    assert {r.reason: r.rows for r in counts.reasons} == dict(expected)
    assert counts.rows == 10
    for reason in counts.reasons:
        assert sum(reason.per_day) == reason.rows


def test_quarantine_window_leaves_older_days_out(console_data):
    lake = console_data.lake_dir
    # Seven days ending 2026-12-10 start on 12-04, after every partition of the fixture.
    later = QuarantineTally().count(lake, date(2026, 12, 10))
    assert later.rows == 0
    assert later.reasons == []
    assert later.files == 0


def test_memoised_counts_follow_a_rewritten_file(console_data):
    lake = console_data.lake_dir
    tally = QuarantineTally()
    before = tally.count(lake, date(2026, 12, 1))
    first = landed_files(lake, kind="quarantine")[0]
    table = pq.read_table(first.path)
    pq.write_table(table.slice(0, 0), first.path)  # the same name, no rows now
    after = tally.count(lake, date(2026, 12, 1))
    assert after.rows == before.rows - table.num_rows


def test_batch_run_reports_the_duration_the_batch_recorded(console_data):
    manifest = read_current(console_data.lake_dir)
    assert manifest is not None
    run = batch_run(manifest)
    assert run.duration_seconds is not None
    assert run.duration_seconds > 0
    assert run.as_of == "2026-11-30"
    assert run.mode == "full"
    assert run.new_events == manifest.inputs["new_events"]
    assert run.standings_rows == manifest.checks["standings_rows_written"]


def test_manifests_written_before_the_duration_field_still_read():
    old = Manifest(version="v1", as_of="2026-11-30", watermark="2026-12-01T00:00:00Z",
                   created_at="2026-12-01T00:00:05Z", engine="duckdb",
                   registry_fingerprint="f").to_json().replace(',\n "duration_seconds": null',
                                                               "")
    assert "duration_seconds" not in old
    run = batch_run(Manifest.from_json(old))
    assert run.duration_seconds is None
    assert run.mode is None


def test_ops_status_names_each_part(console_data, redis_client):
    speed = SpeedLayer(redis_client, console_data.registry, console_data.lake_dir)
    speed.rebuild(console_data.now())
    status = ops_status(console_data.lake_dir, speed, console_data.now(), QuarantineTally())
    assert status.batch is not None
    assert status.batch_problem is None
    assert status.speed is not None
    assert status.speed["version"] == status.batch.version
    assert status.speed["lag_files"] == 0
    assert status.quarantine.rows == 10
    assert status.as_dict()["batch"]["as_of"] == "2026-11-30"


def test_ops_status_counts_files_whose_events_are_on_no_live_board(console_data,
                                                                    redis_client):
    """A file landed with a clock before the live version's watermark, which that version
    did not read, holds accepted events the speed layer counts as absorbed: the summary
    says how many such files there are (the lag alone said 0)."""
    import pyarrow as pa

    from leaderboard.lake import LandingWriter
    from leaderboard.schema import TIMESTAMP
    from speed_layer.ingest import Ingestor

    speed = SpeedLayer(redis_client, console_data.registry, console_data.lake_dir)
    speed.rebuild(console_data.now())
    assert ops_status(console_data.lake_dir, speed, console_data.now(),
                      QuarantineTally()).invisible_files == 0
    past = datetime.fromisoformat("2026-11-30T12:00:00+00:00")
    table = pa.table({"match_id": ["past-clock"], "player_id": ["zed"],
                      "points": pa.array([3], pa.int64()),
                      "event_time": pa.array([past], TIMESTAMP), "region": ["na"],
                      "mode": ["ranked"], "server_id": ["s"]})
    with LandingWriter(console_data.lake_dir, "skewed") as writer:
        assert Ingestor(console_data.registry, writer, speed).ingest(
            table, now=past, source="test").accepted == 1
    status = ops_status(console_data.lake_dir, speed, console_data.now(), QuarantineTally())
    assert status.invisible_files == 1
    assert status.speed["lag_files"] == 0


def test_ops_status_says_what_is_missing_on_an_empty_lake(tmp_path, redis_client, registry):
    lake = tmp_path / "lake"
    lake.mkdir()
    speed = SpeedLayer(redis_client, registry, lake)
    status = ops_status(lake, speed, datetime(2026, 12, 1), QuarantineTally())
    assert status.batch is None
    assert status.batch_problem is not None
    assert "leaderboard batch" in status.batch_problem
    assert status.quarantine.rows == 0


def test_ops_status_says_why_when_redis_is_gone(console_data):
    import redis

    from leaderboard.redis_server import free_port

    gone = redis.Redis(port=free_port(), socket_connect_timeout=0.5, socket_timeout=0.5)
    speed = SpeedLayer(gone, console_data.registry, console_data.lake_dir)
    status = ops_status(console_data.lake_dir, speed, console_data.now(), QuarantineTally())
    assert status.speed is None
    assert status.speed_problem is not None
    assert status.speed_problem.startswith("Redis does not answer")
    assert status.batch is not None  # the lake's parts still answer
    assert status.quarantine.rows == 10
