"""Batch validation of match events: accepted rows, and rejected rows each with a reason.

Vectorised over Arrow columns; only the rejected rows are touched one by one (to write their
reason). Bad input never raises here: a missing column rejects its rows, it does not crash.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from leaderboard.calendar import WindowError
from leaderboard.registry import Registry
from leaderboard.schema import EVENT_SCHEMA, INPUT_FIELDS, QUARANTINE_SCHEMA, TIMESTAMP
from leaderboard.sortkey import max_abs_score
from leaderboard.timeutil import to_utc

__all__ = ["ID_PATTERN", "REASONS", "Validated", "validate_events"]

#: player_id and server_id: 1-64 chars of [A-Za-z0-9_.:-].
ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,64}$"
_MATCH_ID_MAX = 128

#: Every reason code a rejected row can carry, in the order the checks run.
REASONS: dict[str, str] = {
    "unparseable": "a line or record of the input file could not be parsed",
    "missing_field": "a required field is absent or null",
    "bad_type": "a field has a value of the wrong type or out of range",
    "bad_match_id": "match_id is empty, too long or has control characters",
    "bad_player_id": "player_id is not 1-64 chars of [A-Za-z0-9_.:-]",
    "bad_server_id": "server_id is not 1-64 chars of [A-Za-z0-9_.:-]",
    "unknown_region": "region is not in the registry",
    "unknown_mode": "mode is not in the registry",
    "before_calendar_start": "event_time is before the calendar's all_time_start",
    "event_time_in_future": "event_time is ahead of the landing clock by more than future_skew",
    "points_out_of_bounds": "points outside a board's plausibility bounds",
    "sort_key_overflow": "points too large for an exact `earliest` sort key",
    "no_window": "event_time falls in no window of any board it belongs to",
    "too_late": "ingested after end + grace of every window the event falls in",
}

_EPOCH = date(1970, 1, 1)
_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=UTC)
_US_PER_DAY = 86_400_000_000


@dataclass(frozen=True)
class Validated:
    """The outcome of validating one batch."""

    accepted: pa.Table  # EVENT_SCHEMA, in input order, in-batch retries removed
    rejected: pa.Table  # QUARANTINE_SCHEMA without ingested_at
    duplicates: int  # rows dropped as retries of an earlier row in the same batch

    def reason_counts(self) -> Counter[str]:
        return Counter(self.rejected.column("reason").to_pylist())


class _Checks:
    """Collects the first failing reason of each row."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.failed = np.zeros(n, dtype=bool)
        self.reason: list[str | None] = [None] * n
        self.detail: list[str | None] = [None] * n

    def fail(self, mask: npt.NDArray[np.bool_], code: str, detail: Any) -> None:
        """Mark rows in `mask` that have not failed yet; detail(i) or a fixed string."""
        fresh = np.flatnonzero(mask & ~self.failed)
        if fresh.size == 0:
            return
        self.failed[fresh] = True
        for i in fresh.tolist():
            self.reason[i] = code
            self.detail[i] = detail(i) if callable(detail) else detail


def _mask(array: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.bool_]:
    """Boolean Arrow array (nulls as False) to numpy."""
    filled = pc.fill_null(array, False)
    if isinstance(filled, pa.ChunkedArray):
        filled = filled.combine_chunks()
    return np.asarray(filled.to_numpy(zero_copy_only=False), dtype=bool)


def _is_text(type_: pa.DataType) -> bool:
    if pa.types.is_dictionary(type_):
        return _is_text(type_.value_type)
    return bool(pa.types.is_string(type_) or pa.types.is_large_string(type_))


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _as_text(column: pa.ChunkedArray, name: str, checks: _Checks) -> pa.ChunkedArray:
    """A string column; integers are accepted as ids, other types are bad_type."""
    type_ = column.type
    if _is_text(type_) or pa.types.is_integer(type_):
        return pc.cast(column, pa.string())
    if pa.types.is_null(type_):
        return pa.chunked_array([pa.nulls(len(column), pa.string())])
    present = ~_mask(pc.is_null(column))
    checks.fail(present, "bad_type", lambda i: f"{name} must be text, got {type_}")
    return pa.chunked_array([pa.nulls(len(column), pa.string())])


