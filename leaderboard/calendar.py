"""The window calendar: which windows an event counts for, and when windows start and end.

Every window starts and ends at 00:00 UTC of some date, so the window an event falls in is a
function of its event date alone; vectorised callers map unique dates, not rows.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache

from leaderboard.timeutil import to_utc

__all__ = [
    "ALL_TIME",
    "ALL_TIME_END",
    "DAILY",
    "MONTHLY",
    "SEASON",
    "WEEKLY",
    "WINDOW_KINDS",
    "Calendar",
    "Season",
    "Window",
    "WindowError",
]

DAILY = "daily"
WEEKLY = "weekly"
MONTHLY = "monthly"
SEASON = "season"
ALL_TIME = "all-time"
WINDOW_KINDS: tuple[str, ...] = (DAILY, WEEKLY, MONTHLY, SEASON, ALL_TIME)
#: The default end of the all-time window (exclusive): its length bounds the time offsets of
#: all-time `earliest` sort keys, so it cannot be open-ended.
ALL_TIME_END = date(2200, 1, 1)

_QUARTER_ID = re.compile(r"^(\d{4})-S([1-4])$")
_WEEK_ID = re.compile(r"^(\d{4})-W(\d{2})$")
_MONTH_ID = re.compile(r"^(\d{4})-(\d{2})$")


class WindowError(ValueError):
    """A window id or kind that the calendar does not know, or one past datetime's range."""


@dataclass(frozen=True, order=True)
class Window:
    """One window: `start` inclusive, `end` exclusive (None for all-time)."""

    start: datetime
    id: str
    kind: str
    end: datetime | None

    def contains(self, instant: datetime) -> bool:
        return self.start <= instant and (self.end is None or instant < self.end)

    def counts(self, event_time: datetime, ingested_at: datetime, grace: timedelta) -> bool:
        """The counting rule: event_time in the window, ingested_at <= end + grace."""
        if not self.contains(event_time):
            return False
        # ingested_at - end is a timedelta, which cannot overflow where end + grace can.
        return self.end is None or ingested_at - self.end <= grace

    @property
    def last_date(self) -> date | None:
        """The last calendar date inside the window (None for all-time)."""
        return None if self.end is None else (self.end - timedelta(days=1)).date()


@dataclass(frozen=True)
class Season:
    """An explicit season: [start, end) in whole UTC days."""

    id: str
    start: date
    end: date


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time.min, UTC)


