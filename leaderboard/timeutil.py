"""Parsing of UTC instants and durations, shared by settings, registry and CLI."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta

__all__ = ["EPOCH", "duration_us", "epoch_us", "format_instant", "from_epoch_us", "parse_date",
           "parse_duration", "parse_instant", "to_utc"]

#: 1970-01-01 00:00 UTC: Parquet, Arrow, DuckDB and Spark count instants from it.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)

_DURATION = re.compile(r"^\s*(\d+)\s*(s|m|h|d|w)\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def to_utc(value: datetime) -> datetime:
    """Naive datetimes are taken as UTC; aware ones are converted."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def parse_instant(text: str, *, what: str = "timestamp") -> datetime:
    """Parse an ISO 8601 instant (date-only means 00:00 UTC); naive means UTC."""
    raw = text.strip()
    try:
        if len(raw) == 10:
            return datetime.combine(date.fromisoformat(raw), datetime.min.time(), UTC)
        return to_utc(datetime.fromisoformat(raw))
    except ValueError:
        raise ValueError(
            f"{what} {text!r} is not an ISO 8601 instant; use e.g. 2026-12-01T12:00:00Z"
        ) from None


def parse_date(text: str, *, what: str = "date") -> date:
    try:
        return date.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a date; use YYYY-MM-DD") from None


def parse_duration(value: str | int | float, *, what: str = "duration") -> timedelta:
    """`"7d"`, `"24h"`, `"5m"`, `"30s"`, `"2w"` or a number of seconds."""
    if isinstance(value, bool):
        raise ValueError(f"{what} {value!r} is not a duration; use e.g. '7d' or '24h'")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"{what} {value!r} must not be negative")
        return timedelta(seconds=value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(f"{what} {value!r} is not a duration; use e.g. '7d', '24h', '5m', '30s'")
    return timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])


def format_instant(value: datetime) -> str:
    """ISO 8601 with a Z suffix, second precision unless there are microseconds."""
    value = to_utc(value)
    text = value.isoformat(timespec="microseconds" if value.microsecond else "seconds")
    return text.replace("+00:00", "Z")


def epoch_us(instant: datetime) -> int:
    """Microseconds since the epoch, the integer every engine stores an instant as (naive
    means UTC). Exact: no float seconds on the way."""
    return (to_utc(instant) - EPOCH) // _MICROSECOND


def from_epoch_us(micros: int) -> datetime:
    """The UTC instant `micros` microseconds after the epoch (OverflowError past year 9999)."""
    return EPOCH + timedelta(microseconds=micros)


def duration_us(duration: timedelta) -> int:
    """A duration in whole microseconds (a grace, a skew), exact."""
    return duration // _MICROSECOND
