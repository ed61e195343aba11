"""Batch validation of match events: accepted rows, and rejected rows each with a reason.

Vectorised over Arrow columns; only the rejected rows are touched one by one (to write their
reason). Bad input never raises here: a missing column rejects its rows, it does not crash.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from leaderboard.calendar import WindowError
from leaderboard.erasure import ERASED_PREFIX, ErasureLedger
from leaderboard.registry import Board, Registry
from leaderboard.schema import (
    EVENT_SCHEMA,
    INPUT_FIELDS,
    QUARANTINE_SCHEMA,
    TIMESTAMP,
    conform,
)
from leaderboard.timeutil import duration_us, epoch_us, from_epoch_us, to_utc

__all__ = ["ID_PATTERN", "ID_RULE", "MATCH_ID_PATTERN", "REASONS", "SUBMISSION_REASONS",
           "UNPRINTABLE_RANGES", "Validated", "id_problem", "validate_events", "validate_scores"]

#: player_id and server_id: 1-64 chars of [A-Za-z0-9_.:-], but not "." or "..", which no URL
#: can name (clients normalise them away as path segments). Written without lookahead so RE2
#: (Arrow), Python and ECMA (OpenAPI) read it alike.
ID_PATTERN = (r"^(?:[A-Za-z0-9_:-]|[A-Za-z0-9_.:-][A-Za-z0-9_:-]|[A-Za-z0-9_:-]\.|"
              r"[A-Za-z0-9_.:-]{3,64})$")
ID_RULE = "1-64 chars of [A-Za-z0-9_.:-], not . or .."
_ID = re.compile(ID_PATTERN)
_MATCH_ID_MAX = 128


#: Characters a match_id may not hold: controls (Cc, including C1 such as U+0085), format
#: characters (Cf: bidi overrides such as U+202E, zero-width ones) and the line and paragraph
#: separators (Zl, Zp), as code point ranges (Unicode 14; tests/leaderboard/test_validation.py
#: checks them against this Python's tables). One definition for RE2 (validation) and the
#: OpenAPI pattern (Python and ECMA regexes).
UNPRINTABLE_RANGES = (
    (0x00, 0x1F), (0x7F, 0x9F), (0xAD, 0xAD), (0x600, 0x605), (0x61C, 0x61C), (0x6DD, 0x6DD),
    (0x70F, 0x70F), (0x890, 0x891), (0x8E2, 0x8E2), (0x180E, 0x180E), (0x200B, 0x200F),
    (0x2028, 0x202E), (0x2060, 0x2064), (0x2066, 0x206F), (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB),
    (0x110BD, 0x110BD), (0x110CD, 0x110CD), (0x13430, 0x13438), (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A), (0xE0001, 0xE0001), (0xE0020, 0xE007F),
)


def _literal(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x20 or code == 0x7F else re.escape(chr(code))


_UNPRINTABLE = "".join(_literal(a) if a == b else f"{_literal(a)}-{_literal(b)}"
                       for a, b in UNPRINTABLE_RANGES)
#: match_id: 1-128 characters, not all whitespace, none of them unprintable (see above).
MATCH_ID_PATTERN = rf"^[^{_UNPRINTABLE}]*[^\s{_UNPRINTABLE}][^{_UNPRINTABLE}]*$"


def id_problem(value: str, what: str = "player id") -> str | None:
    """Why `value` is not a valid id (None: it is), in words a person can act on."""
    if _ID.match(value):
        return None
    return f"{what} {_shown(value)} must be {ID_RULE}"


#: Every reason code a quarantined row can carry (validation's in the order its checks run,
#: then those decided elsewhere): the one list the OpenAPI enum of `GET
#: /v1/admin/quarantine?reason=`, the CLI's `--reason` choices, the console's filter and the
#: README.s table come from (tests/app/test_review.py checks the README).
REASONS: dict[str, str] = {
    "unparseable": "a line or record of the input file could not be parsed",
    "missing_field": "a required field is absent or null",
    "bad_type": "a field has a value of the wrong type or out of range",
    "erased": "the player's data was erased; their id is refused (kept only as a hash)",
    "bad_match_id": "match_id is blank, too long or has control, format or separator characters",
    "bad_player_id": f"player_id is not {ID_RULE}",
    "bad_server_id": f"server_id is not {ID_RULE}",
    "unknown_region": "region is not in the registry",
    "unknown_mode": "mode is not in the registry",
    "before_calendar_start": "event_time is before the calendar's all_time_start",
    "event_time_in_future": "event_time is ahead of the landing clock by more than future_skew",
    "after_calendar_end": "event_time is on or after the calendar's all_time_end",
    "points_out_of_bounds": "points outside a board's plausibility bounds",
    "sort_key_overflow": "points too large for an exact `earliest` sort key",
    "no_window": "event_time falls in no window of any board it belongs to",
    "too_late": "ingested after end + grace of every window the event falls in",
    # Decided at landing, not by validate_events (speed_layer.rate): the row was valid.
    "implausible_rate": "the player sent more events in one landing minute than "
                        "limits.player_events_per_minute; held for review (release it with "
                        "`leaderboard quarantine release`)",
    # Decided by a score submission's route (app/http/routers/scores.py), before validation.
    "bad_score": "a score submission's body is not one JSON object",
    "score_and_delta": "a score submission carries both `score` and `delta`",
    "score_expected": "a `delta` sent to a max, min or last board (it takes `score`)",
    "delta_expected": "a `score` sent to a sum board (it takes `delta`)",
    # Decided by a release (speed_layer.review): the row's board left the registry.
    "unknown_board": "a direct score's board is no longer a direct board of the registry "
                     "(a released score whose board was removed or turned into a match-event "
                     "board; release it again once the board is back)",
}

#: The reasons a score submission's route decides from the body's shape (REASONS above): no
#: release can land such a row, whose fields do not say what was meant; it is sent again.
SUBMISSION_REASONS: tuple[str, ...] = ("bad_score", "score_and_delta", "score_expected",
                                       "delta_expected")

#: What validate_events returns as `rejected`: the quarantine before landing stamps it.
_REJECTED_SCHEMA = QUARANTINE_SCHEMA.remove(QUARANTINE_SCHEMA.get_field_index("ingested_at"))

_EPOCH = date(1970, 1, 1)
_US_PER_DAY = 86_400_000_000


@dataclass(frozen=True)
class Validated:
    """The outcome of validating one batch."""

    accepted: pa.Table  # EVENT_SCHEMA, in input order, in-batch retries removed
    rejected: pa.Table  # QUARANTINE_SCHEMA without ingested_at
    duplicates: int  # rows dropped as retries of an earlier row in the same batch
    #: Input row number of each rejected row (ascending), so callers can answer per row.
    rejected_rows: npt.NDArray[np.int64] = field(
        default_factory=lambda: np.zeros(0, dtype=np.int64))

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
        if not mask.any():
            return
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


def _has_nulls(column: pa.Array | pa.ChunkedArray) -> bool:
    return bool(column.null_count)


def _is_null(column: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.bool_]:
    """_mask(pc.is_null(column)), read straight from the validity bitmaps where there is one."""
    parts = []
    for chunk in column.chunks if isinstance(column, pa.ChunkedArray) else [column]:
        type_ = chunk.type
        if not chunk.null_count:
            parts.append(np.zeros(len(chunk), dtype=bool))
        elif pa.types.is_null(type_):
            parts.append(np.ones(len(chunk), dtype=bool))
        elif (pa.types.is_string(type_) or pa.types.is_large_string(type_)
              or pa.types.is_integer(type_) or pa.types.is_floating(type_)
              or pa.types.is_timestamp(type_) or pa.types.is_date(type_)):
            bits = np.unpackbits(np.frombuffer(chunk.buffers()[0], dtype=np.uint8),
                                 bitorder="little")
            parts.append(bits[chunk.offset:chunk.offset + len(chunk)] == 0)
        else:
            parts.append(_mask(pc.is_null(chunk)))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)


def _id_bytes(data: npt.NDArray[np.uint8]) -> npt.NDArray[np.bool_]:
    """Which bytes an id may hold: [A-Za-z0-9_.:-] (ID_PATTERN), by range tests."""
    ok = ((data | np.uint8(0x20)) - np.uint8(0x61)) < np.uint8(26)  # A-Z, a-z
    ok |= (data - np.uint8(0x2d)) < np.uint8(14)  # - . / 0-9 :
    ok &= data != np.uint8(0x2f)  # not /
    ok |= data == np.uint8(0x5f)  # _
    return ok


def _printable_bytes(data: npt.NDArray[np.uint8]) -> npt.NDArray[np.bool_]:
    """Printable ASCII other than space (0x21-0x7e): a match_id of these needs no closer look."""
    return (data - np.uint8(0x21)) < np.uint8(0x5e)


def _screen(values: pa.ChunkedArray, allowed: Any, shortest: int,
            longest: int) -> npt.NDArray[np.bool_]:
    """Rows that may be bad: not shortest..longest bytes long, or with a byte not allowed
    (`allowed` maps a uint8 array of bytes to a bool array); never a null.

    A few range tests over the raw UTF-8 bytes instead of a regex per row: a row it clears is
    certainly good, so only the flagged rows (few, in practice) need the exact checks.
    """
    flagged = []
    for chunk in values.chunks:
        if not pa.types.is_string(chunk.type):
            return np.ones(len(values), dtype=bool)
        if len(chunk) == 0:
            continue
        _, offsets_buffer, data_buffer = chunk.buffers()
        offsets = np.frombuffer(offsets_buffer, dtype=np.int32)[
            chunk.offset:chunk.offset + len(chunk) + 1]
        lengths = np.diff(offsets)
        rows = (lengths < shortest) | (lengths > longest)
        if data_buffer is not None and offsets[-1] > offsets[0]:
            data = np.frombuffer(data_buffer, dtype=np.uint8)[offsets[0]:offsets[-1]]
            good = allowed(data)
            if not good.all():
                bad_bytes = np.flatnonzero(~good)
                rows[np.searchsorted(offsets, bad_bytes + offsets[0], side="right") - 1] = True
        if chunk.null_count:  # a null is missing_field's, never bad here
            rows &= ~_is_null(chunk)
        flagged.append(rows)
    return np.concatenate(flagged) if flagged else np.zeros(len(values), dtype=bool)


def _exact_on(flagged: npt.NDArray[np.bool_], values: pa.ChunkedArray,
              check: Any) -> npt.NDArray[np.bool_]:
    """`check` (Arrow array -> numpy mask of bad rows) run on the flagged rows only."""
    bad = np.zeros(len(flagged), dtype=bool)
    rows = np.flatnonzero(flagged)
    if rows.size:
        bad[rows] = check(values.take(pa.array(rows)))
    return bad


def _match_id_bad(values: pa.ChunkedArray | pa.Array) -> npt.NDArray[np.bool_]:
    """match_id longer than _MATCH_ID_MAX, blank, or with a control character (nulls: False)."""
    length = pc.fill_null(pc.utf8_length(values), 0)
    return (_mask(pc.greater(length, _MATCH_ID_MAX))
            | _mask(pc.equal(pc.fill_null(pc.utf8_length(pc.utf8_trim_whitespace(values)), 1),
                             0))
            | _mask(pc.match_substring_regex(values, f"[{_UNPRINTABLE}]")))


def _id_bad(values: pa.ChunkedArray | pa.Array) -> npt.NDArray[np.bool_]:
    """Ids not matching ID_PATTERN (nulls: False)."""
    return ~_mask(pc.match_substring_regex(values, ID_PATTERN)) & ~_mask(pc.is_null(values))


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
            checks.fail(too_big, "bad_type",
                        lambda i: f"points {column[i].as_py()} overflows int64")
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
        # An integer too long for the exact range is out of range, not "not an integer".
        long = bad & _mask(pc.match_substring_regex(text, r"^\s*[+-]?\d+\s*$"))
        checks.fail(long, "bad_type",
                    lambda i: f"points {_shown(text[i].as_py())} is out of range: at most 18 "
                              "digits (|points| < 10^18)")
        checks.fail(bad & ~long, "bad_type",
                    lambda i: f"points {_shown(text[i].as_py())} is not an integer")
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


def _iso(micros: int) -> str:
    """An instant (us since the epoch) in ISO 8601, even one outside datetime's range."""
    try:
        return from_epoch_us(micros).isoformat()
    except OverflowError:
        return f"{micros} us from 1970-01-01 (outside years 1-9999)"


