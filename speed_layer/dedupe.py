"""Each event identity counted once when speed state is recomputed from the lake.

The batch counts an identity (match_id, player_id; a direct score's board too) once over the
whole history still in the lake, the first ingested copy winning. The live fold relies on
the door, which drops a copy only within its horizon, so a re-delivery landed later counts
twice live until something recomputes it (the lambda trade, docs/design.md section 5).
Every path that recomputes speed state from the lake (a rebase, also the erasure's, a
rebuild, an unban, a void's recompute) counts as the batch does, through `Counted`: the
identities the base absorbed (its raw rows still in the lake, ingested before its
watermark) are counted already, and the speed part's files are visited first ingested
first, so a later copy of an identity counted once is dropped.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from leaderboard.lake import LandedFile, landed_files, read_listed, stamp_range
from leaderboard.schema import TIMESTAMP, identity_match_ids

__all__ = ["Counted", "absorbed_files", "identities", "identity_column", "ingest_order",
           "match_ids"]

#: What the base's identities are read from: a file landed before the `board` column reads
#: it as null (a match event).
_IDENTITY_SCHEMA = pa.schema([pa.field("match_id", pa.string()),
                              pa.field("player_id", pa.string()),
                              pa.field("ingested_at", TIMESTAMP),
                              pa.field("board", pa.string())])


def identity_column(table: pa.Table) -> pa.Array:
    """`match_id NUL player_id` per row (a direct score's match part names its board too,
    leaderboard.schema.identity_match_ids): an event's identity as one string."""
    joined = pc.binary_join_element_wise(identity_match_ids(table), table.column("player_id"),
                                         "\x00")
    return joined.combine_chunks() if isinstance(joined, pa.ChunkedArray) else joined


def identities(tables: Iterable[pa.Table]) -> set[str]:
    """Every identity (`match_id NUL player_id`) of the tables' rows."""
    found: set[str] = set()
    for table in tables:
        if table.num_rows:
            found.update(identity_column(table).to_pylist())
    return found


def match_ids(tables: Iterable[pa.Table]) -> pa.Array:
    """The distinct match ids of the tables' rows (what a copy of one of their identities
    shares with it, whatever its date)."""
    found: set[str] = set()
    for table in tables:
        if table.num_rows:
            found.update(pc.unique(table.column("match_id")).to_pylist())
    return pa.array(sorted(found), pa.string())


def ingest_order(files: Iterable[LandedFile]) -> list[LandedFile]:
    """Files first ingested first (by their earliest stamp), ties by (writer, seq) as files
    land and as the batch breaks them (by file name): the order in which the first copy of
    an identity is the one counted."""
    return sorted(files, key=lambda f: (stamp_range(f.path)[0], f.writer, f.seq))


def absorbed_files(lake: Path, watermark: datetime) -> list[LandedFile]:
    """The landed files that may hold rows a version with this watermark absorbed (ingested
    before it): every file lands in its landing day's partition, so none after the
    watermark's day (older backfill files sit in their earliest stamp's partition)."""
    return [f for f in landed_files(lake) if f.ingest_date <= watermark.date()]


class Counted:
    """The identities counted so far while speed state is recomputed from the lake: the
    base's (`of_base`), then those of the speed rows visited (`fresh`), first ingested
    first."""

    def __init__(self, seen: Iterable[str] = ()) -> None:
        self._seen = set(seen)

    def __len__(self) -> int:
        return len(self._seen)

    @classmethod
    def of_base(cls, lake: Path, watermark: datetime | None, matches: pa.Array, *,
                player: str | None = None) -> Counted:
        """The identities the base of a version with this watermark absorbed, among its raw
        rows still in the lake of these matches (of one player, when given): a copy landed
        since the watermark is a re-delivery the batch will not count. Identities whose raw
        rows retention deleted cannot be checked here, nor by the batch."""
        if watermark is None or len(matches) == 0:
            return cls()
        where = ((pc.field("ingested_at") < pa.scalar(watermark, TIMESTAMP))
                 & pc.field("match_id").isin(matches))
        if player is not None:
            where = where & (pc.field("player_id") == player)

        def read(files: list[LandedFile]) -> set[str]:
            if not files:
                return set()
            return identities([ds.dataset([str(f.path) for f in files], schema=_IDENTITY_SCHEMA,
                                          format="parquet").to_table(filter=where)])

        # The nightly compaction rewrites exactly these partitions while this reads them.
        return cls(read_listed(lambda: absorbed_files(lake, watermark), read))

    def fresh(self, table: pa.Table) -> pa.Table:
        """The rows of `table` whose identity is not counted yet (of two copies within it,
        the first), which are counted from now on."""
        if table.num_rows == 0:
            return table
        ids = identity_column(table).to_pylist()
        keep = np.ones(len(ids), dtype=bool)
        for row, identity in enumerate(ids):
            if identity in self._seen:
                keep[row] = False
            else:
                self._seen.add(identity)
        return table if keep.all() else table.filter(pa.array(keep))
