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
from leaderboard.lake import LandingWriter, WriterBusy, landed_files
from leaderboard.manifest import watermark_for
from leaderboard.registry import load_registry
from leaderboard.settings import Settings
from leaderboard.speed_keys import StateLost
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
        with a.landing():
            admitted = layer.claim(table, at, "a", a.next_seq)  # a claimed, landing (slowly)
            assert admitted.rows.num_rows == table.num_rows
            held = Ingestor(registry, b, speed()).ingest(table, now=at, source="t")
            assert (held.accepted, held.retries, held.in_flight) == (0, 0, table.num_rows)
            assert layer.door.writers_in_flight() == {"a"}
            admitted.claim.release()  # a's landing failed: the ids are free again
        retry = Ingestor(registry, b, speed()).ingest(table, now=at, source="t")
        assert (retry.accepted, retry.in_flight) == (table.num_rows, 0)
    assert len(landed_ids(lake)) == table.num_rows


def _settle_fails_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Redis error of the stateful model's failing run: the settle script of one group
    runs, the next group's is lost (a blip mid-pipeline), after the rows landed."""
    from speed_layer import door as door_module

    real = door_module.Claim.settle
    calls: list[int] = []

    def settle(self):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:
            raise redis.ConnectionError("injected: Redis went away while settling")
        return real(self)

    monkeypatch.setattr(door_module.Claim, "settle", settle)


def test_a_settle_lost_at_a_live_writer_never_holds_a_retry_back(world, monkeypatch,
                                                                 redis_client):
    """The stateful model's liveness defect: writer b lands a batch, the settle of its claim
    is lost to a Redis error (the rows are durable, the fold succeeds), and b stays alive
    and idle. The client's retry at writer a was answered "in flight at b" (retry later)
    for as long as b received nothing: a live writer's claim is never recovered by
    another. Now a finds b between landings (its landing lock free), settles b's claim from
    the lake, and calls the rows retries; nothing lands twice."""
    lake, registry, speed, at, table = world
    _settle_fails_once(monkeypatch)
    with LandingWriter(lake, "a") as a, LandingWriter(lake, "b") as b:
        first = Ingestor(registry, b, speed()).ingest(table, now=at, source="t")
        assert (first.accepted, first.fold_error) == (table.num_rows, None)
        retry = Ingestor(registry, a, speed()).ingest(table, now=at, source="t")
        assert (retry.accepted, retry.retries, retry.in_flight) == (0, table.num_rows, 0), \
            retry.as_dict()
        assert speed().door.writers_in_flight() == set()
    ids = landed_ids(lake)
    assert len(ids) == len(set(ids)) == table.num_rows
    _assert_counted_once(lake, registry, redis_client, at, table)


def test_repair_settles_a_live_writers_claim_that_outlived_its_landing(world, monkeypatch):
    """The same lost settle, then `speed repair` (the stateful model's step): it left b's
    claim in flight because b is alive; it now settles it (b is between landings)."""
    lake, registry, speed, at, table = world
    _settle_fails_once(monkeypatch)
    with LandingWriter(lake, "b") as b:
        Ingestor(registry, b, speed()).ingest(table, now=at, source="t")
        layer = speed()
        assert layer.door.writers_in_flight() == {"b"}
        layer.repair()
        assert layer.door.writers_in_flight() == set()


def test_a_failed_landing_whose_release_failed_never_holds_a_retry_back(world, monkeypatch):
    """Writer b's landing fails before anything landed, and Redis fails again while b
    releases its claim; b stays alive and idle. The client's resend at writer a must land
    (before: "in flight at b" until b's next request)."""
    lake, registry, speed, at, table = world
    layer = speed()

    def blip(*_args: object, **_kwargs: object) -> int:
        raise redis.ConnectionError("injected: Redis went away while releasing")

    monkeypatch.setattr(layer, "recover_writer", blip)
    with LandingWriter(lake, "a") as a, LandingWriter(lake, "b") as b:
        with (faults.injected("ingest.after_claim", faults.fail),
              pytest.raises(faults.InjectedFault)):
            Ingestor(registry, b, layer).ingest(table, now=at, source="t")
        assert landed_ids(lake) == []
        resend = Ingestor(registry, a, speed()).ingest(table, now=at, source="t")
        assert (resend.accepted, resend.retries, resend.in_flight) == (table.num_rows, 0, 0), \
            resend.as_dict()
    ids = landed_ids(lake)
    assert len(ids) == len(set(ids)) == table.num_rows


def test_redis_wiped_between_the_state_check_and_the_claim_lands_nothing_twice(
        world, monkeypatch):
    """The state is checked (`current`), then Redis loses its data, then the door claims:
    the old claim found an empty record and let a resend of landed rows land again. The
    claim script now checks the state's epoch marker in the same step: it refuses."""
    lake, registry, speed, at, table = world
    with LandingWriter(lake, "a") as a:
        Ingestor(registry, a, speed()).ingest(table, now=at, source="t")
        layer = speed()
        real = layer.current
        wiped: list[int] = []

        def check_then_wipe():  # type: ignore[no-untyped-def]
            found = real()
            if not wiped:
                wiped.append(1)
                layer.client.flushall()
            return found

        monkeypatch.setattr(layer, "current", check_then_wipe)
        with pytest.raises(StateLost):
            Ingestor(registry, a, layer).ingest(table, now=at, source="t")
    ids = landed_ids(lake)
    assert len(ids) == len(set(ids)) == table.num_rows