def _to_micros(column: pa.ChunkedArray | pa.Array) -> npt.NDArray[np.int64]:
    filled = pc.fill_null(pc.cast(column, pa.int64()), 0)
    if isinstance(filled, pa.ChunkedArray):
        filled = filled.combine_chunks()
    return np.asarray(filled.to_numpy(), dtype=np.int64)


_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
#: Days spanned by a batch's event times up to which they are indexed by a dense table.
_DENSE_DAYS = 4096
_MAX_CACHED_DAYS = 1 << 16
_MAX_PLANS = 16


def _day_deadlines(registry: Registry, day_number: int
                   ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    """Per board, for one event day (days since the epoch): the latest ingested_at (us) any
    window still counts (-inf: the day is in no window of the board), and whether a window
    of the day is past year 9999."""
    calendar = registry.calendar
    latest = np.full(len(registry.boards), -np.inf)
    out_of_range = np.zeros(len(registry.boards), dtype=bool)
    try:
        day: date | None = _EPOCH + timedelta(days=day_number)
    except OverflowError:
        day = None
    for b, board in enumerate(registry.boards):
        if day is None:
            out_of_range[b] = True
            continue
        grace = duration_us(board.grace)
        for kind in board.windows:
            try:
                window = calendar.window_on(kind, day)
            except WindowError:
                out_of_range[b] = True
                break
            if window is None:
                continue
            if window.end is None:
                latest[b] = np.inf
                continue
            latest[b] = max(latest[b], float(epoch_us(window.end) + grace))
    return latest, out_of_range


class _Plan:
    """What validation derives from one registry, worked out once and reused by every batch.

    Rows are classed by (region, mode) into `combos`: region code (registry order, or R for
    any other value) * (M + 1) + mode code (or M). Which boards count a row depends on its
    combo only, so per combo: the boards that apply, the points range every one of them
    accepts, and per event day the best deadline over those boards.
    """

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        regions, modes = registry.regions, registry.modes
        self.region_set = pa.array(regions, pa.string())
        self.mode_set = pa.array(modes, pa.string())
        self.region_other, self.mode_other = len(regions), len(modes)
        self.combos = (len(regions) + 1) * (len(modes) + 1)
        combo = np.arange(self.combos)
        region_code, mode_code = combo // (len(modes) + 1), combo % (len(modes) + 1)
        self.origin = epoch_us(datetime.combine(registry.calendar.all_time_start,
                                               datetime.min.time(), UTC))
        self.horizon = epoch_us(datetime.combine(registry.calendar.all_time_end,
                                                datetime.min.time(), UTC))
        self.applies = np.zeros((len(registry.boards), self.combos), dtype=bool)
        self.fits: list[int | None] = []
        low = [_INT64_MIN] * self.combos
        high = [_INT64_MAX] * self.combos
        for b, board in enumerate(registry.boards):
            if board.direct:
                pass  # fed by its own submissions (validate_scores), never by a match event
            elif board.scope == "global":
                self.applies[b] = True
            elif board.scope == "region":
                if board.scope_value in regions:
                    self.applies[b] = region_code == regions.index(board.scope_value)
            elif board.scope_value in modes:
                self.applies[b] = mode_code == modes.index(board.scope_value)
            fit = None
            if board.ties == "earliest":
                fit = min(registry.layout(board, k).limit for k in board.windows)
            self.fits.append(fit)
            lowest = board.min_points if fit is None else max(board.min_points, -fit)
            highest = board.max_points if fit is None else min(board.max_points, fit)
            for c in np.flatnonzero(self.applies[b]).tolist():
                low[c], high[c] = max(low[c], lowest), min(high[c], highest)
        for c in range(self.combos):
            if low[c] > high[c] or low[c] > _INT64_MAX or high[c] < _INT64_MIN:
                low[c], high[c] = _INT64_MAX, _INT64_MIN  # every row gets the exact checks
        #: Per combo, points in [low, high] pass every applicable board's bounds and fit.
        self.low = np.array(low, dtype=np.int64)
        self.high = np.array(high, dtype=np.int64)
        self._days: dict[int, tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]] = {}

    def day(self, day_number: int) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
        """Per combo, for one event day: the latest ingested_at (us) of any window of any
        applicable board (-inf: none), and whether an applicable board has a window of the day
        past year 9999."""
        cached = self._days.get(day_number)
        if cached is None:
            latest, out_of_range = _day_deadlines(self.registry, day_number)
            best = np.full(self.combos, -np.inf)
            out = np.zeros(self.combos, dtype=bool)
            for b in range(len(latest)):
                best = np.where(self.applies[b], np.maximum(best, latest[b]), best)
                out |= self.applies[b] & out_of_range[b]
            if len(self._days) >= _MAX_CACHED_DAYS:
                self._days.clear()
            cached = self._days[day_number] = (best, out)
        return cached


