"""Engine-neutral inputs of a batch run: the calendar table, the board-window spec, the
lateness bits, and the output schemas both engines must produce row for row.

Window ids, starts and ends come from the core calendar (one table row per date and kind),
so the engines never re-implement calendar arithmetic and cannot disagree with the speed layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import date

import numpy as np
import pyarrow as pa

from leaderboard.calendar import ALL_TIME, WINDOW_KINDS
from leaderboard.lateness import LatenessBit, lateness_bits
from leaderboard.registry import Registry
from leaderboard.schema import TIMESTAMP
from leaderboard.timeutil import duration_us

__all__ = [
    "CARRY_KINDS",
    "CARRY_SCHEMA",
    "DEPTH_BUCKETS",
    "HISTOGRAM_SCHEMA",
    "ROLLUP_CAP",
    "ROLLUP_SCHEMA",
    "STANDINGS_SCHEMA",
    "WIDTH_BUCKETS",
    "LatenessBit",
    "StandingsResult",
    "board_window_spec",
    "calendar_table",
    "lateness_bits",
]

WIDTH_BUCKETS = 20
#: A rollup row's points_sum saturates at +-2^62, so it stays an int64 whatever it sums. That
#: changes no score: a board's sum saturates at its own limit (<= 2^53 - 1, see
#: leaderboard.sortkey), and saturating first at a larger cap gives the same result for
#: points of one sign -- a board with points of both signs has bounds so small that 2^62 is
#: out of reach of any real day (registry load checks SUM_HEADROOM).
ROLLUP_CAP = 2**62
DEPTH_BUCKETS = 100

#: One row per (player, event_date, region, mode, lateness mask): mergeable aggregates. A
#: direct board's scores roll up with region "" (no match event has it) and the board's name
#: in `mode`, so the explode step maps them to scope key `board:<name>` only, and the rollup
#: files keep their columns (both engines map `board` to `mode` when rolling up).
ROLLUP_SCHEMA = pa.schema([
    ("player_id", pa.string()), ("event_date", pa.date32()), ("region", pa.string()),
    ("mode", pa.string()), ("mask", pa.int64()), ("matches", pa.int64()),
    ("points_sum", pa.int64()), ("max_points", pa.int64()), ("max_at", TIMESTAMP),
    ("min_points", pa.int64()), ("min_at", TIMESTAMP), ("last_points", pa.int64()),
    ("last_match", pa.string()), ("first_event_at", TIMESTAMP), ("last_event_at", TIMESTAMP),
])

#: A standings row (docs/design.md section 3), with its board-window while in flight.
#: `last_match_id`: the match of the player's latest counted event in the board-window (ties
#: on event_time by the larger match_id, as the rollups' `last_match`), on every board. With
#: last_event_at it is the mark of a `last` board's score, which the speed layer compares an
#: event at the very same time against. Files published before it lack the column; readers
#: treat it as absent (null).
STANDINGS_SCHEMA = pa.schema([
    ("player_id", pa.string()), ("score", pa.int64()), ("sort_key", pa.int64()),
    ("rank", pa.int64()), ("percentile", pa.float64()), ("matches", pa.int64()),
    ("reached_at", TIMESTAMP), ("first_event_at", TIMESTAMP), ("last_event_at", TIMESTAMP),
    ("last_match_id", pa.string()),
])

#: The window kinds a night carries forward instead of re-reading their rollups: a window of
#: these kinds is built from the previous version's standings rows of that window (each row
#: is the player's whole aggregate state: see CARRY_SCHEMA) plus the night's new rollup rows.
#: Daily windows are rebuilt from their one date's rollups (as cheap as their standings).
CARRY_KINDS = ("weekly", "monthly", "season", ALL_TIME)

#: What the batch hands an engine per carried board-window: the previous version's standings
#: file holding it (absolute; null: the window had no rows yet). A standings row is the
#: exact state of every aggregation: a sum's total (carried only while no player's total sits
#: at the board's saturation limit, where the true total is lost), a max's or min's best score
#: with the earliest time it was reached, a last's points with its time and match; matches,
#: first and last event and last match for all. Merging it with the new rollup rows is the
#: same commutative merge the rollups use, so the result is what a recompute gives.
CARRY_SCHEMA = pa.schema([
    ("board", pa.string()), ("window_id", pa.string()), ("path", pa.string()),
])

#: Histogram rows: kind `width` (equal-width score buckets, for charts) or `depth` (equal
#: player counts by rank, for percentile lookups); lower/upper are scores.
HISTOGRAM_SCHEMA = pa.schema([
    ("kind", pa.string()), ("bucket", pa.int64()), ("lower", pa.float64()),
    ("upper", pa.float64()), ("players", pa.int64()), ("rank_from", pa.int64()),
    ("rank_to", pa.int64()),
])


def _day_ids(prefix: str, days: np.ndarray) -> np.ndarray:
    return np.char.add(prefix, np.datetime_as_string(days, unit="D"))


def calendar_table(registry: Registry, first: date, last: date) -> pa.Table:
    """(event_date, kind, window_id, window_start_us, window_end_us) per date in [first, last].

    Vectorised over dates (a century is 36,500 of them); instants are microseconds since
    the epoch, so both engines compare plain integers. tests/jobs check it against the core
    calendar date by date.
    """
    calendar = registry.calendar
    kinds = sorted({k for b in registry.boards for k in b.windows}, key=WINDOW_KINDS.index)
    days = np.arange(np.datetime64(first, "D"), np.datetime64(last, "D") + 1)
    day_us = 86_400_000_000
    number = days.astype(np.int64)
    parts = []
    for kind in kinds:
        valid = np.ones(len(days), dtype=bool)
        if kind == "daily":
            start, end = number, number + 1
            ids = _day_ids("daily:", days)
        elif kind == "weekly":
            start = number - (number + 3) % 7  # 1970-01-01 was a Thursday
            end = start + 7
            thursday = (start + 3).astype("datetime64[D]")
            year = thursday.astype("datetime64[Y]")
            week = (thursday - year.astype("datetime64[D]")).astype(np.int64) // 7 + 1
            ids = np.char.add(np.char.add(np.char.add("weekly:", np.datetime_as_string(year)),
                                          "-W"), np.char.zfill(week.astype(str), 2))
        elif kind == "monthly":
            month = days.astype("datetime64[M]")
            start = month.astype("datetime64[D]").astype(np.int64)
            end = (month + 1).astype("datetime64[D]").astype(np.int64)
            ids = np.char.add("monthly:", np.datetime_as_string(month))
        elif kind == "season" and calendar.seasons is None:
            month = days.astype("datetime64[M]")
            quarter_start = month - month.astype(np.int64) % 3
            start = quarter_start.astype("datetime64[D]").astype(np.int64)
            end = (quarter_start + 3).astype("datetime64[D]").astype(np.int64)
            quarter = (quarter_start.astype(np.int64) % 12) // 3 + 1
            ids = np.char.add(np.char.add(np.char.add(
                "season:", np.datetime_as_string(month.astype("datetime64[Y]"))), "-S"),
                quarter.astype(str))
        elif kind == "season":
            seasons = calendar.seasons or ()
            starts = np.array([np.datetime64(x.start, "D") for x in seasons]).astype(np.int64)
            ends = np.array([np.datetime64(x.end, "D") for x in seasons]).astype(np.int64)
            which = np.searchsorted(starts, number, side="right") - 1
            valid = (which >= 0) & (number < ends[np.clip(which, 0, None)])
            which = np.clip(which, 0, None)
            start, end = starts[which], ends[which]
            ids = np.array([f"season:{x.id}" for x in seasons])[which]
        else:  # all-time: from all_time_start, up to (not including) all_time_end
            valid = number < np.datetime64(calendar.all_time_end, "D").astype(np.int64)
            start = np.full(len(days), np.datetime64(calendar.all_time_start, "D")
                            .astype(np.int64))
            end = None
            ids = np.full(len(days), ALL_TIME)
        parts.append(pa.table({
            "event_date": pa.array(days[valid], pa.date32()),
            "kind": pa.array(np.full(int(valid.sum()), kind), pa.string()),
            "window_id": pa.array(ids[valid].astype(object), pa.string()),
            "window_start_us": pa.array(start[valid] * day_us, pa.int64()),
            "window_end_us": pa.array(None if end is None else end[valid] * day_us,
                                      pa.int64()) if end is not None else
            pa.nulls(int(valid.sum()), pa.int64()),
        }))
    return pa.concat_tables(parts)


def board_window_spec(registry: Registry) -> pa.Table:
    """One row per (board, window kind): how rows are matched, merged and keyed
    (`score_limit`: a `sum` total saturates there; see leaderboard.sortkey)."""
    bits = {(b.kind, b.grace_us): b.bit for b in lateness_bits(registry)}
    rows: dict[str, list[object]] = {k: [] for k in (
        "board", "scope_key", "kind", "bit", "aggregation", "sign", "earliest", "time_bits",
        "time_unit_us", "score_limit")}
    for board in registry.boards:
        scope_key = board.scope_key
        grace_us = duration_us(board.grace)
        for kind in board.windows:
            rows["board"].append(board.name)
            rows["scope_key"].append(scope_key)
            rows["kind"].append(kind)
            rows["bit"].append(-1 if kind == ALL_TIME else bits[(kind, grace_us)])
            rows["aggregation"].append(board.aggregation)
            rows["sign"].append(1 if board.order == "desc" else -1)
            rows["earliest"].append(board.ties == "earliest")
            layout = registry.layout(board, kind)
            rows["time_bits"].append(layout.time_bits)
            rows["time_unit_us"].append(layout.unit_us or 1)
            rows["score_limit"].append(layout.limit)
    return pa.table({
        "board": pa.array(rows["board"], pa.string()),
        "scope_key": pa.array(rows["scope_key"], pa.string()),
        "kind": pa.array(rows["kind"], pa.string()),
        "bit": pa.array(rows["bit"], pa.int64()),
        "aggregation": pa.array(rows["aggregation"], pa.string()),
        "sign": pa.array(rows["sign"], pa.int64()),
        "earliest": pa.array(rows["earliest"], pa.bool_()),
        "time_bits": pa.array(rows["time_bits"], pa.int64()),
        "time_unit_us": pa.array(rows["time_unit_us"], pa.int64()),
        "score_limit": pa.array(rows["score_limit"], pa.int64()),
    })


@dataclass(frozen=True)
class StandingsResult:
    """What an engine's standings pass gives the batch.

    `rows`: the ranked standings, ordered by (board, window_id, rank, player_id), to stream
    into the writer; `histograms`: both kinds for every board-window built; `windows`: the
    (board, window_id) among those needed that received counted events (banned players
    included: such a window exists, empty). `overflow`: when some score cannot be encoded as
    an exact sort key, up to 10 such rows (board, window_id, player_id, score, time_bits)
    and nothing else (the batch refuses the version); None when every score fits. `stop`:
    ends whatever still produces `rows` (a read-ahead thread); the batch calls it once the
    writer is done with them, failed or not.
    """

    rows: pa.RecordBatchReader
    histograms: pa.Table
    windows: pa.Table
    overflow: pa.Table | None = None
    stop: Callable[[], None] = lambda: None

    @classmethod
    def overflowed(cls, overflow: pa.Table, windows: pa.Table) -> StandingsResult:
        """The answer when scores do not fit: no rows, the offending ones in `overflow`."""
        return cls(pa.RecordBatchReader.from_batches(pa.schema([]), []), pa.table({}), windows,
                   overflow)
