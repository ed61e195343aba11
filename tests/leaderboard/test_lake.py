"""The lake and the landing writer: atomic files, crash safety, seq ownership, layouts."""

from __future__ import annotations

import os
import signal
import subprocess
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from strategies import FIXED_NOW, event_row, text_row

from leaderboard import lake as lake_module
from leaderboard.lake import (
    LandedFile,
    LandingWriter,
    WriterBusy,
    atomic_write_bytes,
    atomic_write_parquet,
    landed_files,
    parse_landed_name,
)
from leaderboard.schema import (
    EVENT_SCHEMA,
    LANDED_SCHEMA,
    QUARANTINE_SCHEMA,
    as_landed,
    identity_match_ids,
)
from leaderboard.validation import validate_events


def _events(*match_ids: str, hours: list[int] | None = None) -> pa.Table:
    hours = hours or [10] * len(match_ids)
    return pa.Table.from_pylist(
        [event_row(match_id=m, event_time=datetime(2026, 12, 1, h, tzinfo=UTC))
         for m, h in zip(match_ids, hours, strict=True)], schema=EVENT_SCHEMA)


def _visible(lake: Path, kind: str = "events") -> list[tuple[str, int, date]]:
    return [(f.writer, f.seq, f.ingest_date) for f in landed_files(lake, kind=kind)]


class _ReplaceFails(OSError):
    pass


def _failing_replace(real, only_suffix: str | None = None):
    def replace(src, dst):
        if only_suffix is None or str(dst).endswith(only_suffix):
            raise _ReplaceFails(f"simulated failure renaming {src} -> {dst}")
        return real(src, dst)
    return replace


# -- atomic writes -------------------------------------------------------------------------


def test_atomic_write_parquet_writes_zstd_and_returns_the_size(lake):
    target = lake / "events" / "ingest_date=2026-12-01" / "part-w1-000000000000.parquet"
    size = atomic_write_parquet(_events("b", "a", hours=[12, 9]), target, sort_by="event_time")
    assert size == target.stat().st_size > 0
    assert pq.read_table(target).column("match_id").to_pylist() == ["a", "b"], "sorted"
    metadata = pq.ParquetFile(target).metadata
    assert {metadata.row_group(0).column(i).compression for i in range(metadata.num_columns)} == {
        "ZSTD"}
    assert [p.name for p in target.parent.iterdir()] == [target.name], "no temp file left"


def test_a_failed_rename_leaves_no_visible_file(lake, monkeypatch):
    target = lake / "events" / "ingest_date=2026-12-01" / "part-w1-000000000000.parquet"
    monkeypatch.setattr(os, "replace", _failing_replace(os.replace))
    with pytest.raises(_ReplaceFails):
        atomic_write_parquet(_events("a"), target)
    assert not target.exists()
    assert landed_files(lake) == []


def test_a_failed_overwrite_keeps_the_old_file_whole(lake, monkeypatch):
    target = lake / "manifests" / "current.json"
    atomic_write_bytes(target, b'{"version": 1}')
    monkeypatch.setattr(os, "replace", _failing_replace(os.replace))
    with pytest.raises(_ReplaceFails):
        atomic_write_bytes(target, b'{"version": 2}')
    assert target.read_bytes() == b'{"version": 1}'
    monkeypatch.undo()
    atomic_write_bytes(target, b'{"version": 2}')
    assert target.read_bytes() == b'{"version": 2}'


def test_a_failed_landing_burns_its_seq(lake, monkeypatch):
    with LandingWriter(lake, "w1") as writer:
        monkeypatch.setattr(os, "replace", _failing_replace(os.replace, ".parquet"))
        with pytest.raises(_ReplaceFails):
            writer.land(_events("a"), FIXED_NOW)
        assert landed_files(lake) == []
        monkeypatch.undo()
        [landed] = writer.land(_events("a"), FIXED_NOW)
    assert landed.seq == 1, "seq 0 was reserved before the failed write and is never reused"
    assert _visible(lake) == [("w1", 1, date(2026, 12, 2))]


# -- a real crash --------------------------------------------------------------------------