_plans: dict[int, _Plan] = {}
_plans_lock = threading.Lock()


def _plan(registry: Registry) -> _Plan:
    """The plan of a registry (kept by identity: a registry is immutable)."""
    plan = _plans.get(id(registry))
    if plan is not None and plan.registry is registry:
        return plan
    plan = _Plan(registry)
    with _plans_lock:
        while len(_plans) >= _MAX_PLANS:
            del _plans[next(iter(_plans))]
        _plans[id(registry)] = plan  # holds the registry, so its id is not reused meanwhile
    return plan


def _codes(values: pa.ChunkedArray, known: pa.Array, other: int) -> npt.NDArray[np.int64]:
    """Index of each value in `known`; `other` for nulls and unknown values."""
    index = pc.index_in(values, value_set=known)
    if isinstance(index, pa.ChunkedArray):
        index = index.combine_chunks()
    return np.asarray(pc.fill_null(index, other).to_numpy(), dtype=np.int64)


def _fixed_width(column: pa.ChunkedArray) -> npt.NDArray[np.uint8] | None:
    """A text column as an (n, width) byte matrix when every value is `width` bytes long (no
    nulls, width >= 1); None otherwise."""
    array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    if len(array) == 0 or array.null_count or not pa.types.is_string(array.type):
        return None
    _, offsets_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int32)[
        array.offset:array.offset + len(array) + 1]
    width = int(offsets[1] - offsets[0])
    if width < 1 or data_buffer is None or not (np.diff(offsets) == width).all():
        return None
    data = np.frombuffer(data_buffer, dtype=np.uint8)[offsets[0]:offsets[-1]]
    return data.reshape(len(array), width)


