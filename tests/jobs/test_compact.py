"""Compaction: fewer files, the same rows, the same standings, never a double count."""

from __future__ import annotations

import json
import os
import shutil
import time
from datetime import date, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lakes import day, land, land_legacy_backfill, random_stream
from views import published_standings

from jobs.batch import run_batch
from jobs.compact import (
    FileFacts,
    SpeedWatermark,
    choose_files,
    compact_partition,
    group_files,
    partition_gate,
    rows_checksum,
    tied_files,
)
from leaderboard import faults
from leaderboard.faults import InjectedFault
from leaderboard.lake import (
    LandingWriter,
    absorbed_with_compactions,
    compacted_originals,
    landed_files,
    open_landing_writes,
)
from leaderboard.manifest import read_current, watermark_for
from leaderboard.registry import load_registry
from leaderboard.schema import EVENT_SCHEMA, LANDED_SCHEMA, TIMESTAMP
from leaderboard.settings import Settings

START = day("2026-11-28")
D = date(2026, 11, 28)


def settings_for(data: Path) -> Settings:
    return Settings.from_env({"LEADERBOARD_DATA": str(data)})


def speed_on(as_of: date) -> SpeedWatermark:
    """A speed layer rebased onto the version of `as_of`."""
    return SpeedWatermark(present=True, watermark=watermark_for(as_of), version=f"{as_of}.v")


def partition_files(lake: Path, on: date) -> list[Path]:
    return [f.path for f in landed_files(lake) if f.ingest_date == on]


def partition_rows(lake: Path, on: date) -> pa.Table:
    return pa.concat_tables([pq.read_table(p).select(LANDED_SCHEMA.names).cast(LANDED_SCHEMA)
                             for p in partition_files(lake, on)])


def landed_row(match: str, player: str, points: int, at) -> dict:
    return {"match_id": match, "player_id": player, "points": points, "event_time": at,
            "region": "na", "mode": "ranked", "server_id": "s1", "ingested_at": at}


@pytest.fixture
def world(tmp_path):
    """A landed three-day stream (hourly micro-batches), version D published, and an
    untouched copy of the lake (`control`) to compare with."""
    data = tmp_path / "data"
    land(data / "lake", load_registry(), random_stream(5, start=START, matches=80))
    run_batch(settings_for(data), D)
    control = tmp_path / "control"
    shutil.copytree(data, control)
    return data, control


# -- pure -----------------------------------------------------------------------------------

def test_rows_checksum_ignores_order_and_sees_every_value():
    rows = [landed_row("m1", "a", 3, START), landed_row("m2", "b", 5, START),
            landed_row("m3", "c", 0, START + timedelta(seconds=1))]
    table = pa.Table.from_pylist(rows, schema=LANDED_SCHEMA)
    assert rows_checksum(table) == rows_checksum(table.take([2, 0, 1]))
    assert rows_checksum(table) == rows_checksum(pa.concat_tables([table.slice(0, 1),
                                                                   table.slice(1)]))
    for column, value in [("points", 4), ("player_id", "z"), ("region", "eu"),
                          ("ingested_at", START + timedelta(microseconds=1))]:
        changed = [dict(r) for r in rows]
        changed[1][column] = value
        other = pa.Table.from_pylist(changed, schema=LANDED_SCHEMA)
        assert rows_checksum(other) != rows_checksum(table), column
    assert rows_checksum(table) != rows_checksum(table.slice(0, 2))
    # moving bytes between neighbouring strings changes the checksum too
    swapped = [dict(r) for r in rows]
    swapped[0]["match_id"], swapped[0]["player_id"] = "m1a", ""
    assert rows_checksum(pa.Table.from_pylist(swapped, schema=LANDED_SCHEMA)) != \
        rows_checksum(table)


def test_choose_files_leaves_unabsorbed_late_and_big_files():
    mark = watermark_for(D)
    files = [FileFacts("a", 10, mark - timedelta(hours=1), True),
             FileFacts("b", 10, mark - timedelta(hours=1), False),
             FileFacts("c", 10, mark, True),
             FileFacts("d", 500, mark - timedelta(hours=1), True),
             FileFacts("e", 10, mark - timedelta(seconds=1), True)]
    chosen, left = choose_files(files, watermark=mark, small_rows=100)
    assert [f.relpath for f in chosen] == ["a", "e"]
    assert set(left) == {"b", "c", "d"}
    assert "not absorbed" in left["b"]
    assert "at or after" in left["c"]
    assert "500" in left["d"]


