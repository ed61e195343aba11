"""The erasure ledger and the one-file rewrite every part of an erasure uses."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq

from leaderboard.erasure import (
    REDACTED,
    ErasureLedger,
    record_erasure,
    redact_erased,
    without_player,
)

AT = datetime(2026, 12, 1, tzinfo=UTC)


def test_the_ledger_keeps_a_salted_hash_and_one_salt(tmp_path):
    first = record_erasure(tmp_path, "alice", AT)
    assert record_erasure(tmp_path, "alice", AT) == first  # recorded once
    ledger = ErasureLedger.load(tmp_path)
    assert ledger.erased("alice")
    assert not ledger.erased("bob")
    assert b"alice" not in b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    other = tmp_path / "other"
    assert record_erasure(other, "alice", AT) != first  # another data dir, another salt


def test_a_rewrite_takes_the_id_as_a_token_not_inside_longer_ids(tmp_path):
    """Regression (schemathesis erasing the id `a`): a substring match took every
    quarantined row with an `a` anywhere, other players' included."""
    path = tmp_path / "q.parquet"
    pq.write_table(pa.table({"player_id": ["a", "alice", "bad a!", None],
                             "detail": ["x", "x", "player id 'bad a!' must be", "a"]}), path)
    assert without_player(path, "a", any_text=True) == 3
    assert pq.read_table(path).column("player_id").to_pylist() == ["alice"]


def test_text_written_after_an_erasure_loses_the_id_as_a_token(tmp_path):
    """Free text written after an erasure (a reason, a display name) loses the erased id
    where the erasure's own pass would have taken it: as a token, every time, in its case;
    not inside a longer id, and nothing with an empty ledger."""
    assert redact_erased("smurf of a.b", ErasureLedger.load(tmp_path)) == "smurf of a.b"
    record_erasure(tmp_path, "a.b", AT)
    ledger = ErasureLedger.load(tmp_path)
    assert redact_erased("smurf of a.b,a.b (a.b)", ledger) == (
        f"smurf of {REDACTED},{REDACTED} ({REDACTED})")
    assert redact_erased("a.bc xa.b A.B a b", ledger) == "a.bc xa.b A.B a b"
    assert redact_erased("", ledger) == ""
    # The same tokens as the erasure's rewrite: what one redacts, the other does.
    text = "a.b:1 -a.b a.b! é a.b"
    assert redact_erased(text, ledger) == f"a.b:1 -a.b {REDACTED}! é {REDACTED}"
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"player_id": ["z"], "reason": [text]}), path)
    without_player(path, "a.b", redact=("reason",))
    assert pq.read_table(path).column("reason").to_pylist() == [redact_erased(text, ledger)]


def test_an_id_before_a_sentences_punctuation_is_redacted_too(tmp_path):
    """Regression (review s9, finding 3): `.` and `:` are id characters, so "alt of a.b."
    (a sentence's end) and "a.b: smurf" were tokens other than `a.b`, kept as written by
    the erasure's pass and on write. A token ending in them is also the id without them;
    a longer id still is not the id."""
    record_erasure(tmp_path, "a.b", AT)
    ledger = ErasureLedger.load(tmp_path)
    assert redact_erased("alt of a.b. a.b: smurf, a.b.: x", ledger) == (
        f"alt of {REDACTED}. {REDACTED}: smurf, {REDACTED}.: x")
    assert redact_erased("a.b.c a.bc: a.b-x", ledger) == "a.b.c a.bc: a.b-x"
    record_erasure(tmp_path, "c.", AT)  # an id may end with a dot itself
    ledger = ErasureLedger.load(tmp_path)
    assert redact_erased("c. c.. c", ledger) == f"{REDACTED} {REDACTED}. c"
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"player_id": ["z"], "reason": ["alt of a.b."]}), path)
    assert without_player(path, "a.b", redact=("reason",)) == 1
    assert pq.read_table(path).column("reason").to_pylist() == [f"alt of {REDACTED}."]


def test_a_quarantined_row_of_another_id_ending_in_a_dot_stays(tmp_path):
    """Regression (review s9c, finding 2): `p1.` and `p1:` are valid ids of other players;
    erasing `p1` removed their quarantined rows too once a token ending in `.`/`:` counted
    as the id. Rows are removed by the exact token; only free text is redacted with the
    punctuation tolerated ("ban p1." becomes "ban [erased].", `p1.` or not)."""
    path = tmp_path / "q.parquet"
    pq.write_table(pa.table({"player_id": ["p1.", "p1:", "p1", "zz"],
                             "detail": ["x", "x", "x", "player id 'p1' must be"]}), path)
    assert without_player(path, "p1", any_text=True) == 2
    assert pq.read_table(path).column("player_id").to_pylist() == ["p1.", "p1:"]