def _first_occurrences(accepted: pa.Table) -> npt.NDArray[np.int64] | None:
    """Rows to keep so that each (match_id, player_id) appears once, first delivery first;
    None when there are no repeats."""
    match_id, player_id = accepted.column("match_id"), accepted.column("player_id")
    match_bytes, player_bytes = _fixed_width(match_id), _fixed_width(player_id)
    keys: pa.Array | pa.ChunkedArray
    if match_bytes is not None and player_bytes is not None:
        # Fixed widths (machine-made ids): the two ids side by side are one fixed-size key.
        both = np.concatenate([match_bytes, player_bytes], axis=1)
        keys = pa.Array.from_buffers(pa.binary(both.shape[1]), len(both),
                                     [None, pa.py_buffer(both)])
    else:
        # Accepted ids have no control characters, so joining them with NUL is unambiguous.
        keys = pc.binary_join_element_wise(match_id, player_id, "\x00")
        if isinstance(keys, pa.ChunkedArray):
            keys = keys.combine_chunks()
    encoded = pc.dictionary_encode(keys)
    if len(encoded.dictionary) == accepted.num_rows:
        return None
    index = np.asarray(encoded.indices.to_numpy(), dtype=np.int64)
    # A row whose key number exceeds every number before it is its key's first row. Arrow
    # numbers keys in order of appearance, so that finds every key once; if not, sort.
    seen = np.maximum.accumulate(index)
    first = np.flatnonzero(np.concatenate([[True], seen[1:] > seen[:-1]]))
    if len(first) == len(encoded.dictionary):
        return first
    _, first = np.unique(index, return_index=True)
    return np.sort(first)


