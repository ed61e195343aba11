"""The door on real Redis: atomic per identity across writers, claims released when the rows
do not land (issue 10 item 3)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import redis
from lakes import batches, day, random_stream

from leaderboard import faults
from leaderboard.lake import LandingWriter, landed_files
from leaderboard.registry import load_registry
from speed_layer.ingest import Ingestor
from speed_layer.service import SpeedLayer

pytestmark = pytest.mark.redis
START = day("2026-11-28")


def landed_ids(lake: Path) -> list[tuple[str, str]]:
    return [(r["match_id"], r["player_id"]) for f in landed_files(lake)
            for r in pq.read_table(f.path, columns=["match_id", "player_id"]).to_pylist()]


@pytest.fixture
def world(tmp_path, redis_client, redis_server):
    registry = load_registry()
    lake = tmp_path / "lake"
    at, table = batches(random_stream(41, start=START, matches=40, duplicate_share=0.0))[0]

    def speed() -> SpeedLayer:  # each writer its own connection, as two processes would
        return SpeedLayer(redis.Redis.from_url(redis_server.url, protocol=2), registry, lake)

    return lake, registry, speed, at, table


def test_one_retry_at_two_writers_at_once_lands_once(world):
    """Writer b receives the same batch while writer a has landed it but not yet folded
    (the old door checked, landed, then remembered: both landed it)."""
    lake, registry, speed, at, table = world
    with LandingWriter(lake, "a") as a, LandingWriter(lake, "b") as b:
        reports = []

        def second_writer(_name: str) -> None:
            reports.append(Ingestor(registry, b, speed()).ingest(table, now=at, source="t"))

        with faults.injected("ingest.after_land", faults.on_hit(1, second_writer)):
            first = Ingestor(registry, a, speed()).ingest(table, now=at, source="t")
    [second] = reports
    assert first.accepted == table.num_rows
    assert (second.accepted, second.retries) == (0, table.num_rows)
    ids = landed_ids(lake)
    assert len(ids) == len(set(ids)) == table.num_rows


def test_a_landing_that_fails_releases_its_claims(world):
    lake, registry, speed, at, table = world
    with LandingWriter(lake, "a") as a:
        ingestor = Ingestor(registry, a, speed())
        with (faults.injected("ingest.after_claim", faults.fail),
              pytest.raises(faults.InjectedFault)):
            ingestor.ingest(table, now=at, source="t")
        assert landed_ids(lake) == []
        again = ingestor.ingest(table, now=at, source="t")  # the client's retry
    assert (again.accepted, again.retries) == (table.num_rows, 0)
    assert len(landed_ids(lake)) == table.num_rows


def test_a_writer_killed_between_claim_and_landing_has_its_claims_released(world,
                                                                           redis_server):
    """The claims of a process killed before landing are in flight; the writer's next claim
    (a new process, same writer id) recovers them from the lake, so the retry lands."""
    lake, registry, speed, at, table = world
    code = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parents[1])!r})
sys.path.insert(0, {str(Path(__file__).parent)!r})
import redis
from lakes import batches, day, random_stream
from leaderboard.lake import LandingWriter
from leaderboard.registry import load_registry
from speed_layer.ingest import Ingestor
from speed_layer.service import SpeedLayer
registry = load_registry()
speed = SpeedLayer(redis.Redis.from_url({redis_server.url!r}, protocol=2), registry,
                   {str(lake)!r})
at, table = batches(random_stream(41, start=day("2026-11-28"), matches=40,
                                  duplicate_share=0.0))[0]
with LandingWriter({str(lake)!r}, "a") as writer:
    Ingestor(registry, writer, speed).ingest(table, now=at, source="t")
"""
    env = dict(os.environ, LEADERBOARD_FAULTS="ingest.after_claim=kill")
    child = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           timeout=300)
    assert child.returncode == -9, child.stderr.decode()[-2000:]
    assert landed_ids(lake) == []
    with LandingWriter(lake, "a") as a:
        again = Ingestor(registry, a, speed()).ingest(table, now=at, source="t")
        assert (again.accepted, again.retries) == (table.num_rows, 0)
        retry = Ingestor(registry, a, speed()).ingest(table, now=at, source="t")
        assert (retry.accepted, retry.retries) == (0, table.num_rows)
    assert len(landed_ids(lake)) == table.num_rows
