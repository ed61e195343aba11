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

from jobs.batch import run_batch
from jobs.compact import SpeedWatermark, compact_partition
from leaderboard import faults
from leaderboard import lake as lake_module
from leaderboard.lake import LandingWriter, landed_files
from leaderboard.manifest import watermark_for
from leaderboard.registry import load_registry
from leaderboard.settings import Settings
from serving.service import Leaderboards
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
    """Writer b receives the same batch while writer a has landed it but not yet settled
    (the old door checked, landed, then remembered: both landed it). b neither lands it nor
    calls it a retry (a's landing might still fail): it holds the rows back as in flight;
    once a settled, the client's next send is a retry."""
    lake, registry, speed, at, table = world
    with LandingWriter(lake, "a") as a, LandingWriter(lake, "b") as b:
        reports = []

        def second_writer(_name: str) -> None:
            reports.append(Ingestor(registry, b, speed()).ingest(table, now=at, source="t"))

        with faults.injected("ingest.after_land", faults.on_hit(1, second_writer)):
            first = Ingestor(registry, a, speed()).ingest(table, now=at, source="t")
        [second] = reports
        assert first.accepted == table.num_rows
        assert (second.accepted, second.retries, second.in_flight) == (0, 0, table.num_rows)
        assert second.in_flight_writers == ["a"]
        third = Ingestor(registry, b, speed()).ingest(table, now=at, source="t")
        assert (third.accepted, third.retries, third.in_flight) == (0, table.num_rows, 0)
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


def _killed_writer(lake: Path, url: str, writer: str,
                   checkpoint: str = "ingest.after_claim") -> None:
    """Writer `writer` in a real child process, SIGKILLed (the fault seam) at `checkpoint`:
    after the door claimed the batch's ids and before anything landed, or (after_land) once
    its file landed, before the claim was settled or the file folded."""
    code = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parents[1])!r})
sys.path.insert(0, {str(Path(__file__).parent)!r})
import redis
from lakes import batches, day, random_stream
from leaderboard.lake import LandingWriter
from leaderboard.registry import load_registry
from serving.service import Leaderboards
from speed_layer.ingest import Ingestor
from speed_layer.service import SpeedLayer
registry = load_registry()
speed = SpeedLayer(redis.Redis.from_url({url!r}, protocol=2), registry, {str(lake)!r})
at, table = batches(random_stream(41, start=day("2026-11-28"), matches=40,
                                  duplicate_share=0.0))[0]
with LandingWriter({str(lake)!r}, {writer!r}) as writer:
    Ingestor(registry, writer, speed).ingest(table, now=at, source="t")