def validate_events(
    table: pa.Table,
    registry: Registry,
    *,
    now: datetime,
    ingested_at: datetime | pa.Array | pa.ChunkedArray | str | None = None,
    default_server_id: str | None = None,
    source: str = "",
    erased: ErasureLedger | None = None,
) -> Validated:
    """Validate a batch of raw events against the registry.

    `now` is the landing clock (for the future check); `ingested_at` is when the rows land
    (a scalar, one value per row, or "event_time" for backfills, which the lateness rule
    does not apply to; defaults to `now`) for the lateness rule.
    Columns may be typed or text (CSV/JSON); unknown columns are ignored.

    The checks run by reason group, in the order a row's first failure is reported: types
    and presence, identifiers, regions and modes, time bounds, points, windows and lateness.
    A player id in the `erased` ledger fails first with reason `erased` (whatever else is
    wrong with the row), and its quarantined row holds the id's salted hash, not the id.
    """
    n = table.num_rows
    checks = _Checks(n)
    columns = _input_columns(table, n, default_server_id)
    text, points, event_time = _check_types(columns, checks)
    if erased:
        gone = erased.mask(text["player_id"])
        checks.fail(gone, "erased", "this player's data was erased (right to erasure); "
                                    "events of the id are refused")
        if gone.any():
            hidden = [f"{ERASED_PREFIX}{erased.hashed(v)}" if g and v is not None else v
                      for g, v in zip(gone.tolist(), columns["player_id"].to_pylist(),
                                      strict=True)]
            columns["player_id"] = pa.chunked_array([pa.array(hidden, pa.string())])
    _check_ids(text, checks)
    plan = _plan(registry)
    codes = _check_scopes(text, registry, plan, checks)
    micros = _to_micros(event_time)
    _check_time_bounds(micros, registry, plan, now, checks)
    landed = _landed_micros(ingested_at, now, micros, n)
    # Which boards count a row depends only on its (region, mode) combo.
    combo = codes["region"] * (plan.mode_other + 1) + codes["mode"]
    _check_points(points, combo, registry, plan, checks)
    _check_windows(micros, landed, combo, plan, checks)
    accepted, duplicates = _accepted(text, points, event_time, ~checks.failed)
    bad_rows = np.flatnonzero(checks.failed)
    if not bad_rows.size:
        return Validated(accepted=accepted, rejected=_REJECTED_SCHEMA.empty_table(),
                         duplicates=duplicates)
    return Validated(accepted=accepted, rejected=_rejected(columns, checks, bad_rows, source),
                     duplicates=duplicates, rejected_rows=bad_rows.astype(np.int64))


