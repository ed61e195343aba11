"""Ingest of trusted backfills: stamped at landing, flagged, counted in every window at once."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.batch import run_batch
from leaderboard.lake import LandingWriter, landed_files
from leaderboard.manifest import read_current
from leaderboard.registry import load_registry
from leaderboard.schema import TIMESTAMP
from leaderboard.settings import Settings
from serving.service import Leaderboards
from speed_layer.ingest import Ingestor, IngestReport
from speed_layer.service import SpeedLayer

pytestmark = pytest.mark.redis

LIVE_AT = datetime(2026, 11, 20, 12, tzinfo=UTC)
BACKFILL_AT = datetime(2026, 12, 1, 12, tzinfo=UTC)
#: Windows the backfilled match falls in: its day and week closed long before it landed
#: (past end + 7 days of grace), its month and all-time still open.
WINDOWS = ["daily:2026-11-10", "weekly:2026-W46", "monthly:2026-11", "all-time"]


def _event(match: str, player: str, points: int, at: datetime) -> dict[str, object]:
    return {"match_id": match, "player_id": player, "points": points, "event_time": at,
            "region": "na", "mode": "ranked", "server_id": "s1"}


def _ingest(lake: Path, speed: SpeedLayer, rows: list[dict[str, object]], now: datetime, *,
            backfill: bool = False) -> IngestReport:
    table = pa.Table.from_pylist(rows).set_column(
        3, "event_time", pa.array([r["event_time"] for r in rows], TIMESTAMP))
    with LandingWriter(lake, "cli") as writer:
        return Ingestor(speed.registry, writer, speed).ingest(
            table, now=now, source="test", backfill=backfill)


def _merged(lake: Path, speed: SpeedLayer, client: object) -> dict[str, list[dict[str, object]]]:
    boards = Leaderboards(lake, speed.registry, client, now=lambda: BACKFILL_AT)  # type: ignore[arg-type]
    return {w: [(e["player_id"], e["score"], e["rank"])
                for e in boards.top("global", 10, window=w)["entries"]] for w in WINDOWS}


def test_a_backfill_after_the_batch_is_visible_at_once_and_equals_the_next_batch(
        tmp_path: Path, redis_client: object) -> None:
    """Issue 10 item 4: ingest, batch, then `ingest --backfill` of a match dated before the
    watermark. The merged answers counted 5 for alice (the speed layer skipped rows stamped
    from their event_time, the base lacked them); the batch of everything says 9."""
    registry = load_registry()
    settings = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path)})
    lake = settings.lake_dir
    speed = SpeedLayer(redis_client, registry, lake)  # type: ignore[arg-type]
    _ingest(lake, speed, [_event("m1", "alice", 5, datetime(2026, 11, 20, 10, tzinfo=UTC)),
                          _event("m2", "bob", 7, datetime(2026, 11, 20, 11, tzinfo=UTC))],
            LIVE_AT)
    speed.rebase(run_batch(settings, date(2026, 11, 20)).manifest)

    history = [_event("m0", "alice", 4, datetime(2026, 11, 10, 9, tzinfo=UTC)),
               _event("m0", "carol", 2, datetime(2026, 11, 10, 9, tzinfo=UTC))]
    report = _ingest(lake, speed, history, BACKFILL_AT, backfill=True)
    assert (report.accepted, report.rejected, report.fold_error) == (2, 0, None)
    merged = _merged(lake, speed, redis_client)
    assert merged["all-time"] == [("alice", 9, 1), ("bob", 7, 2), ("carol", 2, 3)]
    assert merged["daily:2026-11-10"] == [("alice", 4, 1), ("carol", 2, 2)]
    # Stamped at landing, in the landing day's partition, flagged as history.
    landed = [f for f in landed_files(lake) if f.ingest_date == BACKFILL_AT.date()]
    assert len(landed) == 1
    rows = pq.read_table(landed[0].path).to_pylist()
    assert {(r["ingested_at"], r["backfill"]) for r in rows} == {(BACKFILL_AT, True)}

    # The same import re-run within the horizon is stopped at the door: nothing counts twice.
    again = _ingest(lake, speed, history, BACKFILL_AT, backfill=True)
    assert (again.accepted, again.retries) == (0, 2)
    assert _merged(lake, speed, redis_client) == merged

    # The batch of everything agrees, window by window, and so do the merged answers on it.
    result = run_batch(settings, date(2026, 12, 1))
    assert result.mode == "incremental"
    speed.rebase(read_current(lake))  # type: ignore[arg-type]
    assert _merged(lake, speed, redis_client) == merged
    full = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path)})
    assert run_batch(full, date(2026, 12, 1), full=True).events == 4
    speed.rebase(read_current(lake))  # type: ignore[arg-type]
    assert _merged(lake, speed, redis_client) == merged


def test_files_from_before_the_backfill_column_read_as_live_events(
        tmp_path: Path, redis_client: object) -> None:
    """A landed file without the column (an older lake) is not a backfill: its late rows
    stay late in the batch and in the speed layer alike."""
    registry = load_registry()
    settings = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path)})
    lake = settings.lake_dir
    speed = SpeedLayer(redis_client, registry, lake)  # type: ignore[arg-type]
    _ingest(lake, speed, [_event("m1", "alice", 5, datetime(2026, 11, 20, 10, tzinfo=UTC))],
            LIVE_AT)
    speed.rebase(run_batch(settings, date(2026, 11, 20)).manifest)
    rows = [_event("m0", "alice", 4, datetime(2026, 11, 10, 9, tzinfo=UTC))]
    table = pa.Table.from_pylist(rows).set_column(
        3, "event_time", pa.array([r["event_time"] for r in rows], TIMESTAMP))
    with LandingWriter(lake, "old") as writer:  # landed only: folded below
        Ingestor(registry, writer).ingest(table, now=BACKFILL_AT, source="test", backfill=True)
    (path,) = [f.path for f in landed_files(lake) if f.ingest_date == BACKFILL_AT.date()]
    table = pq.read_table(path)
    pq.write_table(table.drop_columns(["backfill"]), path)  # as an older writer wrote it
    assert speed.repair() == 1
    merged = _merged(lake, speed, redis_client)
    assert merged["daily:2026-11-10"] == []  # late: past its window's grace
    assert merged["all-time"] == [("alice", 9, 1)]
    run_batch(settings, date(2026, 12, 1))
    speed.rebase(read_current(lake))  # type: ignore[arg-type]
    assert _merged(lake, speed, redis_client) == merged