def test_group_files_packs_by_rows_and_drops_single_files():
    mark = watermark_for(D)
    files = [FileFacts(name, rows, mark, True) for name, rows in
             [("a", 4), ("b", 4), ("c", 4), ("d", 9), ("e", 1)]]
    groups = group_files(files, max_rows=10)
    # c alone would be a group of one (4 + 9 > 10): it stays as it is
    assert [[f.relpath for f in g] for g in groups] == [["a", "b"], ["d", "e"]]
    assert [[f.relpath for f in g] for g in group_files(files, max_rows=100)] == [
        ["a", "b", "c", "d", "e"]]


def test_tied_files_share_an_identity_and_a_stamp():
    table = pa.Table.from_pylist
    first = table([landed_row("m1", "a", 1, START), landed_row("m2", "a", 1, START)],
                  schema=LANDED_SCHEMA)
    same_stamp = table([landed_row("m1", "a", 7, START)], schema=LANDED_SCHEMA)
    later = table([landed_row("m2", "a", 1, START + timedelta(seconds=1))],
                  schema=LANDED_SCHEMA)
    assert tied_files({"f1": first, "f2": same_stamp, "f3": later}) == {"f1", "f2"}
    assert tied_files({"f1": first, "f3": later}) == set()


def test_partition_gate_names_every_reason():
    class Live:
        version, as_of, as_of_date = "v", D.isoformat(), D

    live = Live()
    assert "no published" in partition_gate(D, None, speed_on(D))
    assert "not absorbed" in partition_gate(D + timedelta(days=1), live, speed_on(D))
    assert "counted twice" in partition_gate(D, live, speed_on(D - timedelta(days=1)))
    assert "no batch version" in partition_gate(D, live, SpeedWatermark(present=True))
    assert partition_gate(D, live, speed_on(D)) is None
    assert partition_gate(D, live, SpeedWatermark(present=False)) is None


def test_only_fresh_landing_temp_files_are_open_writes(tmp_path):
    partition = tmp_path / f"ingest_date={D}"
    partition.mkdir()
    fresh = partition / ".part-t-000000000001.parquet.aaaa1111.tmp"
    stale = partition / ".part-t-000000000002.parquet.bbbb2222.tmp"
    for temp in (fresh, stale):
        temp.write_bytes(b"")
    crashed_long_ago = time.time() - 2 * 3600
    os.utime(stale, (crashed_long_ago, crashed_long_ago))
    (partition / "part-t-000000000003.parquet").write_bytes(b"")
    assert open_landing_writes(partition) == [fresh]
    assert open_landing_writes(tmp_path / "missing") == []


# -- on a lake ------------------------------------------------------------------------------

def test_compaction_keeps_the_rows_and_the_standings(world):
    data, control = world
    lake = data / "lake"
    before = partition_rows(lake, D)
    report = compact_partition(lake, D, speed=speed_on(D))
    assert report.files_before == len(partition_files(control / "lake", D)) > 10
    assert report.files_after == 1
    assert len(report.compacted) == 1
    assert rows_checksum(partition_rows(lake, D)) == rows_checksum(before)
    target = report.compacted[0]["target"]
    assert sorted(compacted_originals(lake, target)) == sorted(
        str(p.relative_to(control / "lake")) for p in partition_files(control / "lake", D))
    live = read_current(lake)
    assert target in absorbed_with_compactions(lake, live.inputs["files"])
    # the next nights stay incremental and publish exactly what the untouched lake does
    for as_of in (D + timedelta(days=1), D + timedelta(days=2)):
        ours, theirs = run_batch(settings_for(data), as_of), run_batch(settings_for(control),
                                                                      as_of)
        assert ours.mode == theirs.mode == "incremental"
        assert ours.events == theirs.events
        assert published_standings(lake) == published_standings(control / "lake")
    # and a full recompute from the compacted lake agrees too
    run_batch(settings_for(data), D + timedelta(days=2), full=True)
    assert published_standings(lake) == published_standings(control / "lake")


def test_a_manifest_names_only_the_landed_files_still_in_the_lake(world):
    """A version's inputs kept every file any earlier version had read, the compacted-away
    (and retention-deleted) ones too, so the manifest every night reads and writes grew with
    the history (issue 13 goal 1). Now it names the landed files up to its night that are
    still there, and the nights after a compaction stay incremental."""
    data, _ = world
    lake = data / "lake"
    report = compact_partition(lake, D, speed=speed_on(D))
    originals = compacted_originals(lake, report.compacted[0]["target"])
    for as_of in (D + timedelta(days=1), D + timedelta(days=2)):
        assert run_batch(settings_for(data), as_of).mode == "incremental"
        live = read_current(lake)
        assert set(live.inputs["files"]) == {
            str(f.path.relative_to(lake)) for f in landed_files(lake) if f.ingest_date <= as_of}
        assert not set(originals) & set(live.inputs["files"])