def validate_scores(
    table: pa.Table,
    registry: Registry,
    board: Board,
    *,
    now: datetime,
    default_server_id: str | None = None,
    source: str = "",
    erased: ErasureLedger | None = None,
) -> Validated:
    """Validate submissions to one direct board (`match_id`, `player_id`, `points`,
    `event_time`, `server_id`) with exactly the checks of a match event counted on that
    board alone: ids, time bounds, the board's points bounds and sort-key fit, its windows
    and their grace. Accepted rows have region and mode "" and carry `board`, so they count
    on that board only; in-batch retries are dropped by (match_id, player_id), which with the
    board is the score's identity."""
    if not board.direct:
        raise ValueError(f"board {board.name!r} is fed by match events, not by scores")
    n = table.num_rows
    blank = pa.array([""] * n, pa.string())
    rows = table.drop_columns([c for c in ("region", "mode", "board")
                               if c in table.column_names])
    rows = rows.append_column("region", blank).append_column("mode", blank)
    validated = validate_events(rows, _direct_view(registry, board), now=now,
                                default_server_id=default_server_id, source=source,
                                erased=erased)
    accepted = validated.accepted.append_column(
        "board", pa.array([board.name] * validated.accepted.num_rows, pa.string()))
    return replace(validated, accepted=accepted)


_views: dict[tuple[int, str], tuple[Registry, Registry]] = {}


def _direct_view(registry: Registry, board: Board) -> Registry:
    """The registry as one direct board's submissions see it: that board alone, counting
    every row (region and mode ""). Kept per (registry, board), so its plan is reused."""
    found = _views.get((id(registry), board.name))
    if found is not None and found[0] is registry:
        return found[1]
    view = replace(registry, regions=("",), modes=("",),
                   boards=(replace(board, scope="global", scope_value=None, source="events"),))
    with _plans_lock:
        if len(_views) >= _MAX_PLANS:
            _views.clear()
        _views[(id(registry), board.name)] = (registry, view)
    return view


def _input_columns(table: pa.Table, n: int, default_server_id: str | None
                   ) -> dict[str, pa.ChunkedArray]:
    """Every input field as a column: absent ones null (server_id: the default, if given)."""
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
    return columns


def _check_types(columns: dict[str, pa.ChunkedArray], checks: _Checks
                 ) -> tuple[dict[str, pa.ChunkedArray], npt.NDArray[np.int64], pa.ChunkedArray]:
    """bad_type, missing_field: the text columns, points and event_time, typed. Types first,
    then presence: a wrong type is reported as such, not as missing."""
    text = {name: _as_text(columns[name], name, checks)
            for name in ("match_id", "player_id", "region", "mode", "server_id")}
    points = _as_points(columns["points"], checks)
    event_time = _as_event_time(columns["event_time"], checks)
    typed = {**text, "points": columns["points"], "event_time": event_time}
    for name in INPUT_FIELDS:
        if _has_nulls(typed[name]):
            checks.fail(_is_null(typed[name]), "missing_field", f"{name} is missing")
    return text, points, event_time