def _as_points(column: pa.ChunkedArray, checks: _Checks) -> npt.NDArray[np.int64]:
    n = len(column)
    type_ = column.type
    if pa.types.is_integer(type_):
        if pa.types.is_uint64(type_):
            too_big = _mask(pc.greater(column, pa.scalar(2**63 - 1, type_)))
            checks.fail(too_big, "bad_type", lambda i: f"points {column[i].as_py()} overflows int64")
            column = pc.if_else(pa.array(too_big), pa.scalar(0, type_), column)
        return np.asarray(pc.fill_null(pc.cast(column, pa.int64()), 0).to_numpy(), dtype=np.int64)
    if pa.types.is_floating(type_):
        values = np.asarray(pc.fill_null(pc.cast(column, pa.float64()), 0.0).to_numpy())
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(values) | (np.floor(values) != values) | (np.abs(values) >= 2**62)
        bad &= ~_mask(pc.is_null(column))
        checks.fail(bad, "bad_type",
                    lambda i: f"points {_shown(float(values[i]))} is not an integer")
        return np.where(bad, 0, values).astype(np.int64)
    if _is_text(type_):
        text = pc.cast(column, pa.string())
        ok = _mask(pc.match_substring_regex(text, r"^\s*[+-]?\d{1,18}\s*$"))
        bad = ~ok & ~_mask(pc.is_null(text))
        checks.fail(bad, "bad_type", lambda i: f"points {_shown(text[i].as_py())} is not an integer")
        # Arrow's string->int64 cast refuses a leading '+', which the pattern allows.
        unsigned = pc.utf8_ltrim(pc.utf8_trim_whitespace(text), characters="+")
        cleaned = pc.if_else(pa.array(ok), unsigned, pa.scalar("0"))
        return np.asarray(pc.cast(cleaned, pa.int64()).to_numpy(), dtype=np.int64)
    present = ~_mask(pc.is_null(column))
    checks.fail(present, "bad_type", f"points must be an integer, got {type_}")
    return np.zeros(n, dtype=np.int64)


def _parse_instant_text(value: str) -> datetime | None:
    try:
        return to_utc(datetime.fromisoformat(value.strip()))
    except (ValueError, OverflowError):  # OverflowError: an offset past year 1 or 9999
        return None