"""
    env = dict(os.environ, LEADERBOARD_FAULTS=f"{checkpoint}=kill")
    child = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           timeout=300)
    assert child.returncode == -9, child.stderr.decode()[-2000:]
    if checkpoint == "ingest.after_claim":
        assert landed_ids(lake) == []


def test_a_writer_killed_between_claim_and_landing_has_its_claims_released(world,
                                                                           redis_server):
    """The claims of a process killed before landing are in flight; the writer's next claim
    (a new process, same writer id) recovers them from the lake, so the retry lands."""
    lake, registry, speed, at, table = world
    _killed_writer(lake, redis_server.url, "a")
    with LandingWriter(lake, "a") as a:
        again = Ingestor(registry, a, speed()).ingest(table, now=at, source="t")
        assert (again.accepted, again.retries) == (table.num_rows, 0)
        retry = Ingestor(registry, a, speed()).ingest(table, now=at, source="t")
        assert (retry.accepted, retry.retries) == (0, table.num_rows)
    assert len(landed_ids(lake)) == table.num_rows


def test_a_retry_at_another_writer_after_a_kill_between_claim_and_landing_lands_once(
        world, redis_server, redis_client):
    """The exactly-once hole: writer a is killed between claim and land (a real process,
    kill -9); the client's retry reaches writer b (another HTTP worker). The old door
    counted the claimed ids as retries and answered 200: the rows never landed. Now b sees
    them in flight at a, finds a's landing lock free (a is dead), recovers a's claims from
    the lake, and lands them: once, and the merged reads count them once."""
    lake, registry, speed, at, table = world
    _killed_writer(lake, redis_server.url, "a")
    with LandingWriter(lake, "b") as b:
        retry = Ingestor(registry, b, speed()).ingest(table, now=at, source="t")
        assert (retry.accepted, retry.retries, retry.in_flight) == (table.num_rows, 0, 0)
        again = Ingestor(registry, b, speed()).ingest(table, now=at, source="t")
        assert (again.accepted, again.retries, again.in_flight) == (0, table.num_rows, 0)
    with LandingWriter(lake, "a") as a:  # the dead writer back: nothing left to recover
        late = Ingestor(registry, a, speed()).ingest(table, now=at, source="t")
        assert (late.accepted, late.retries, late.in_flight) == (0, table.num_rows, 0)
    ids = landed_ids(lake)
    assert len(ids) == len(set(ids)) == table.num_rows
    assert speed().door.writers_in_flight() == set()
    # The merged reads count each landed row once: every player's all-time score is the
    # sum of its landed points.
    boards = Leaderboards(lake, registry, redis_client, now=lambda: at)
    points: dict[str, int] = {}
    for row in table.to_pylist():
        points[row["player_id"]] = points.get(row["player_id"], 0) + row["points"]
    for player, total in sorted(points.items())[:10]:
        answer = boards.player("global", player, "all-time")
        assert answer["score"] == total, (player, answer)


def _assert_counted_once(lake, registry, redis_client, at, table) -> None:
    """Every player's merged all-time score is the sum of its batch's points (each row
    counted once by the live state)."""
    boards = Leaderboards(lake, registry, redis_client, now=lambda: at)
    points: dict[str, int] = {}
    for row in table.to_pylist():
        points[row["player_id"]] = points.get(row["player_id"], 0) + row["points"]
    for player, total in sorted(points.items())[:10]:
        answer = boards.player("global", player, "all-time")
        assert answer["score"] == total, (player, answer)


def test_a_retry_after_a_kill_between_land_and_settle_is_a_retry_and_its_rows_count(
        world, redis_server, redis_client):
    """Writer a is killed after its file landed, before it settled the claim or folded the
    file; the client's retry reaches writer b. b recovers a's claims: the ids whose rows
    landed stay settled (the retry is a retry, nothing lands twice), and a's landed file is
    folded then, so the merged reads count the rows b just answered as accepted. (Before,
    b answered 200 "retry" while the live state lacked a's rows until some later repair.)"""
    lake, registry, speed, at, table = world
    _killed_writer(lake, redis_server.url, "a", "ingest.after_land")
    assert len(landed_ids(lake)) == table.num_rows
    with LandingWriter(lake, "b") as b:
        retry = Ingestor(registry, b, speed()).ingest(table, now=at, source="t")
        assert (retry.accepted, retry.retries, retry.in_flight) == (0, table.num_rows, 0)
        _assert_counted_once(lake, registry, redis_client, at, table)
    ids = landed_ids(lake)
    assert len(ids) == len(set(ids)) == table.num_rows
    assert speed().door.writers_in_flight() == set()


def test_a_writer_killed_between_land_and_settle_restarted_counts_its_rows(
        world, redis_server, redis_client):
    """The same kill, and the client resends to the restarted writer a: every row is a
    retry, and the merged reads count a's landed rows (before, no file landed on the
    resend, so nothing folded the dead process's file)."""
    lake, registry, speed, at, table = world
    _killed_writer(lake, redis_server.url, "a", "ingest.after_land")
    with LandingWriter(lake, "a") as a:
        again = Ingestor(registry, a, speed()).ingest(table, now=at, source="t")
        assert (again.accepted, again.retries, again.in_flight) == (0, table.num_rows, 0)
        _assert_counted_once(lake, registry, redis_client, at, table)
    assert len(landed_ids(lake)) == table.num_rows


class _Killed(BaseException):
    """A writer process killed at a fault checkpoint (in process: nothing after it runs)."""


def test_a_dead_writers_file_compacted_before_recovery_still_settles_its_claims(
        world, tmp_path):
    """Writer a dies after landing, before settling; nobody hits its claims until the
    night's batch absorbed the file and compaction rewrote the partition (a's file now
    lives in a `part-compact-*` file, named in its compaction record). A retry then reaches
    b: recovery must still see a's rows as landed (the old code looked for a's own file
    only, released the ids, and b landed every row a second time)."""
    lake, registry, speed, _at, _table = world
    (at, table), (later, other) = batches(random_stream(41, start=START, matches=40,
                                                        duplicate_share=0.0))[:2]
    assert at.date() == later.date() == START.date()

    def die(_name: str) -> None:
        raise _Killed

    a = LandingWriter(lake, "a")
    with faults.injected("ingest.after_land", die), pytest.raises(_Killed):
        Ingestor(registry, a, speed()).ingest(table, now=at, source="t")
    a.close()  # the process is gone, its claim in flight
    with LandingWriter(lake, "b") as b:
        Ingestor(registry, b, speed()).ingest(other, now=later, source="t")
    settings = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path)})
    assert settings.lake_dir == lake
    run_batch(settings, START.date())
    compact_partition(lake, START.date(), speed=SpeedWatermark(
        present=True, watermark=watermark_for(START.date()), version=f"{START.date()}.v"))
    assert [f for f in landed_files(lake) if f.writer == "a"] == []  # compacted away
    with LandingWriter(lake, "b") as b:
        retry = Ingestor(registry, b, speed()).ingest(table, now=at, source="t")
    assert (retry.accepted, retry.retries, retry.in_flight) == (0, table.num_rows, 0)
    ids = landed_ids(lake)
    assert len(ids) == len(set(ids)) == table.num_rows + other.num_rows