def test_erasing_the_id_erased_ends_and_leaves_the_markers_alone(tmp_path):
    """Regression (review s9, finding 2): the erasure's pass replaced the id until no token
    of it was left; for the (valid) id `erased`, each `[erased]` holds the token again, so
    the pass never ended, holding the erasure barrier (every batch, ban and profile write
    waited for good). One pass now, and the markers already there are left as they are."""
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"player_id": ["z", "y"],
                             "reason": [f"fan of {REDACTED}", "erased,erased"]}), path)
    assert without_player(path, "erased", redact=("reason",)) == 1
    assert pq.read_table(path).column("reason").to_pylist() == [
        f"fan of {REDACTED}", f"{REDACTED},{REDACTED}"]
    record_erasure(tmp_path, "erased", AT)
    assert redact_erased(f"erased {REDACTED}", ErasureLedger.load(tmp_path)) == (
        f"{REDACTED} {REDACTED}")


def test_a_file_left_empty_is_deleted_when_asked(tmp_path):
    """Regression: an emptied quarantine file broke the quarantine listing (an empty
    boolean mask); such files are deleted instead."""
    path = tmp_path / "q.parquet"
    pq.write_table(pa.table({"player_id": ["a", "a"]}), path)
    assert without_player(path, "a", drop_empty=True) == 2
    assert not path.exists()
    pq.write_table(pa.table({"player_id": ["a", "b"]}), path)
    assert without_player(path, "zz") == 0
    assert without_player(path, "a") == 1
    assert pq.read_table(path).column("player_id").to_pylist() == ["b"]


def test_a_shared_barrier_creates_nothing_where_there_is_nothing_to_guard(tmp_path):
    """Regression (review s8, finding 8): the barrier made `<lake>/erasure/` (parents too)
    on every use, so a compaction on a mistyped data dir, or a retention dry run, created
    the lake (and failed on a read-only backup). A shared holder with no lake, or a dry
    run's (`create=False`) with no barrier file yet, now makes nothing."""
    from leaderboard.erasure import erasure_barrier

    missing = tmp_path / "mistyped" / "lake"
    with erasure_barrier(missing, exclusive=False):
        pass
    assert not (tmp_path / "mistyped").exists()
    lake = tmp_path / "lake"
    lake.mkdir()
    with erasure_barrier(lake, exclusive=False, create=False):
        pass
    assert list(lake.iterdir()) == []
    with erasure_barrier(lake, exclusive=False):  # a compaction's: it guards a real lake
        pass
    assert (lake / "erasure" / "barrier.lock").exists()


def test_a_barrier_file_removed_before_its_lock_is_opened_again(tmp_path, monkeypatch):
    """Regression (review s8, finding 8): `demo --fresh` removing the lake between a
    holder's open and its lock left the holder locking a removed file, which a later
    erasure (opening the file at the path) did not wait for. The holder now checks the
    locked file is the one at the path, as `jobs.sweep.hold_run` does, and opens it again.
    Forced: the first lock removes the file first; then a probe for the exclusive lock on
    the path's file must find it held."""
    import fcntl
    from types import SimpleNamespace

    import pytest

    import leaderboard.erasure as erasure_module

    lake = tmp_path / "lake"
    lake.mkdir()
    path = lake / "erasure" / "barrier.lock"
    removed: list[bool] = []

    def flock(handle, operation: int) -> None:
        if not removed:
            removed.append(True)
            path.unlink()  # as `demo --fresh` would, between the open and the lock
        fcntl.flock(handle, operation)

    monkeypatch.setattr(erasure_module, "fcntl", SimpleNamespace(
        flock=flock, LOCK_EX=fcntl.LOCK_EX, LOCK_SH=fcntl.LOCK_SH))
    with erasure_module.erasure_barrier(lake, exclusive=False):
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as probe, pytest.raises(BlockingIOError):
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)



def test_a_marker_that_is_not_an_object_stops_nothing(tmp_path):
    """Regression (review s9e): a marker of valid JSON that is not an object (`null`,
    `[]`) raised AttributeError in every nightly batch and every erasure. It lists no file
    and still counts as a stopped erasure."""
    from jobs.erase import repair_stopped, stopped_erasures

    folder = tmp_path / "erasure"
    folder.mkdir()
    for number, text in enumerate(("null", "[]", '"x"', "{not json", "")):
        (folder / f"pending-{number}").write_text(text)
    assert stopped_erasures(tmp_path) == 5
    assert repair_stopped(tmp_path) == 0
    assert stopped_erasures(tmp_path) == 5