def test_a_rerun_is_a_no_op(world):
    lake = world[0] / "lake"
    compact_partition(lake, D, speed=speed_on(D))
    files = partition_files(lake, D)
    again = compact_partition(lake, D, speed=speed_on(D))
    assert again.compacted == []
    assert again.skipped is None
    assert partition_files(lake, D) == files


def test_skipped_while_the_speed_layer_still_folds_the_partition(world):
    lake = world[0] / "lake"
    files = partition_files(lake, D)
    messages: list[str] = []
    report = compact_partition(lake, D, speed=speed_on(D - timedelta(days=1)),
                               say=messages.append)
    assert report.skipped
    assert "counted twice" in report.skipped
    assert any("not compacting" in m for m in messages)
    assert partition_files(lake, D) == files
    # and a partition the live batch version has not absorbed is not touched either
    later = D + timedelta(days=1)
    later_files = partition_files(lake, later)
    assert compact_partition(lake, later, speed=speed_on(later)).skipped
    assert partition_files(lake, later) == later_files


def test_an_open_landing_write_blocks_the_partition(world):
    lake = world[0] / "lake"
    partition = lake / "events" / f"ingest_date={D}"
    (partition / ".part-t-000000000999.parquet.abcd1234.tmp").write_bytes(b"")
    report = compact_partition(lake, D, speed=speed_on(D))
    assert report.skipped
    assert "writer" in report.skipped


def test_backfill_rows_past_the_watermark_and_late_files_stay_as_they_are(world):
    data, control = world
    lake = data / "lake"
    # a backfill file of an older lake in partition D holding a row stamped after the
    # watermark (backfills are stamped at landing now; such files remain)
    rows = [landed_row("bf1", "p001", 4, START + timedelta(hours=2)),
            landed_row("bf2", "p002", 6, START + timedelta(days=1, hours=3))]
    stamps = pa.array([r.pop("ingested_at") for r in rows], TIMESTAMP)
    for target in (data, control):
        backfill = land_legacy_backfill(target / "lake", "bf",
                                        pa.Table.from_pylist(rows, schema=EVENT_SCHEMA), stamps)
    assert backfill.ingest_date == D
    run_batch(settings_for(data), D)
    run_batch(settings_for(control), D)
    # a file landed into D after the batch ran (not absorbed)
    late = [landed_row("late", "p003", 2, START + timedelta(hours=5))]
    for target in (data, control):
        with LandingWriter(target / "lake", "late") as writer:
            writer.land(pa.Table.from_pylist([{k: v for k, v in late[0].items()
                                               if k != "ingested_at"}], schema=EVENT_SCHEMA),
                        late[0]["ingested_at"])
    report = compact_partition(lake, D, speed=speed_on(D))
    backfill_rel = str(backfill.path.relative_to(control / "lake"))  # the same in both
    assert "at or after" in report.left[backfill_rel]
    assert any("not absorbed" in why for why in report.left.values())
    assert (lake / backfill_rel).exists()
    assert len(report.compacted) == 1
    for as_of in (D + timedelta(days=1), D + timedelta(days=2)):
        ours, theirs = run_batch(settings_for(data), as_of), run_batch(settings_for(control),
                                                                      as_of)
        assert ours.mode == theirs.mode
        assert published_standings(lake) == published_standings(control / "lake")


def test_files_tied_on_identity_and_stamp_keep_their_names(world):
    lake = world[0] / "lake"
    at = START + timedelta(hours=20, minutes=30)
    for writer, points in (("x", 1), ("y", 9)):  # the same identity, the same stamp
        with LandingWriter(lake, writer) as handle:
            row = {k: v for k, v in landed_row("tie", "p001", points, at).items()
                   if k != "ingested_at"}
            handle.land(pa.Table.from_pylist([row], schema=EVENT_SCHEMA), at)
    run_batch(settings_for(world[0]), D)
    report = compact_partition(lake, D, speed=speed_on(D))
    tied = [p for p, why in report.left.items() if "shares an identity" in why]
    assert len(tied) == 2
    assert all((lake / p).exists() for p in tied)
    assert len(report.compacted) == 1


@pytest.mark.parametrize("crash_at", ["record", "written", "verified", "deleted"])
def test_a_crash_at_any_step_changes_no_standing_and_a_rerun_finishes(world, crash_at):
    data, control = world
    lake = data / "lake"
    before = rows_checksum(partition_rows(control / "lake", D))
    with pytest.raises(InjectedFault), faults.injected(f"compact.{crash_at}", faults.fail):
        compact_partition(lake, D, speed=speed_on(D))
    [record_path] = (lake / "events" / f"ingest_date={D}").glob("*.compaction.json")
    record = json.loads(record_path.read_text())
    assert record["done"] is False
    target = lake / record["target"]
    originals_left = [o for o in record["originals"] if (lake / o["path"]).exists()]
    if crash_at in ("written", "verified"):  # both the originals and the new file are there
        assert target.exists()
        assert len(originals_left) == len(record["originals"])
    # whatever the state, the batch publishes exactly what the untouched lake does
    as_of = D + timedelta(days=1)
    assert run_batch(settings_for(data), as_of).mode == "incremental"
    run_batch(settings_for(control), as_of)
    assert published_standings(lake) == published_standings(control / "lake")
    run_batch(settings_for(data), as_of, full=True)
    assert published_standings(lake) == published_standings(control / "lake")
    # a rerun finishes the job
    report = compact_partition(lake, D, speed=speed_on(D))
    assert report.resumed == 1
    assert json.loads(record_path.read_text())["done"] is True
    assert partition_files(lake, D) == [target]
    assert rows_checksum(partition_rows(lake, D)) == before