def test_a_recovery_that_fails_leaves_no_claim_in_flight_at_the_live_writer(
        world, monkeypatch):
    """b's batch holds rows a dead writer a claimed and landed, and new rows. b claims the
    new rows, then recovering a fails (Redis drops mid-fold): b raises, nothing landed, and
    b's own claim is released (before, it stayed in flight at b, alive, so the client's
    resend at writer c was answered "retry later" until b's next request)."""
    lake, registry, speed, at, table = world
    dead = table.slice(0, table.num_rows // 2)

    def die(_name: str) -> None:
        raise _Killed

    a = LandingWriter(lake, "a")
    with faults.injected("ingest.after_land", die), pytest.raises(_Killed):
        Ingestor(registry, a, speed()).ingest(dead, now=at, source="t")
    a.close()
    layer = speed()

    def blip(*_args: object, **_kwargs: object) -> int:
        raise redis.ConnectionError("injected: Redis went away mid-fold")

    monkeypatch.setattr(layer.folder, "catch_up", blip)
    with LandingWriter(lake, "b") as b, LandingWriter(lake, "c") as c:  # b stays alive
        with pytest.raises(redis.ConnectionError):
            Ingestor(registry, b, layer).ingest(table, now=at, source="t")
        assert layer.door.writers_in_flight() == {"a"}  # a's stay until a recovery folds
        resend = Ingestor(registry, c, speed()).ingest(table, now=at, source="t")
    assert (resend.accepted, resend.retries, resend.in_flight) == (
        table.num_rows - dead.num_rows, dead.num_rows, 0), resend.as_dict()
    ids = landed_ids(lake)
    assert len(ids) == len(set(ids)) == table.num_rows


def test_a_landing_that_fails_part_way_counts_the_rows_it_landed(
        world, redis_client, monkeypatch):
    """A landing over several files fails after the first (the disk fills): the claims of
    the rows not landed are released and the landed file's stand, so the client's resend
    (at another worker) lands the rest and calls the first file's rows retries; the merged
    reads must count the first file's rows too (before, nothing folded it until writer a
    landed again or some repair ran)."""
    lake, registry, speed, at, table = world
    monkeypatch.setattr(lake_module, "BACKFILL_FILE_ROWS", 2)  # a file per two rows
    real = lake_module.atomic_write_parquet
    calls: list[Path] = []

    def disk_full(part, target, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(target)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(part, target, **kwargs)

    with LandingWriter(lake, "a") as a:
        ingestor = Ingestor(registry, a, speed())
        with monkeypatch.context() as patch:
            patch.setattr(lake_module, "atomic_write_parquet", disk_full)
            with pytest.raises(OSError, match="No space left"):
                ingestor.ingest(table, now=at, source="t")
        assert len(landed_ids(lake)) == 2
        with LandingWriter(lake, "b") as b:  # the client's resend reaches another worker
            again = Ingestor(registry, b, speed()).ingest(table, now=at, source="t")
        assert (again.accepted, again.retries) == (table.num_rows - 2, 2)
        _assert_counted_once(lake, registry, redis_client, at, table)
    ids = landed_ids(lake)
    assert len(ids) == len(set(ids)) == table.num_rows


def test_a_live_writers_claims_are_never_recovered_by_another(world):
    """A writer that holds its landing lock is alive: another writer's claim of the same ids
    answers them in flight, whatever the wait, and leaves the claim alone."""
    lake, registry, speed, at, table = world
    with LandingWriter(lake, "a") as a, LandingWriter(lake, "b") as b:
        layer = speed()
        admitted = layer.claim(table, at, "a", a.next_seq)  # a claimed, landing (slowly)
        assert admitted.rows.num_rows == table.num_rows
        held = Ingestor(registry, b, speed()).ingest(table, now=at, source="t")
        assert (held.accepted, held.retries, held.in_flight) == (0, 0, table.num_rows)
        assert layer.door.writers_in_flight() == {"a"}
        admitted.claim.release()  # a's landing failed: the ids are free again
        retry = Ingestor(registry, b, speed()).ingest(table, now=at, source="t")
        assert (retry.accepted, retry.in_flight) == (table.num_rows, 0)
    assert len(landed_ids(lake)) == table.num_rows
