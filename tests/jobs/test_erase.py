"""`jobs.erase` on what other features leave in the lake."""

from __future__ import annotations

from datetime import UTC, datetime

from jobs.erase import erase_from_lake
from leaderboard.quarantine import Release, read_releases, write_release
from leaderboard.registry import load_registry

AT = datetime(2026, 12, 1, 12, tzinfo=UTC)


def test_an_erasure_runs_over_a_release_ledger(tmp_path):
    """The releases' ledger names rows by id (strings, no player id). Before, the erasure
    read each entry's rows as dicts and died with AttributeError half-way through the lake
    (after the landing zone and quarantine were rewritten, before the rollups)."""
    lake = tmp_path / "lake"
    ids = ("2026-12-01.http.3.0.5f0c2a9e",)
    write_release(lake, Release(7, AT, ids, landed=True))
    erase_from_lake(lake, load_registry(None), "alice", at=AT)
    assert [r.rows for r in read_releases(lake)] == [ids]  # nothing in it names a player