def test_a_compacted_partition_can_be_compacted_again(world):
    data, control = world
    lake = data / "lake"
    first = compact_partition(lake, D, speed=speed_on(D)).compacted[0]["target"]
    # more small files land into D (a late backfill), then the nights go on
    rows = [landed_row(f"more{i}", f"p00{i}", i, START + timedelta(hours=i)) for i in range(3)]
    for target in (data, control):
        with LandingWriter(target / "lake", "more") as writer:
            for row in rows:
                event = {k: v for k, v in row.items() if k != "ingested_at"}
                writer.land(pa.Table.from_pylist([event], schema=EVENT_SCHEMA),
                            row["ingested_at"])
    as_of = D + timedelta(days=1)
    assert run_batch(settings_for(data), as_of).mode == "full"  # a backfill into a closed day
    run_batch(settings_for(control), as_of)
    second = compact_partition(lake, D, speed=speed_on(as_of))
    assert len(second.compacted) == 1
    assert second.files_after == 1
    assert first in compacted_originals(lake, second.compacted[0]["target"])
    later = as_of + timedelta(days=1)
    ours, theirs = run_batch(settings_for(data), later), run_batch(settings_for(control), later)
    assert ours.mode == theirs.mode == "incremental"
    assert published_standings(lake) == published_standings(control / "lake")


@pytest.mark.redis
def test_the_speed_layer_never_folds_a_compacted_file(world, redis_client, redis_server):
    from jobs.compact import live_speed_watermark
    from speed_layer.service import SpeedLayer

    data, _control = world
    lake = data / "lake"
    settings = Settings.from_env({"LEADERBOARD_DATA": str(data),
                                  "REDIS_URL": redis_server.url})
    speed = SpeedLayer(redis_client, settings.registry, lake)
    live = read_current(lake)
    # the speed layer still on no version: it folds everything, so compaction must wait
    assert "no batch version" in compact_partition(
        lake, D, speed=SpeedWatermark(present=True)).skipped
    speed.rebase(live)
    speed.repair()  # fold everything landed past the watermark
    gate = live_speed_watermark(settings)
    assert gate.version == live.version
    assert gate.watermark == live.watermark_at
    version = speed.current()
    before = {str(f.path) for f in speed.folder.pending_or_folded(version)}
    state = merged_state(redis_client, version.tag)
    assert state  # the speed layer holds the events after the watermark
    report = compact_partition(lake, D, speed=gate)
    target = str(lake / report.compacted[0]["target"])
    assert target not in {str(f.path) for f in speed.folder.pending(version)}
    assert target not in {str(f.path) for f in speed.folder.pending_or_folded(version)}
    assert {str(f.path) for f in speed.folder.pending_or_folded(version)} == before
    assert speed.repair() == 0
    assert merged_state(redis_client, version.tag) == state


def merged_state(client, tag: str) -> dict[bytes, list]:
    """Every merged zset of a speed version, with scores."""
    return {key: client.zrange(key, 0, -1, withscores=True)
            for key in sorted(client.scan_iter(match=f"lb:{{*}}:{tag}:M"))}


def test_main_compacts_a_partition_from_the_command_line(world, clean_env, capsys):
    from jobs.compact import main

    data, _control = world
    assert main(["--date", str(D), "--data", str(data)]) == 0  # no REDIS_URL: no speed layer
    report = json.loads(capsys.readouterr().out)
    assert report["files_after"] == 1
    assert len(partition_files(data / "lake", D)) == 1


def test_compaction_lists_only_its_own_partition(world, partitions_listed):
    """Compacting day D lists D's files and records only, not every partition of the lake
    (it listed the whole lake four times: a cost that grew with a long retention's
    history); what it compacts is unchanged (the tests above)."""
    lake = world[0] / "lake"
    assert len({f.ingest_date for f in landed_files(lake)}) > 1
    partitions_listed.clear()
    report = compact_partition(lake, D, speed=speed_on(D))
    assert len(report.compacted) == 1
    assert partitions_listed == {D.isoformat()}