def _add_months(day: date, months: int) -> date:
    index = day.year * 12 + (day.month - 1) + months
    return date(index // 12, index % 12 + 1, 1)


class Calendar:
    """Window arithmetic for one registry: quarterly seasons unless explicit ones are given."""

    def __init__(
        self, seasons: tuple[Season, ...] | None = None, all_time_start: date = date(1970, 1, 1),
        all_time_end: date = ALL_TIME_END,
    ) -> None:
        self.seasons = tuple(sorted(seasons, key=lambda s: s.start)) if seasons else None
        self.all_time_start = all_time_start
        #: The day after the last date the all-time window counts (its length sizes the time
        #: bits of all-time `earliest` keys); an event from that date on counts in no
        #: all-time window.
        self.all_time_end = all_time_end
        if all_time_end <= all_time_start:
            raise WindowError(
                f"all_time_end {all_time_end} must be after all_time_start {all_time_start}")
        if self.seasons:
            for before, after in zip(self.seasons, self.seasons[1:], strict=False):
                if after.start < before.end:
                    raise WindowError(
                        f"seasons {before.id} and {after.id} overlap; "
                        "each season must end on or before the next one starts"
                    )
        self._window_on = lru_cache(maxsize=65536)(self._window_on_uncached)

    # -- one window ------------------------------------------------------------------------

    def window_on(self, kind: str, day: date) -> Window | None:
        """The window of `kind` containing the date `day` (None: no season covers it)."""
        return self._window_on(kind, day)

    def window_at(self, kind: str, instant: datetime) -> Window | None:
        """The window of `kind` containing `instant` (naive means UTC, as everywhere)."""
        try:
            day = to_utc(instant).date()
        except OverflowError:
            raise WindowError(f"{instant.isoformat()} is outside the range of UTC dates") from None
        return self._window_on(kind, day)

    def _window_on_uncached(self, kind: str, day: date) -> Window | None:
        """_window_on_raw, with a window past datetime's range as a WindowError."""
        try:
            return self._window_on_raw(kind, day)
        except WindowError:
            raise
        except (OverflowError, ValueError):
            raise WindowError(
                f"the {kind} window of {day.isoformat()} would end after "
                f"{date.max.isoformat()}, beyond the range of dates"
            ) from None

    def _window_on_raw(self, kind: str, day: date) -> Window | None:
        if kind == DAILY:
            return Window(_midnight(day), f"{DAILY}:{day.isoformat()}", DAILY,
                          _midnight(day + timedelta(days=1)))
        if kind == WEEKLY:
            monday = day - timedelta(days=day.weekday())
            iso_year, iso_week, _ = monday.isocalendar()
            return Window(_midnight(monday), f"{WEEKLY}:{iso_year:04d}-W{iso_week:02d}", WEEKLY,
                          _midnight(monday + timedelta(days=7)))
        if kind == MONTHLY:
            first = day.replace(day=1)
            return Window(_midnight(first), f"{MONTHLY}:{first.year:04d}-{first.month:02d}",
                          MONTHLY, _midnight(_add_months(first, 1)))
        if kind == SEASON:
            if self.seasons is None:
                quarter = (day.month - 1) // 3
                first = date(day.year, quarter * 3 + 1, 1)
                return Window(_midnight(first), f"{SEASON}:{day.year:04d}-S{quarter + 1}", SEASON,
                              _midnight(_add_months(first, 3)))
            for season in self.seasons:
                if season.start <= day < season.end:
                    return Window(_midnight(season.start), f"{SEASON}:{season.id}", SEASON,
                                  _midnight(season.end))
            return None
        if kind == ALL_TIME:
            if day >= self.all_time_end:
                return None
            return Window(_midnight(self.all_time_start), ALL_TIME, ALL_TIME, None)
        raise WindowError(
            f"unknown window kind {kind!r}; expected one of {', '.join(WINDOW_KINDS)}")

    def window(self, window_id: str) -> Window:
        """Parse a window id such as `weekly:2026-W49`; raises WindowError naming the problem."""
        if window_id == ALL_TIME:
            return self._window_on(ALL_TIME, self.all_time_start)  # type: ignore[return-value]
        kind, _, rest = window_id.partition(":")
        try:
            if kind == DAILY:
                day = date.fromisoformat(rest)
                if rest != day.isoformat():
                    raise ValueError
            elif kind == WEEKLY:
                match = _WEEK_ID.match(rest)
                if not match:
                    raise ValueError
                day = date.fromisocalendar(int(match.group(1)), int(match.group(2)), 1)
            elif kind == MONTHLY:
                match = _MONTH_ID.match(rest)
                if not match:
                    raise ValueError
                day = date(int(match.group(1)), int(match.group(2)), 1)
            elif kind == SEASON:
                day = self._season_start(rest)
            else:
                raise WindowError(
                    f"window id {window_id!r} has unknown kind {kind!r}; expected one of "
                    f"{', '.join(WINDOW_KINDS)} (e.g. daily:2026-12-01, weekly:2026-W49, "
                    "monthly:2026-12, season:2026-S4, all-time)"
                )
        except (ValueError, TypeError) as exc:
            if isinstance(exc, WindowError):
                raise
            raise WindowError(
                f"window id {window_id!r} is malformed; expected e.g. daily:2026-12-01, "
                "weekly:2026-W49, monthly:2026-12, season:2026-S4 or all-time"
            ) from None
        try:
            found = self._window_on(kind, day)
        except WindowError as exc:
            raise WindowError(f"window id {window_id!r} cannot be used: {exc}") from None
        assert found is not None, window_id
        assert found.id == window_id, (window_id, found)
        return found

    def _season_start(self, season_id: str) -> date:
        if self.seasons is None:
            match = _QUARTER_ID.match(season_id)
            if not match:
                raise ValueError
            return date(int(match.group(1)), (int(match.group(2)) - 1) * 3 + 1, 1)
        for season in self.seasons:
            if season.id == season_id:
                return season.start
        known = ", ".join(s.id for s in self.seasons)
        raise WindowError(f"season {season_id!r} is not in the season calendar ({known})")

    def resolve(self, spec: str, now: datetime) -> Window:
        """`daily`/`weekly`/... mean the window open at `now`; a full id is parsed as is."""
        if spec in WINDOW_KINDS:
            found = self.window_at(spec, now)
            if found is None:
                raise WindowError(f"no {spec} window is open at {now.isoformat()}")
            return found
        return self.window(spec)

    def next_reset(self, kind: str, now: datetime) -> datetime | None:
        """When the window of `kind` open at `now` closes (None: all-time, or no season)."""
        found = self.window_at(kind, now)
        return None if found is None else found.end

    # -- counting ------------------------------------------------------------------------

    def counted_windows(
        self,
        kinds: tuple[str, ...],
        event_time: datetime,
        ingested_at: datetime,
        grace: timedelta,
    ) -> list[Window]:
        """The windows among `kinds` an event counts for (the rule with grace)."""
        found = []
        for kind in kinds:
            window = self.window_at(kind, event_time)
            if window is not None and window.counts(event_time, ingested_at, grace):
                found.append(window)
        return found

    def windows_between(self, kind: str, first: date, last: date) -> list[Window]:
        """Every window of `kind` that overlaps the dates [first, last]."""
        found: list[Window] = []
        day = first
        while day <= last:
            window = self._window_on(kind, day)
            if window is None:
                day += timedelta(days=1)
                continue
            found.append(window)
            if window.end is None:
                break
            day = window.end.date()
        return found

    # -- sort-key support ------------------------------------------------------------------

    def max_length_seconds(self, kind: str) -> int:
        """The longest a window of `kind` can be, in seconds (all-time: all_time_start to
        all_time_end)."""
        day = 86400
        if kind == DAILY:
            return day
        if kind == WEEKLY:
            return 7 * day
        if kind == MONTHLY:
            return 31 * day
        if kind == SEASON:
            if self.seasons is None:
                return 92 * day
            return max((s.end - s.start).days for s in self.seasons) * day
        if kind == ALL_TIME:
            return (self.all_time_end - self.all_time_start).days * day
        raise WindowError(f"unknown window kind {kind!r}")

    def time_bits(self, kind: str, unit_us: int = 1_000_000) -> int:
        """Bits an `earliest` key needs for the offset from the window start, counted in
        units of `unit_us` microseconds (whole seconds unless told)."""
        units = -(-self.max_length_seconds(kind) * 1_000_000 // unit_us)
        return max(1, math.ceil(math.log2(units)))