def _check_ids(text: dict[str, pa.ChunkedArray], checks: _Checks) -> None:
    """bad_match_id, bad_player_id, bad_server_id. A cheap byte screen first; the exact
    checks run only on the rows it flags."""
    match_id = text["match_id"]
    bad_match = _exact_on(_screen(match_id, _printable_bytes, 1, _MATCH_ID_MAX), match_id,
                          _match_id_bad)
    checks.fail(bad_match, "bad_match_id",
                lambda i: f"match_id {_shown(match_id[i].as_py())} must be 1-{_MATCH_ID_MAX} "
                          "printable characters")
    for name, code in (("player_id", "bad_player_id"), ("server_id", "bad_server_id")):
        values = text[name]
        # Ids of 1-2 chars go to the exact check too: "." and ".." have allowed bytes.
        bad = _exact_on(_screen(values, _id_bytes, 3, 64), values, _id_bad)
        checks.fail(bad, code, lambda i, v=values, f=name: (
            f"{f} {_shown(v[i].as_py())} must be {ID_RULE}"))


def _check_scopes(text: dict[str, pa.ChunkedArray], registry: Registry, plan: _Plan,
                  checks: _Checks) -> dict[str, npt.NDArray[np.int64]]:
    """unknown_region, unknown_mode: each row's region and mode codes (unknown: `other`)."""
    codes: dict[str, npt.NDArray[np.int64]] = {}
    for name, code, known, known_set, other in (
            ("region", "unknown_region", registry.regions, plan.region_set, plan.region_other),
            ("mode", "unknown_mode", registry.modes, plan.mode_set, plan.mode_other)):
        values = text[name]
        codes[name] = _codes(values, known_set, other)
        bad = codes[name] == other
        if _has_nulls(values):
            bad &= ~_is_null(values)
        checks.fail(bad, code, lambda i, v=values, f=name, k=known: (
            f"{f} {_shown(v[i].as_py())} is not one of {', '.join(k)}"))
    return codes


def _check_time_bounds(micros: npt.NDArray[np.int64], registry: Registry, plan: _Plan,
                       now: datetime, checks: _Checks) -> None:
    """before_calendar_start, event_time_in_future, after_calendar_end. The calendar's
    bounds are the batch's too: an event outside them would count in no version."""
    checks.fail(micros < plan.origin, "before_calendar_start",
                lambda i: f"event_time {_iso(int(micros[i]))} is before the calendar "
                          f"start {registry.calendar.all_time_start}")
    limit = epoch_us(now) + duration_us(registry.future_skew)
    checks.fail(micros > limit, "event_time_in_future",
                lambda i: f"event_time {_iso(int(micros[i]))} is more than "
                          f"{registry.future_skew} ahead of the landing clock {now.isoformat()}")
    checks.fail(micros >= plan.horizon, "after_calendar_end",
                lambda i: f"event_time {_iso(int(micros[i]))} is on or after the calendar "
                          f"end {registry.calendar.all_time_end} (calendar.all_time_end)")


def _landed_micros(ingested_at: datetime | pa.Array | pa.ChunkedArray | str | None,
                   now: datetime, micros: npt.NDArray[np.int64], n: int
                   ) -> npt.NDArray[np.int64]:
    """Each row's landing instant for the lateness rule (see validate_events)."""
    if ingested_at is None:
        ingested_at = now
    if isinstance(ingested_at, str):
        if ingested_at != "event_time":
            raise ValueError(f"ingested_at={ingested_at!r}: only 'event_time' is a valid name")
        return micros
    if isinstance(ingested_at, datetime):
        return np.full(n, epoch_us(ingested_at), dtype=np.int64)
    return _to_micros(_to_timestamp(ingested_at))


