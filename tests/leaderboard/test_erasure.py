"""The erasure ledger and the one-file rewrite every part of an erasure uses."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq

from leaderboard.erasure import ErasureLedger, record_erasure, without_player

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
