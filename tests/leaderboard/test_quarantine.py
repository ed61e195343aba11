"""The quarantine for review: stable row ids, filters, pages that resume where they ended."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from leaderboard.lake import LandingWriter
from leaderboard.quarantine import (
    QUARANTINE_ID_PATTERN,
    StaleCursor,
    find_rows,
    list_quarantine,
    parse_quarantine_id,
)
from leaderboard.schema import INPUT_FIELDS, QUARANTINE_SCHEMA

DAY1 = datetime(2026, 12, 1, 9, tzinfo=UTC)
DAY2 = datetime(2026, 12, 2, 9, tzinfo=UTC)


def _rows(reasons: list[str], tag: str) -> pa.Table:
    n = len(reasons)
    columns = {name: pa.array([f"{tag}{i}" if name == "match_id" else "x"
                               for i in range(n)], pa.string()) for name in INPUT_FIELDS}
    return pa.table({**columns, "reason": reasons, "detail": ["why"] * n,
                     "source": ["test"] * n},
                    schema=QUARANTINE_SCHEMA.remove(QUARANTINE_SCHEMA.get_field_index(
                        "ingested_at")))


def test_ids_filters_and_pages(lake):
    with LandingWriter(lake, "b") as b, LandingWriter(lake, "a") as a:
        b.quarantine(_rows(["too_late", "implausible_rate"], "b"), DAY1)
        a.quarantine(_rows(["implausible_rate"] * 3, "a"), DAY1 + timedelta(hours=1))
        a.quarantine(_rows(["unknown_region"], "c"), DAY2)
    every, cursor = list_quarantine(lake)
    assert cursor is None
    # By (ingest_date, writer, seq, row): ids name the file, the row and a digest of it.
    assert all(re.fullmatch(QUARANTINE_ID_PATTERN, r.id) for r in every)
    assert [_place(r.id) for r in every] == ["2026-12-01.a.0.0", "2026-12-01.a.0.1",
                                     "2026-12-01.a.0.2", "2026-12-01.b.0.0",
                                     "2026-12-01.b.0.1", "2026-12-02.a.1.0"]
    assert [r.values["match_id"] for r in every] == ["a0", "a1", "a2", "b0", "b1", "c0"]
    assert every[0].as_dict()["ingested_at"] == "2026-12-01T10:00:00Z"
    # Pages of two, by reason, resume after the cursor and end with None.
    pages, after = [], None
    while True:
        page, after = list_quarantine(lake, reason="implausible_rate", limit=2, after=after)
        pages.append([_place(r.id) for r in page])
        if after is None:
            break
    assert pages == [["2026-12-01.a.0.0", "2026-12-01.a.0.1"],
                     ["2026-12-01.a.0.2", "2026-12-01.b.0.1"]]
    since, _ = list_quarantine(lake, since=DAY1 + timedelta(minutes=30))
    assert [_place(r.id) for r in since] == ["2026-12-01.a.0.0", "2026-12-01.a.0.1",
                                     "2026-12-01.a.0.2", "2026-12-02.a.1.0"]
    # A cursor is a position: one the API did not hand out still resumes after it.
    tail, _ = list_quarantine(lake, after="2026-12-01.zz.0.0.00000000")
    assert [_place(r.id) for r in tail] == ["2026-12-02.a.1.0"]
    b1 = every[4].id
    found = find_rows(lake, [b1, "2026-12-01.b.0.9.00000000", "2026-12-01.b.0.0.00000000",
                             "nonsense"])
    assert list(found) == [b1]
    assert found[b1].reason == "implausible_rate"
    assert parse_quarantine_id(b1) == ("2026-12-01", "b", 0, 1, b1[-8:])
    assert parse_quarantine_id("2026-12-01.b.0.1") is None


def test_a_row_is_found_after_rows_before_it_are_removed(lake):
    """An erasure rewrites a quarantine file without a player's rows: a row listed before
    is still found by its id (at its new place), and nothing else is taken for it."""
    with LandingWriter(lake, "a") as a:
        [written] = a.quarantine(_rows(["too_late"] * 3, "r"), DAY1)
    listed, _ = list_quarantine(lake)
    table = pq.read_table(written.path)
    pq.write_table(table.slice(1), written.path)  # r0 erased
    found = find_rows(lake, [listed[0].id, listed[2].id])
    assert list(found) == [listed[2].id]
    assert found[listed[2].id].values["match_id"] == "r2"
    assert found[listed[2].id].key == listed[2].key


def _place(row_id: str) -> str:
    return row_id.rsplit(".", 1)[0]


def test_a_page_resumes_after_its_cursor_row_wherever_an_erasure_moved_it(lake):
    """Regression: the cursor resumed after the row number it was listed at, so an erasure
    of rows before it between two pages moved the next rows up past it and they were never
    listed. Now the next page starts after the cursor's row where it lies now; a cursor
    whose own row was erased is refused (StaleCursor), never guessed."""
    with LandingWriter(lake, "a") as a:
        [written] = a.quarantine(_rows(["too_late"] * 5, "r"), DAY1)
    first, cursor = list_quarantine(lake, limit=2)
    assert [r.values["match_id"] for r in first] == ["r0", "r1"]
    table = pq.read_table(written.path)
    pq.write_table(table.slice(1), written.path)  # r0 erased: r1.. move up a row
    rest, end = list_quarantine(lake, limit=10, after=cursor)
    assert ([r.values["match_id"] for r in rest], end) == (["r2", "r3", "r4"], None)
    second, cursor = list_quarantine(lake, limit=2, after=cursor)
    assert [r.values["match_id"] for r in second] == ["r2", "r3"]
    table = pq.read_table(written.path)
    pq.write_table(table.filter(pa.array([m != "r3" for m in
                                          table.column("match_id").to_pylist()])),
                   written.path)  # r3, the cursor's row, erased
    with pytest.raises(StaleCursor, match="list again without a cursor"):
        list_quarantine(lake, after=cursor)