def _check_points(points: npt.NDArray[np.int64], combo: npt.NDArray[np.int64],
                  registry: Registry, plan: _Plan, checks: _Checks) -> None:
    """points_out_of_bounds, sort_key_overflow. A row inside its combo's common range passes
    every board; the rest get each board's checks, in board order, so the first failing
    board is the one reported."""
    suspect = (points < plan.low[combo]) | (points > plan.high[combo])
    if not suspect.any():
        return
    for b, board in enumerate(registry.boards):
        applies = suspect & plan.applies[b][combo]
        out = applies & ((points < board.min_points) | (points > board.max_points))
        checks.fail(out, "points_out_of_bounds", lambda i, b=board: (
            f"points {points[i]} outside [{b.min_points}, {b.max_points}] of board {b.name}"))
        fit = plan.fits[b]
        if fit is not None:
            checks.fail(applies & (np.abs(points) > fit), "sort_key_overflow",
                        lambda i, b=board, f=fit: (
                            f"points {points[i]} exceed |{f}|, the exact sort-key range of "
                            f"board {b.name}"))


def _check_windows(micros: npt.NDArray[np.int64], landed: npt.NDArray[np.int64],
                   combo: npt.NDArray[np.int64], plan: _Plan, checks: _Checks) -> None:
    """bad_type (a window past date.max), no_window, too_late. Windows only for rows still
    ok: a rejected event_time may be anywhere in years 1-9999."""
    n = micros.shape[0]
    pending = np.flatnonzero(~checks.failed)
    best_deadline = np.full(n, -np.inf)
    out_of_range = np.zeros(n, dtype=bool)
    if pending.size:
        days = np.floor_divide(micros[pending], _US_PER_DAY)
        first_day = int(days.min())
        span = int(days.max()) - first_day + 1
        if span <= _DENSE_DAYS:
            relative = days - first_day
            present = np.flatnonzero(np.bincount(relative, minlength=span))
            slot = np.zeros(span, dtype=np.int64)
            slot[present] = np.arange(present.size)
            unique_days = (present + first_day).tolist()
            day_index = slot[relative]
        else:
            found, day_index = np.unique(days, return_inverse=True)
            unique_days = found.tolist()
        per_day = [plan.day(d) for d in unique_days]
        at = day_index.reshape(-1) * plan.combos + combo[pending]
        best_deadline[pending] = np.concatenate([best for best, _ in per_day])[at]
        out_of_range[pending] = np.concatenate([out for _, out in per_day])[at]
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


def _accepted(text: dict[str, pa.ChunkedArray], points: npt.NDArray[np.int64],
              event_time: pa.ChunkedArray, ok: npt.NDArray[np.bool_]) -> tuple[pa.Table, int]:
    """The rows that passed, typed, with in-batch duplicates dropped (first wins)."""
    accepted = pa.table({
        "match_id": text["match_id"], "player_id": text["player_id"],
        "points": pa.array(points, pa.int64()), "event_time": event_time,
        "region": text["region"], "mode": text["mode"], "server_id": text["server_id"],
    })
    if not ok.all():
        accepted = accepted.filter(pa.array(ok))
    accepted = conform(accepted, EVENT_SCHEMA)
    duplicates = 0
    if accepted.num_rows:
        keep = _first_occurrences(accepted)
        if keep is not None:
            duplicates = accepted.num_rows - len(keep)
            accepted = accepted.take(pa.array(keep))
    return accepted, duplicates


def _rejected(columns: dict[str, pa.ChunkedArray], checks: _Checks,
              bad_rows: npt.NDArray[np.intp], source: str) -> pa.Table:
    """The failed rows as they came (as text), with reason, detail and source."""
    rejected_columns: dict[str, pa.Array] = {}
    for name in INPUT_FIELDS:
        raw = columns[name].take(pa.array(bad_rows, pa.int64())) if bad_rows.size else None
        rejected_columns[name] = _raw_text(raw, len(bad_rows))
    rejected_columns["reason"] = pa.array([checks.reason[i] for i in bad_rows], pa.string())
    rejected_columns["detail"] = pa.array([checks.detail[i] for i in bad_rows], pa.string())
    rejected_columns["source"] = pa.array([source] * len(bad_rows), pa.string())
    return pa.table(rejected_columns, schema=_REJECTED_SCHEMA)


def _raw_text(raw: pa.ChunkedArray | None, n: int) -> pa.Array:
    """The original values as text, whatever their type, for the quarantine."""
    if raw is None:
        return pa.nulls(n, pa.string())
    try:
        cast = pc.cast(raw, pa.string())
        return cast.combine_chunks() if isinstance(cast, pa.ChunkedArray) else cast
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return pa.array([None if v is None else str(v) for v in raw.to_pylist()], pa.string())