def test_a_deleted_landing_lock_file_never_makes_a_landing_writer_look_idle(world):
    """Writer a is landing (claimed, not landed); an operator deletes its lock files in
    lake/writers. Writer b's claim of the same ids must still answer them in flight: the
    old check opened (and so recreated) a's lock file, found it free and took a's claims
    over, so b landed the rows and a landed them again."""
    lake, registry, speed, at, table = world
    with LandingWriter(lake, "a") as a, LandingWriter(lake, "b") as b:
        layer = speed()
        with a.landing():
            admitted = layer.claim(table, at, "a", a.next_seq)
            for path in (lake / "writers").glob("a.*"):
                if path.suffix != ".seq":
                    path.unlink()
            held = Ingestor(registry, b, speed()).ingest(table, now=at, source="t")
            assert (held.accepted, held.in_flight) == (0, table.num_rows), held.as_dict()
            (lake / "writers" / "a.landing").touch()  # recreated: not the file a locked
            again = Ingestor(registry, b, speed()).ingest(table, now=at, source="t")
            assert (again.accepted, again.in_flight) == (0, table.num_rows), again.as_dict()
            a.land(admitted.rows, at)
            admitted.claim.settle()
    ids = landed_ids(lake)
    assert len(ids) == len(set(ids)) == table.num_rows


def test_a_deleted_writer_lock_file_lets_no_second_process_land_as_the_same_writer(world):
    """An operator deletes lake/writers/a.lock under a live writer a: another process opens
    writer id a (a new lock file). The old writer a kept landing with the same seq file
    (two processes, one writer id); now a's next landing stops with a message that says
    what happened and what to do."""
    lake, registry, speed, at, table = world
    with LandingWriter(lake, "a") as a:
        (lake / "writers" / "a.lock").unlink()
        with LandingWriter(lake, "a"), pytest.raises(WriterBusy, match="deleted or replaced"):
            Ingestor(registry, a, speed()).ingest(table, now=at, source="t")
        # Deleted with nobody taking the id: a takes its lock file back and lands.
        (lake / "writers" / "a.lock").unlink()
        report = Ingestor(registry, a, speed()).ingest(table, now=at, source="t")
        assert report.accepted == table.num_rows
        with pytest.raises(WriterBusy, match="stop that process or wait"):
            LandingWriter(lake, "a")


def test_a_claim_ended_twice_never_frees_an_id_another_writer_claimed_since(world):
    """a releases its claim (its landing failed), b claims the same ids, then a's release
    runs again (two recoveries of one claim): the old script removed the fingerprints
    again, now b's, so a third writer found the ids unknown and landed them beside b."""
    lake, registry, speed, at, table = world
    layer = speed()
    with (LandingWriter(lake, "a") as a, LandingWriter(lake, "b") as b,
          LandingWriter(lake, "c") as c):
        with a.landing():
            first = layer.claim(table, at, "a", a.next_seq)
            first.claim.release()
        with b.landing():
            second = layer.claim(table, at, "b", b.next_seq)
            assert second.rows.num_rows == table.num_rows
            assert first.claim.release() == 0  # a stale end: nothing of b's is touched
            held = Ingestor(registry, c, speed()).ingest(table, now=at, source="t")
            assert (held.accepted, held.in_flight) == (0, table.num_rows), held.as_dict()
            b.land(second.rows, at)
            second.claim.settle()
    # Nothing of the door's bookkeeping of ids in flight is left behind.
    assert layer.door.writers_in_flight() == set()
    assert [k for k in layer.client.scan_iter(match="lb:ids:*:holders")] == []


def test_a_blip_while_a_fresh_state_is_marked_heals_on_the_next_send(world, monkeypatch):
    """First use of an empty Redis: the door's epoch markers are written, then the version
    pointer. A blip after half the markers leaves no pointer; the next send marks every
    group again and lands (a version that kept the old markers found them mixed and refused
    every claim until a rebuild; found by the stateful model)."""
    lake, registry, speed, at, table = world
    layer = speed()
    real = layer.door.mark_epoch

    def half(epoch: str) -> None:
        for group in range(layer.door.groups // 2):
            layer.client.sadd(layer.door.epoch_key(group), epoch)
        raise redis.ConnectionError("injected: Redis went away while marking")

    with LandingWriter(lake, "a") as a:
        monkeypatch.setattr(layer.door, "mark_epoch", half)
        with pytest.raises(redis.ConnectionError):
            Ingestor(registry, a, layer).ingest(table, now=at, source="t")
        monkeypatch.setattr(layer.door, "mark_epoch", real)
        report = Ingestor(registry, a, layer).ingest(table, now=at, source="t")
    assert report.accepted == table.num_rows


def test_two_writers_racing_to_first_use_both_land(world):
    """Two workers' first sends reach an empty Redis at once: each marks the door's record
    with its own fresh epoch, one pointer wins. A marker per group (overwritten by the
    loser) made the winner's claims refuse (StateLost; found by the stateful model): the
    markers are a set per group now, so the winner's epoch stays marked."""
    lake, registry, speed, at, table = world
    first, second = speed(), speed()
    real = first.door.mark_epoch

    def race(epoch, **kwargs):  # type: ignore[no-untyped-def]
        second.current()  # the other process marks and writes its pointer first
        return real(epoch, **kwargs)  # then this one marks its (losing) epoch after it

    first.door.mark_epoch = race  # type: ignore[method-assign]
    assert first.current().epoch == second.current().epoch
    with LandingWriter(lake, "a") as a:
        report = Ingestor(registry, a, second).ingest(table, now=at, source="t")
    assert report.accepted == table.num_rows