def _to_timestamp(column: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """Cast to TIMESTAMP; nanoseconds are truncated to microseconds, not refused."""
    type_ = column.type
    truncate = pa.types.is_timestamp(type_) and type_.unit == "ns"
    return pc.cast(column, TIMESTAMP, safe=not truncate)


def _as_event_time(column: pa.ChunkedArray, checks: _Checks) -> pa.ChunkedArray:
    type_ = column.type
    if pa.types.is_timestamp(type_):
        if type_.tz is None:
            column = pc.assume_timezone(column, "UTC")
        return _to_timestamp(column)
    if pa.types.is_date(type_):
        return pc.cast(pc.cast(column, pa.timestamp("us")), TIMESTAMP)
    if _is_text(type_):
        text = pc.cast(column, pa.string())
        try:
            return pc.cast(text, TIMESTAMP)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        values: list[datetime | None] = []
        bad_rows = np.zeros(len(text), dtype=bool)
        for i, raw in enumerate(text.to_pylist()):
            parsed = None if raw is None else _parse_instant_text(raw)
            if raw is not None and parsed is None:
                bad_rows[i] = True
            values.append(parsed)
        checks.fail(bad_rows, "bad_type",
                    lambda i: f"event_time {_shown(text[i].as_py())} is not an ISO 8601 instant")
        return pa.chunked_array([pa.array(values, type=TIMESTAMP)])
    present = ~_mask(pc.is_null(column))
    checks.fail(present, "bad_type", f"event_time must be an ISO 8601 instant, got {type_}")
    return pa.chunked_array([pa.nulls(len(column), TIMESTAMP)])


def _micros(value: datetime) -> int:
    value = to_utc(value)
    return int((value - _EPOCH_UTC) // timedelta(microseconds=1))


def _iso(micros: int) -> str:
    """An instant (us since the epoch) in ISO 8601, even one outside datetime's range."""
    try:
        return (_EPOCH_UTC + timedelta(microseconds=micros)).isoformat()
    except OverflowError:
        return f"{micros} us from 1970-01-01 (outside years 1-9999)"


def _to_micros(column: pa.ChunkedArray | pa.Array) -> npt.NDArray[np.int64]:
    filled = pc.fill_null(pc.cast(column, pa.int64()), 0)
    if isinstance(filled, pa.ChunkedArray):
        filled = filled.combine_chunks()
    return np.asarray(filled.to_numpy(), dtype=np.int64)


@dataclass(frozen=True)
class _Deadlines:
    """One board, per unique event day: the latest ingested_at (us) any window still counts
    (-inf: the day is in no window of the board), and days with a window past year 9999."""

    latest: npt.NDArray[np.float64]
    out_of_range: npt.NDArray[np.bool_]


def _deadlines(registry: Registry, days: npt.NDArray[np.int64]) -> dict[str, _Deadlines]:
    """Per board, per unique event day: see _Deadlines."""
    calendar = registry.calendar
    result: dict[str, _Deadlines] = {}
    dates: list[date | None] = []
    for d in days:
        try:
            dates.append(_EPOCH + timedelta(days=int(d)))
        except OverflowError:
            dates.append(None)
    for board in registry.boards:
        grace = board.grace // timedelta(microseconds=1)
        out = np.full(len(days), -np.inf)
        out_of_range = np.zeros(len(days), dtype=bool)
        for j, day in enumerate(dates):
            if day is None:
                out_of_range[j] = True
                continue
            for kind in board.windows:
                try:
                    window = calendar.window_on(kind, day)
                except WindowError:
                    out_of_range[j] = True
                    break
                if window is None:
                    continue
                if window.end is None:
                    out[j] = np.inf
                    continue
                out[j] = max(out[j], float(_micros(window.end) + grace))
        result[board.name] = _Deadlines(out, out_of_range)
    return result


def validate_events(
    table: pa.Table,
    registry: Registry,
    *,
    now: datetime,
    ingested_at: datetime | pa.Array | pa.ChunkedArray | str | None = None,
    default_server_id: str | None = None,
    source: str = "",
) -> Validated:
    """Validate a batch of raw events against the registry.

    `now` is the landing clock (for the future check); `ingested_at` is when the rows land
    (a scalar, one value per row, or "event_time" for backfills, where each row is stamped
    with its own event_time; defaults to `now`) for the lateness rule.
    Columns may be typed or text (CSV/JSON); unknown columns are ignored.
    """
    n = table.num_rows
    checks = _Checks(n)
    columns: dict[str, pa.ChunkedArray] = {}
    for name in INPUT_FIELDS:
        if name in table.column_names:
            columns[name] = table.column(name)
            if (name == "server_id" and default_server_id is not None
                    and (_is_text(columns[name].type) or pa.types.is_null(columns[name].type))):
                # server_id is optional in files: rows without one get the default.
                columns[name] = pc.fill_null(pc.cast(columns[name], pa.string()),
                                             default_server_id)
        elif name == "server_id" and default_server_id is not None:
            columns[name] = pa.chunked_array([pa.array([default_server_id] * n, pa.string())])
        else:
            columns[name] = pa.chunked_array([pa.nulls(n, pa.string())])

    # Types first, then presence: a wrong type is reported as such, not as missing.
    text = {name: _as_text(columns[name], name, checks)
            for name in ("match_id", "player_id", "region", "mode", "server_id")}
    points = _as_points(columns["points"], checks)
    event_time = _as_event_time(columns["event_time"], checks)
    typed = {**text, "points": columns["points"], "event_time": event_time}
    for name in INPUT_FIELDS:
        missing = _mask(pc.is_null(typed[name]))
        checks.fail(missing, "missing_field", f"{name} is missing")

    match_id = text["match_id"]
    match_len = pc.fill_null(pc.utf8_length(match_id), 0)
    bad_match = (_mask(pc.greater(match_len, _MATCH_ID_MAX))
                 | _mask(pc.equal(pc.fill_null(pc.utf8_length(pc.utf8_trim_whitespace(match_id)),
                                               1), 0))
                 | _mask(pc.match_substring_regex(match_id, r"[\x00-\x1f\x7f]")))
    checks.fail(bad_match, "bad_match_id",
                lambda i: f"match_id {_shown(match_id[i].as_py())} must be 1-{_MATCH_ID_MAX} "
                          "printable characters")
    for name, code in (("player_id", "bad_player_id"), ("server_id", "bad_server_id")):
        values = text[name]
        bad = ~_mask(pc.match_substring_regex(values, ID_PATTERN)) & ~_mask(pc.is_null(values))
        checks.fail(bad, code, lambda i, v=values, f=name: (
            f"{f} {_shown(v[i].as_py())} must be 1-64 chars of [A-Za-z0-9_.:-]"))
    for name, code, known in (("region", "unknown_region", registry.regions),
                              ("mode", "unknown_mode", registry.modes)):
        values = text[name]
        bad = ~_mask(pc.is_in(values, value_set=pa.array(known, pa.string())))
        bad &= ~_mask(pc.is_null(values))
        checks.fail(bad, code, lambda i, v=values, f=name, k=known: (
            f"{f} {_shown(v[i].as_py())} is not one of {', '.join(k)}"))

    micros = _to_micros(event_time)
    origin = _micros(datetime.combine(registry.calendar.all_time_start, datetime.min.time(), UTC))
    checks.fail(micros < origin, "before_calendar_start",
                lambda i: f"event_time {_iso(int(micros[i]))} is before the calendar "
                          f"start {registry.calendar.all_time_start}")
    limit = _micros(now) + int(registry.future_skew / timedelta(microseconds=1))
    checks.fail(micros > limit, "event_time_in_future",
                lambda i: f"event_time {_iso(int(micros[i]))} is more than "
                          f"{registry.future_skew} ahead of the landing clock {now.isoformat()}")

    if ingested_at is None:
        ingested_at = now
    if isinstance(ingested_at, str):
        if ingested_at != "event_time":
            raise ValueError(f"ingested_at={ingested_at!r}: only 'event_time' is a valid name")
        landed = micros
    elif isinstance(ingested_at, datetime):
        landed = np.full(n, _micros(ingested_at), dtype=np.int64)
    else:
        landed = _to_micros(_to_timestamp(ingested_at))

    region_values = np.asarray(pc.fill_null(text["region"], "").to_numpy(zero_copy_only=False))
    mode_values = np.asarray(pc.fill_null(text["mode"], "").to_numpy(zero_copy_only=False))
    # Windows only for rows still ok: a rejected event_time may be anywhere in years 1-9999.
    pending = ~checks.failed
    unique_days, pending_index = np.unique(np.floor_divide(micros[pending], _US_PER_DAY),
                                           return_inverse=True)
    day_index = np.zeros(n, dtype=np.intp)
    day_index[pending] = pending_index.reshape(-1)
    deadlines = _deadlines(registry, unique_days) if unique_days.size else {}
    best_deadline = np.full(n, -np.inf)
    out_of_range = np.zeros(n, dtype=bool)
    for board in registry.boards:
        if board.scope == "global":
            applies = np.ones(n, dtype=bool)
        elif board.scope == "region":
            applies = region_values == board.scope_value
        else:
            applies = mode_values == board.scope_value
        out = applies & ((points < board.min_points) | (points > board.max_points))
        checks.fail(out, "points_out_of_bounds", lambda i, b=board: (
            f"points {points[i]} outside [{b.min_points}, {b.max_points}] of board {b.name}"))
        if board.ties == "earliest":
            fit = min(max_abs_score("earliest", registry.calendar.time_bits(k))
                      for k in board.windows)
            checks.fail(applies & (np.abs(points) > fit), "sort_key_overflow", lambda i, b=board, f=fit: (
                f"points {points[i]} exceed |{f}|, the exact sort-key range of board {b.name}"))
        if deadlines:
            counted = applies & pending
            board_days = deadlines[board.name]
            best_deadline = np.where(counted, np.maximum(best_deadline,
                                                         board_days.latest[day_index]),
                                     best_deadline)
            out_of_range |= counted & board_days.out_of_range[day_index]
    checks.fail(out_of_range, "bad_type",
                lambda i: f"event_time {_iso(int(micros[i]))} is out of range: a window it "
                          f"falls in ends after {date.max.isoformat()}")
    checks.fail(best_deadline == -np.inf, "no_window",
                lambda i: f"event_time {_iso(int(micros[i]))} falls in no window of any board "
                          "it belongs to")
    late = landed.astype(np.float64) > best_deadline
    checks.fail(late, "too_late",
                lambda i: f"event_time {_iso(int(micros[i]))} ingested at "
                          f"{_iso(int(landed[i]))}: past end + grace of every window it falls in")

    ok = ~checks.failed
    accepted = pa.table({
        "match_id": text["match_id"], "player_id": text["player_id"],
        "points": pa.array(points, pa.int64()), "event_time": event_time,
        "region": text["region"], "mode": text["mode"], "server_id": text["server_id"],
    }).filter(pa.array(ok))
    accepted = accepted.cast(EVENT_SCHEMA)
    duplicates = 0
    if accepted.num_rows:
        keyed = accepted.append_column("_row", pa.array(np.arange(accepted.num_rows)))
        first = keyed.group_by(["match_id", "player_id"], use_threads=False).aggregate(
            [("_row", "min")])
        if first.num_rows != accepted.num_rows:
            duplicates = accepted.num_rows - first.num_rows
            keep = np.sort(first.column("_row_min").to_numpy())
            accepted = accepted.take(pa.array(keep))

    bad_rows = np.flatnonzero(checks.failed)
    rejected_columns: dict[str, pa.Array] = {}
    for name in INPUT_FIELDS:
        raw = columns[name].take(pa.array(bad_rows, pa.int64())) if bad_rows.size else None
        rejected_columns[name] = _raw_text(raw, len(bad_rows))
    rejected_columns["reason"] = pa.array([checks.reason[i] for i in bad_rows], pa.string())
    rejected_columns["detail"] = pa.array([checks.detail[i] for i in bad_rows], pa.string())
    rejected_columns["source"] = pa.array([source] * len(bad_rows), pa.string())
    rejected = pa.table(rejected_columns, schema=QUARANTINE_SCHEMA.remove(
        QUARANTINE_SCHEMA.get_field_index("ingested_at")))
    return Validated(accepted=accepted, rejected=rejected, duplicates=duplicates)


def _raw_text(raw: pa.ChunkedArray | None, n: int) -> pa.Array:
    """The original values as text, whatever their type, for the quarantine."""
    if raw is None:
        return pa.nulls(n, pa.string())
    try:
        cast = pc.cast(raw, pa.string())
        return cast.combine_chunks() if isinstance(cast, pa.ChunkedArray) else cast
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return pa.array([None if v is None else str(v) for v in raw.to_pylist()], pa.string())