_CRASHING_WRITER = r"""
import os, sys
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

from leaderboard import lake
from leaderboard.schema import EVENT_SCHEMA

def events(match_id):
    return pa.Table.from_pylist([{
        "match_id": match_id, "player_id": "p1", "points": 5,
        "event_time": datetime(2026, 12, 1, 10, tzinfo=UTC), "region": "na",
        "mode": "ranked", "server_id": "s1"}], schema=EVENT_SCHEMA)

root, kill_point = Path(sys.argv[1]), sys.argv[2]
writer = lake.LandingWriter(root, "w1")
writer.land(events("first"), datetime(2026, 12, 2, 12, tzinfo=UTC))
real_replace = os.replace

def dying_replace(src, dst):
    if str(dst).endswith(".parquet") and kill_point == "before-rename":
        print("dying at", dst, flush=True)
        os.kill(os.getpid(), 9)
    real_replace(src, dst)
    if str(dst).endswith(".parquet") and kill_point == "after-rename":
        print("dying at", dst, flush=True)
        os.kill(os.getpid(), 9)

os.replace = dying_replace
writer.land(events("second"), datetime(2026, 12, 2, 12, 0, 1, tzinfo=UTC))
print("survived", flush=True)
"""


@pytest.mark.parametrize(("kill_point", "visible_seqs"), [
    ("before-rename", [0]),      # the second file was written to a temp file, never renamed
    ("after-rename", [0, 1]),    # renamed, but the directory was never fsynced
])
def test_sigkill_mid_landing_then_restart(lake, python, python_subprocess_env, kill_point,
                                          visible_seqs):
    child = subprocess.run([python, "-c", _CRASHING_WRITER, str(lake), kill_point],
                           env=python_subprocess_env, capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert "survived" not in child.stdout
    dying_target = Path(child.stdout.split("dying at ", 1)[1].strip())
    dead_seq = parse_landed_name(dying_target)[1]
    assert dead_seq == 1

    assert [f.seq for f in landed_files(lake)] == visible_seqs
    partition = lake / "events" / "ingest_date=2026-12-02"
    if kill_point == "before-rename":
        assert any(p.name.endswith(".tmp") for p in partition.iterdir()), (
            "the child really died mid-landing, with its temp file written")
    for landed in landed_files(lake):  # whatever is visible is whole
        assert pq.read_table(landed.path).num_rows == 1
    first = landed_files(lake)[0].path
    first_bytes = first.read_bytes()

    with LandingWriter(lake, "w1") as restarted:  # the dead process's lock is gone
        assert restarted.next_seq > dead_seq
        [new] = restarted.land(_events("third"), FIXED_NOW)
    assert new.seq > dead_seq
    assert first.read_bytes() == first_bytes, "a restarted writer never overwrites"
    assert [f.seq for f in landed_files(lake)] == [*visible_seqs, new.seq]
    assert pq.read_table(new.path).column("match_id").to_pylist() == ["third"]


# -- one process per writer id -------------------------------------------------------------

_SECOND_PROCESS = r"""
import sys
from pathlib import Path
from leaderboard.lake import LandingWriter, WriterBusy
try:
    LandingWriter(Path(sys.argv[1]), "w1")
except WriterBusy as exc:
    print(exc)
    sys.exit(3)
sys.exit(0)
"""


def test_a_second_writer_with_the_same_id_is_refused(lake, python, python_subprocess_env):
    with LandingWriter(lake, "w1"):
        with pytest.raises(WriterBusy, match="writer w1 is held by another running process"):
            LandingWriter(lake, "w1")
        other = subprocess.run([python, "-c", _SECOND_PROCESS, str(lake)],
                               env=python_subprocess_env, capture_output=True, text=True,
                               timeout=120)
        assert other.returncode == 3, other.stderr
        assert "writer w1 is held" in other.stdout
        assert "use another writer id" in other.stdout  # what to do next
        assert "another writer id" in other.stdout
        with LandingWriter(lake, "w2") as different:  # other ids are independent
            assert different.next_seq == 0
    with LandingWriter(lake, "w1") as again:  # released on close
        assert again.next_seq == 0


@pytest.mark.parametrize("writer_id", ["", "W1", "w-1", "w" * 33, "../w"])
def test_writer_ids_are_checked(lake, writer_id):
    with pytest.raises(ValueError, match="writer id"):
        LandingWriter(lake, writer_id)


# -- seq recovery --------------------------------------------------------------------------


def test_seqs_are_shared_by_events_and_quarantine_and_survive_restarts(lake, registry):
    rejected = validate_events(pa.Table.from_pylist([text_row(points="abc")]), registry,
                               now=FIXED_NOW, source="upload.csv").rejected
    with LandingWriter(lake, "w1") as writer:
        assert [f.seq for f in writer.land(_events("a"), FIXED_NOW)] == [0]
        assert [f.seq for f in writer.quarantine(rejected, FIXED_NOW)] == [1]
        assert [f.seq for f in writer.land(_events("b"), FIXED_NOW)] == [2]
    with LandingWriter(lake, "w1") as writer:
        assert writer.next_seq == 3
    (lake / "writers" / "w1.seq").unlink()
    with LandingWriter(lake, "w1") as writer:
        assert writer.next_seq == 3, "recovered from the files on disk"
    (lake / "writers" / "w1.seq").write_text("garbage")
    with LandingWriter(lake, "w1") as writer:
        assert writer.next_seq == 3
    (lake / "writers" / "w1.seq").write_text("10")
    with LandingWriter(lake, "w1") as writer:
        assert writer.next_seq == 10, "burned seqs stay burned"


def _seq_writes(monkeypatch) -> list[bytes]:
    """Record every write of a writer's seq file."""
    writes: list[bytes] = []
    real = lake_module.atomic_write_bytes

    def recording(target: Path, payload: bytes) -> None:
        if target.suffix == ".seq":
            writes.append(payload)
        real(target, payload)

    monkeypatch.setattr(lake_module, "atomic_write_bytes", recording)
    return writes


def test_seqs_are_reserved_in_durable_blocks(lake, monkeypatch):
    writes = _seq_writes(monkeypatch)
    monkeypatch.setattr(lake_module, "SEQ_BLOCK", 2)
    with LandingWriter(lake, "w1") as writer:
        seqs = [f.seq for _ in range(5) for f in writer.land(_events("a"), FIXED_NOW)]
        assert seqs == [0, 1, 2, 3, 4], "no gaps while the writer lives"
        assert writes == [b"2", b"4", b"6"], "one durable write per block, before its first seq"
        assert (lake / "writers" / "w1.seq").read_text() == "6"
    assert writes[-1] == b"5", "a clean close gives back the unused rest of the block"
    with LandingWriter(lake, "w1") as writer:
        assert writer.next_seq == 5


_DYING_WRITER = r"""
import os, sys
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

from leaderboard.lake import LandingWriter
from leaderboard.schema import EVENT_SCHEMA

def events(match_id):
    return pa.Table.from_pylist([{
        "match_id": match_id, "player_id": "p1", "points": 5,
        "event_time": datetime(2026, 12, 1, 10, tzinfo=UTC), "region": "na",
        "mode": "ranked", "server_id": "s1"}], schema=EVENT_SCHEMA)

writer = LandingWriter(Path(sys.argv[1]), "w1")
writer.land(events("a"), datetime(2026, 12, 2, 12, tzinfo=UTC))
writer.land(events("b"), datetime(2026, 12, 2, 12, tzinfo=UTC))
os.kill(os.getpid(), 9)
"""


def test_a_writer_that_dies_burns_the_rest_of_its_block(lake, python, python_subprocess_env):
    child = subprocess.run([python, "-c", _DYING_WRITER, str(lake)],
                           env=python_subprocess_env, capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert [f.seq for f in landed_files(lake)] == [0, 1]
    before = {f.path: f.path.read_bytes() for f in landed_files(lake)}
    with LandingWriter(lake, "w1") as restarted:
        assert restarted.next_seq == lake_module.SEQ_BLOCK, "the dead writer's block is burned"
        [new] = restarted.land(_events("c"), FIXED_NOW)
    assert new.seq == lake_module.SEQ_BLOCK
    assert {p: p.read_bytes() for p in before} == before, "nothing landed is overwritten"


def test_landing_nothing_writes_nothing(lake):
    with LandingWriter(lake, "w1") as writer:
        assert writer.land(_events(), FIXED_NOW) == []
        assert writer.next_seq == 0
    assert landed_files(lake) == []


# -- what a landed file holds --------------------------------------------------------------


def test_a_landed_file(lake):
    events = _events("c", "a", "b", hours=[15, 9, 12])
    with LandingWriter(lake, "w1") as writer:
        [landed] = writer.land(events, FIXED_NOW)
    assert landed == LandedFile("w1", 0, date(2026, 12, 2), landed.path, 3)
    assert landed.path == (lake / "events" / "ingest_date=2026-12-02"
                           / "part-w1-000000000000.parquet")
    table = pq.read_table(landed.path)
    assert table.schema.equals(LANDED_SCHEMA, check_metadata=False)
    assert table.column("match_id").to_pylist() == ["a", "b", "c"], "sorted by event_time"
    assert table.column("ingested_at").to_pylist() == [FIXED_NOW] * 3
    assert table.column("backfill").to_pylist() == [False] * 3
    assert table.column("board").to_pylist() == [None] * 3, "match events, no direct board"
    assert table.drop_columns(["ingested_at", "backfill", "board"]).sort_by(
        "match_id").to_pylist() == events.sort_by("match_id").to_pylist()
    metadata = pq.ParquetFile(landed.path).metadata
    assert all(metadata.row_group(g).column(c).compression == "ZSTD"
               for g in range(metadata.num_row_groups) for c in range(metadata.num_columns))
    assert landed_files(lake)[0].path == landed.path


def test_a_landed_file_sorts_stably_and_dictionary_encodes_only_low_cardinality_columns(lake):
    in_order = _events("a", "b", "c", "d", hours=[9, 9, 12, 15])
    shuffled = _events("c", "a", "d", "b", hours=[12, 9, 15, 9])
    with LandingWriter(lake, "w1") as writer:
        [sorted_file] = writer.land(in_order, FIXED_NOW)
        [shuffled_file] = writer.land(shuffled, FIXED_NOW)
    assert pq.read_table(sorted_file.path).column("match_id").to_pylist() == ["a", "b", "c", "d"]
    assert pq.read_table(shuffled_file.path).column("match_id").to_pylist() == [
        "a", "b", "c", "d"], "ties keep their input order"
    metadata = pq.ParquetFile(sorted_file.path).metadata
    dictionary = {metadata.schema.column(i).name for i in range(metadata.num_columns)
                  if "RLE_DICTIONARY" in metadata.row_group(0).column(i).encodings}
    assert dictionary == {"points", "region", "mode", "server_id", "ingested_at"}


def test_landing_events_with_a_null_in_a_required_column_fails_and_writes_nothing(lake):
    events = _events("a", "b")
    events = events.set_column(0, pa.field("match_id", pa.string()), pa.array(["a", None]))
    with LandingWriter(lake, "w1") as writer:
        with pytest.raises(ValueError, match="non-nullable"):
            writer.land(events, FIXED_NOW)
        assert writer.next_seq == 0
    assert landed_files(lake) == []


@pytest.mark.parametrize(("stamp", "day", "utc"), [
    (datetime(2026, 12, 2, 1, 0, tzinfo=timezone(timedelta(hours=3))), date(2026, 12, 1),
     datetime(2026, 12, 1, 22, 0, tzinfo=UTC)),
    (datetime(2026, 12, 2, 1, 0), date(2026, 12, 2), datetime(2026, 12, 2, 1, 0, tzinfo=UTC)),
])
def test_the_stamp_and_its_partition_are_utc(lake, stamp, day, utc):
    with LandingWriter(lake, "w1") as writer:
        [landed] = writer.land(_events("a"), stamp)
    assert landed.ingest_date == day
    assert landed.path.parent.name == f"ingest_date={day.isoformat()}"
    assert pq.read_table(landed.path).column("ingested_at").to_pylist() == [utc]


# -- backfills -----------------------------------------------------------------------------

BACKFILL_AT = datetime(2026, 12, 3, 1, tzinfo=UTC)


def _backfill(lake: Path) -> list[LandedFile]:
    events = _events("d", "e", "c", "a", "b", hours=[1, 2, 3, 4, 5])
    with LandingWriter(lake, "w1") as writer:
        return writer.land(events, BACKFILL_AT, backfill=True)


def test_a_backfill_is_stamped_at_landing_and_flagged(lake):
    """Issue 10 item 4: a backfill's ingested_at is its landing time like any event's (it
    was its event_time, so the speed layer skipped it); the flag says it is history."""
    [landed] = _backfill(lake)
    assert landed.ingest_date == BACKFILL_AT.date()
    table = pq.read_table(landed.path)
    assert table.schema.equals(LANDED_SCHEMA, check_metadata=False)
    assert set(table.column("ingested_at").to_pylist()) == {BACKFILL_AT}
    assert set(table.column("backfill").to_pylist()) == {True}
    assert table.column("match_id").to_pylist() == ["d", "e", "c", "a", "b"], "by event_time"
    with LandingWriter(lake, "w2") as writer:
        [live] = writer.land(_events("f"), BACKFILL_AT)
    assert pq.read_table(live.path).column("backfill").to_pylist() == [False]


def test_a_large_landing_is_chunked_in_one_partition(lake, monkeypatch):
    monkeypatch.setattr(lake_module, "BACKFILL_FILE_ROWS", 2)
    files = _backfill(lake)
    assert [f.seq for f in files] == [0, 1, 2]
    assert [f.rows for f in files] == [2, 2, 1]
    assert {f.ingest_date for f in files} == {BACKFILL_AT.date()}


def test_a_file_from_before_the_backfill_column_reads_as_live(lake):
    [landed] = _backfill(lake)
    old = pq.read_table(landed.path).drop_columns(["backfill", "board"])
    assert as_landed(old).column("backfill").to_pylist() == [False] * 5
    assert as_landed(old).column("board").to_pylist() == [None] * 5, "match events"
    assert as_landed(old).schema.equals(LANDED_SCHEMA)


def test_identity_of_a_direct_score_names_its_board():
    """A direct score's identity is (board, match_id, player_id): it never equals a match
    event's (match_id, player_id), nor another board's score of the same match."""
    table = pa.table({"match_id": ["m1", "m1", "m1", "m1"],
                      "board": [None, "best-lap", "coins", None]})
    ids = identity_match_ids(table).to_pylist()
    assert ids[0] == ids[3] == "m1"
    assert len(set(ids)) == 3
    assert identity_match_ids(table.drop_columns(["board"])).to_pylist() == ["m1"] * 4


# -- quarantine ----------------------------------------------------------------------------


def test_quarantine_files(lake, registry):
    rows = [text_row(match_id="ok"), text_row(match_id="bad-1", points="abc"),
            text_row(match_id="bad-2", region="mars")]
    table = pa.table({k: pa.array([r[k] for r in rows], pa.string()) for k in rows[0]})
    rejected = validate_events(table, registry, now=FIXED_NOW, source="upload.csv").rejected
    with LandingWriter(lake, "w1") as writer:
        [landed] = writer.quarantine(rejected, FIXED_NOW)
    assert landed.path.parent == lake / "quarantine" / "ingest_date=2026-12-02"
    assert _visible(lake, "quarantine") == [("w1", 0, date(2026, 12, 2))]
    assert landed_files(lake) == [], "quarantine is not the event log"
    stored = pq.read_table(landed.path)
    assert stored.schema.equals(QUARANTINE_SCHEMA, check_metadata=False)
    assert [(r["match_id"], r["points"], r["region"], r["reason"], r["source"])
            for r in stored.to_pylist()] == [
        ("bad-1", "abc", "na", "bad_type", "upload.csv"),
        ("bad-2", "5", "mars", "unknown_region", "upload.csv")]
    assert all(r["detail"] for r in stored.to_pylist())
    assert stored.column("ingested_at").to_pylist() == [FIXED_NOW] * 2


# -- listing -------------------------------------------------------------------------------


def test_landed_files_ignores_temp_and_foreign_files(lake):
    with LandingWriter(lake, "w2") as writer:
        writer.land(_events("a"), FIXED_NOW)
    with LandingWriter(lake, "w1") as writer:
        writer.land(_events("a"), FIXED_NOW)
        writer.land(_events("a"), FIXED_NOW - timedelta(days=1))
    partition = lake / "events" / "ingest_date=2026-12-02"
    for name in (".part-w1-000000000009.parquet.1a2b3c4d.tmp", "part-W1-000000000001.parquet",
                 "part-w1-1.parquet", "notes.txt", "part-w1-000000000005.parquet.bak"):
        (partition / name).write_bytes(b"not a landed file")
    (lake / "events" / "scratch").mkdir()
    (lake / "events" / "scratch" / "part-w1-000000000007.parquet").write_bytes(b"x")
    assert _visible(lake) == [("w1", 0, date(2026, 12, 2)), ("w1", 1, date(2026, 12, 1)),
                              ("w2", 0, date(2026, 12, 2))]
    assert landed_files(lake / "nowhere") == []


@pytest.mark.parametrize(("name", "parsed"), [
    ("part-w1-000000000042.parquet", ("w1", 42)),
    ("part-ingest_a-000000000000.parquet", ("ingest_a", 0)),
    ("part-w1-42.parquet", None),
    (".part-w1-000000000042.parquet.abcd.tmp", None),
    ("part-w1-000000000042.parquet.tmp", None),
])
def test_parse_landed_name(name, parsed):
    assert parse_landed_name(Path(name)) == parsed
