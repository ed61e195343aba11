"""A void night after retention: which event dates a batch recomputes from raw events.

Before retention deletes anything, a night whose voids changed recomputes in full. After
it, a full recompute would miss the deleted events, so the night stays incremental and
recomputes only the event dates the new voids touch (their voided rows were absorbed by
the base) from the raw events still in the lake, then ranks every board-window those dates
feed again (jobs.batch). That is exact for an event date only if every raw event of it is
still in the lake: the event dates after the safe line (`leaderboard.retained.kept_after`,
shared with the speed layer) are whole. A new void of an older result keeps the documented
limit (README, Voids): the base's rows stand, and the run says so (`beyond`, `unseen`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from leaderboard.lake import LandedFile
from leaderboard.manifest import Manifest
from leaderboard.registry import Registry
from leaderboard.retained import kept_after
from leaderboard.voids import Void, VoidIndex, read_voids

__all__ = ["Revoid", "plan_revoid"]


@dataclass(frozen=True)
class Revoid:
    """The event dates a void night recomputes, and the new voids' dates out of reach."""

    dates: list[date]  # recomputed from raw events (every raw event of them is kept)
    beyond: list[date]  # touched by a new void, but raw events of them may be gone
    old_voids: pa.Table  # (match_id, player_id): the voids the base had (before its watermark)
    #: new voids naming no raw row kept in the lake: their results, if the base absorbed
    #: any, are on dates whose raw events retention deleted (or their match never landed)
    unseen: list[Void] = field(default_factory=list)


def plan_revoid(lake: Path, registry: Registry, base: Manifest, files: list[LandedFile],
                watermark: datetime) -> Revoid:
    """The event dates of the rows the base absorbed that a void it had not seen (at or
    after its watermark, before this run's `watermark`) names: read from the absorbed raw
    files (match_id, player_id, event_time, ingested_at of the voided matches only); and
    the new voids that name no raw row of any kept file (`unseen`)."""
    everything = read_voids(lake, watermark)
    old = [v for v in everything if v.at < base.watermark_at]
    late = [v for v in everything if v.at >= base.watermark_at]
    new = VoidIndex.of(late)
    touched: set[date] = set()
    named: set[tuple[str, str]] = set()  # (match_id, player_id) of kept rows the voids name
    if new:
        matches = pa.array(sorted(new.by_match), pa.string())
        mark = pa.scalar(base.watermark_at, pa.timestamp("us", tz="UTC"))
        for landed in files:
            if not landed.path.exists():
                continue
            rows = pq.read_table(landed.path,
                                 columns=["match_id", "player_id", "event_time", "ingested_at"],
                                 filters=pc.field("match_id").isin(matches))
            if not rows.num_rows:
                continue
            named.update(zip(rows.column("match_id").to_pylist(),
                             rows.column("player_id").to_pylist(), strict=True))
            if landed.ingest_date > base.as_of_date:
                continue  # new events: the night rolls them up without the voided rows
            rows = rows.filter(pc.less(rows.column("ingested_at"),
                                       mark.cast(rows.schema.field("ingested_at").type)))
            rows = rows.filter(new.mask(rows))
            stamps = pc.cast(rows.column("event_time"), pa.timestamp("us", tz="UTC"))
            touched.update(pc.unique(pc.cast(stamps, pa.date32())).to_pylist())
    line = kept_after(lake, registry)
    return Revoid(dates=sorted(d for d in touched if line is None or d > line),
                  beyond=sorted(d for d in touched if line is not None and d <= line),
                  old_voids=_void_table(old),
                  unseen=[v for v in late if not any(
                      m == v.match_id and (v.player_id is None or p == v.player_id)
                      for m, p in named)])


def _void_table(voids: list[Void]) -> pa.Table:
    return pa.table({"match_id": pa.array([v.match_id for v in voids], pa.string()),
                     "player_id": pa.array([v.player_id for v in voids], pa.string())})
