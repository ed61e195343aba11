"""The window calendar: ids, boundaries, parsing, resets and the counting rule with grace."""

from __future__ import annotations

import itertools
import math
import time
from datetime import UTC, date, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import dates, explicit_seasons, instants, midnight, window_kinds

from leaderboard.calendar import (
    ALL_TIME,
    ALL_TIME_END,
    DAILY,
    MONTHLY,
    SEASON,
    WEEKLY,
    WINDOW_KINDS,
    Calendar,
    Season,
    WindowError,
)

US = timedelta(microseconds=1)
GRACE = timedelta(days=7)


@pytest.fixture(scope="module")
def calendar() -> Calendar:
    """Quarterly seasons, all-time from 1970 (the default registry's calendar)."""
    return Calendar()


@pytest.fixture(scope="module")
def seasonal() -> Calendar:
    """Explicit seasons with a gap (2026-03-01..03-15) between them; given out of order."""
    return Calendar((
        Season("beta", date(2026, 3, 15), date(2026, 6, 1)),
        Season("alpha", date(2026, 1, 10), date(2026, 3, 1)),
    ))


def _utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0,
         microsecond: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, microsecond, tzinfo=UTC)


# -- ISO weeks -----------------------------------------------------------------------------


@pytest.mark.parametrize(("day", "week_id"), [
    (date(2020, 12, 28), "weekly:2020-W53"),  # Monday of a 53-week year
    (date(2020, 12, 31), "weekly:2020-W53"),
    (date(2021, 1, 3), "weekly:2020-W53"),    # Sunday in January, still 2020's week 53
    (date(2021, 1, 4), "weekly:2021-W01"),
    (date(2026, 12, 28), "weekly:2026-W53"),
    (date(2026, 12, 31), "weekly:2026-W53"),
    (date(2027, 1, 1), "weekly:2026-W53"),    # a Friday in 2027, ISO year 2026
    (date(2027, 1, 3), "weekly:2026-W53"),
    (date(2027, 1, 4), "weekly:2027-W01"),
    (date(2024, 12, 29), "weekly:2024-W52"),
    (date(2024, 12, 30), "weekly:2025-W01"),  # a December Monday that opens the next ISO year
    (date(2025, 1, 5), "weekly:2025-W01"),
    (date(2023, 1, 1), "weekly:2022-W52"),    # a Sunday, last day of 2022's last week
    (date(2026, 12, 2), "weekly:2026-W49"),
])
def test_week_id_follows_iso_8601_at_year_boundaries(calendar, day, week_id):
    window = calendar.window_on(WEEKLY, day)
    assert window is not None
    assert window.id == week_id
    assert window.start.weekday() == 0, "ISO weeks start on Monday"
    assert window.start.date() <= day <= window.last_date


def test_week_53_of_2020_spans_dec_28_to_jan_3(calendar):
    window = calendar.window("weekly:2020-W53")
    assert window.start == _utc(2020, 12, 28)
    assert window.end == _utc(2021, 1, 4)
    assert window.last_date == date(2021, 1, 3)
    assert window.kind == WEEKLY


@pytest.mark.parametrize("week_id", ["weekly:2025-W53", "weekly:2026-W54", "weekly:2026-W00"])
def test_weeks_that_do_not_exist_are_rejected(calendar, week_id):
    with pytest.raises(WindowError, match="malformed"):
        calendar.window(week_id)


# -- months and quarters -------------------------------------------------------------------


@pytest.mark.parametrize(("month_id", "last_day"), [
    ("monthly:2028-02", date(2028, 2, 29)),   # leap year
    ("monthly:2026-02", date(2026, 2, 28)),
    ("monthly:2100-02", date(2100, 2, 28)),   # century, not a leap year
    ("monthly:2000-02", date(2000, 2, 29)),   # 400-year rule, leap
    ("monthly:2026-01", date(2026, 1, 31)),
    ("monthly:2026-03", date(2026, 3, 31)),
    ("monthly:2026-04", date(2026, 4, 30)),
    ("monthly:2026-07", date(2026, 7, 31)),
    ("monthly:2026-08", date(2026, 8, 31)),
    ("monthly:2026-12", date(2026, 12, 31)),
])
def test_month_ends(calendar, month_id, last_day):
    window = calendar.window(month_id)
    assert window.start == midnight(last_day.replace(day=1))
    assert window.last_date == last_day
    assert window.end == midnight(last_day + timedelta(days=1))
    assert calendar.window_on(MONTHLY, last_day) == window
    assert calendar.window_on(MONTHLY, last_day + timedelta(days=1)) != window


def test_feb_29_is_a_day_only_in_leap_years(calendar):
    assert calendar.window("daily:2028-02-29").end == _utc(2028, 3, 1)
    with pytest.raises(WindowError):
        calendar.window("daily:2026-02-29")


@pytest.mark.parametrize(("season_id", "start", "end"), [
    ("season:2026-S1", date(2026, 1, 1), date(2026, 4, 1)),
    ("season:2026-S2", date(2026, 4, 1), date(2026, 7, 1)),
    ("season:2026-S3", date(2026, 7, 1), date(2026, 10, 1)),
    ("season:2026-S4", date(2026, 10, 1), date(2027, 1, 1)),
])
def test_quarterly_seasons(calendar, season_id, start, end):
    window = calendar.window(season_id)
    assert (window.start, window.end) == (midnight(start), midnight(end))
    assert calendar.window_on(SEASON, start).id == season_id
    assert calendar.window_on(SEASON, end - timedelta(days=1)).id == season_id
    assert calendar.window_on(SEASON, end).id != season_id


def test_quarter_boundary_instants(calendar):
    assert calendar.window_at(SEASON, _utc(2026, 12, 31, 23, 59, 59, 999999)).id == "season:2026-S4"
    assert calendar.window_at(SEASON, _utc(2027, 1, 1)).id == "season:2027-S1"
    assert calendar.window_at(SEASON, _utc(2026, 3, 31, 23, 59)).id == "season:2026-S1"
    assert calendar.window_at(SEASON, _utc(2026, 4, 1)).id == "season:2026-S2"


# -- explicit season calendars --------------------------------------------------------------


def test_explicit_season_ids_and_bounds(seasonal):
    alpha = seasonal.window("season:alpha")
    assert (alpha.start, alpha.end) == (_utc(2026, 1, 10), _utc(2026, 3, 1))
    assert seasonal.window_on(SEASON, date(2026, 2, 28)) == alpha
    assert seasonal.window_on(SEASON, date(2026, 3, 15)).id == "season:beta"
    assert [s.id for s in seasonal.seasons] == ["alpha", "beta"], "sorted by start"


@pytest.mark.parametrize("day", [
    date(2026, 3, 1),    # the day alpha ends (end is exclusive)
    date(2026, 3, 14),   # the last day of the gap
    date(2026, 1, 9),    # before the first season
    date(2026, 6, 1),    # after the last season
])
def test_days_outside_every_explicit_season_have_no_season_window(seasonal, day):
    assert seasonal.window_on(SEASON, day) is None
    assert seasonal.next_reset(SEASON, midnight(day)) is None
    with pytest.raises(WindowError, match="no season window is open"):
        seasonal.resolve(SEASON, midnight(day))
    # the other kinds do not care about seasons
    assert seasonal.window_on(DAILY, day).id == f"daily:{day.isoformat()}"


def test_overlapping_explicit_seasons_are_refused_naming_both():
    with pytest.raises(WindowError, match="overlap") as info:
        Calendar((Season("one", date(2026, 1, 1), date(2026, 3, 2)),
                  Season("two", date(2026, 3, 1), date(2026, 6, 1))))
    assert "one" in str(info.value)
    assert "two" in str(info.value)


def test_adjacent_explicit_seasons_are_fine():
    calendar = Calendar((Season("one", date(2026, 1, 1), date(2026, 3, 1)),
                         Season("two", date(2026, 3, 1), date(2026, 6, 1))))
    assert calendar.window_on(SEASON, date(2026, 2, 28)).id == "season:one"
    assert calendar.window_on(SEASON, date(2026, 3, 1)).id == "season:two"


def test_unknown_explicit_season_names_the_known_ones(seasonal):
    with pytest.raises(WindowError, match="'gamma'") as info:
        seasonal.window("season:gamma")
    assert "alpha, beta" in str(info.value)
    with pytest.raises(WindowError):
        seasonal.window("season:2026-S1")  # quarterly ids mean nothing to an explicit calendar


@given(seasons=explicit_seasons(), offset=st.integers(-40, 1500))
def test_explicit_seasons_round_trip_and_gaps(seasons, offset):
    calendar = Calendar(tuple(Season(s["id"], date.fromisoformat(s["start"]),
                                     date.fromisoformat(s["end"])) for s in seasons))
    day = date.fromisoformat(seasons[0]["start"]) + timedelta(days=offset)
    inside = [s for s in seasons
              if date.fromisoformat(s["start"]) <= day < date.fromisoformat(s["end"])]
    window = calendar.window_on(SEASON, day)
    if not inside:
        assert window is None
        return
    assert window.id == f"season:{inside[0]['id']}"
    assert calendar.window(window.id) == window
    bits = calendar.time_bits(SEASON)
    assert (window.end - window.start).total_seconds() <= 2**bits


# -- parsing ids -----------------------------------------------------------------------------


@given(day=dates(), kind=window_kinds())
def test_window_id_round_trip(calendar, day, kind):
    window = calendar.window_on(kind, day)
    if kind == ALL_TIME and day >= calendar.all_time_end:
        assert window is None, "the all-time window ends at all_time_end"
        return
    assert window is not None
    assert window.kind == kind
    assert calendar.window(window.id) == window
    assert calendar.resolve(window.id, _utc(2026, 12, 2)) == window, "ids ignore `now`"
    assert window.start.tzinfo == UTC
    assert window.start.time() == datetime.min.time()
    if kind == ALL_TIME:
        assert window.id == ALL_TIME
        assert window.end is None
        assert window.last_date is None
        assert window.contains(midnight(day)) == (day >= calendar.all_time_start)
        return
    assert window.contains(midnight(day))
    assert window.id.startswith(f"{kind}:")
    assert window.end.time() == datetime.min.time()
    assert window.start.date() <= day <= window.last_date
    assert calendar.window_on(kind, window.last_date) == window
    assert calendar.window_on(kind, window.end.date()).start == window.end, "no gaps"
    days = (window.end - window.start).days
    assert days in {DAILY: {1}, WEEKLY: {7}, MONTHLY: {28, 29, 30, 31},
                    SEASON: {90, 91, 92}}[kind]


@given(instant=instants(datetime(1970, 1, 1, tzinfo=UTC), datetime(2199, 12, 31, tzinfo=UTC)),
       kind=window_kinds())
def test_window_at_contains_the_instant(calendar, instant, kind):
    window = calendar.window_at(kind, instant)
    assert window.contains(instant)
    assert not window.contains(window.start - US)
    if window.end is not None:
        assert not window.contains(window.end)


@pytest.mark.parametrize("bad_id", [
    "daily:2026-13-01",
    "daily:2026-02-30",
    "daily:2026-04-31",
    "daily:20261201",        # basic ISO format: accepted by date.fromisoformat, not an id
    "daily:2026-12-1",
    "daily:",
    "daily",
    "daily:2026-12-01 ",
    "weekly:2026-49",
    "weekly:2026-W9",
    "weekly:2026-W049",
    "weekly:2026-12-01",
    "monthly:2026-13",
    "monthly:2026-00",
    "monthly:2026-1",
    "monthly:2026-12-01",
    "monthly:26-12",
    "season:2026-S0",
    "season:2026-S5",
    "season:2026-Q4",
    "season:26-S4",
    "season:",
])
def test_malformed_ids_raise_a_helpful_window_error(calendar, bad_id):
    with pytest.raises(WindowError) as info:
        calendar.window(bad_id)
    message = str(info.value)
    assert repr(bad_id) in message, "the message names the bad id"
    assert "daily:2026-12-01" in message, "and shows examples"
    assert "weekly:2026-W49" in message


@pytest.mark.parametrize("bad_id", ["", "yearly:2026", "Daily:2026-12-01", " daily:2026-12-01",
                                    "all-time:2026", "ALL-TIME", "alltime"])
def test_unknown_kinds_raise_naming_the_known_kinds(calendar, bad_id):
    with pytest.raises(WindowError) as info:
        calendar.window(bad_id)
    message = str(info.value)
    assert repr(bad_id) in message
    assert all(kind in message for kind in WINDOW_KINDS)


@pytest.mark.parametrize("method", ["window_on", "max_length_seconds", "time_bits"])
def test_unknown_kind_in_arithmetic_raises(calendar, method):
    args = ("hourly", date(2026, 12, 1)) if method == "window_on" else ("hourly",)
    with pytest.raises(WindowError, match="'hourly'"):
        getattr(calendar, method)(*args)


def test_all_time_window_starts_at_the_calendar_origin():
    calendar = Calendar(all_time_start=date(1870, 1, 1))
    window = calendar.window(ALL_TIME)
    assert window.start == _utc(1870, 1, 1)
    assert window.end is None
    assert window.contains(_utc(1870, 1, 1))
    assert not window.contains(_utc(1869, 12, 31, 23, 59, 59))
    assert calendar.window_on(ALL_TIME, date(1965, 6, 1)) == window
    assert calendar.window_on(ALL_TIME, date(2199, 12, 31)) == window
    assert calendar.window_on(ALL_TIME, ALL_TIME_END) is None, "past its default end"


def test_all_time_end_sizes_the_all_time_time_bits():
    """Regression (issue 11.3): all-time keys assumed 2^32 s since all_time_start, so with
    1870 every event after February 2006 spilled into the score bits. The bits now come from
    the window's real length, all_time_start to all_time_end."""
    calendar = Calendar(all_time_start=date(1870, 1, 1))
    length = (ALL_TIME_END - date(1870, 1, 1)).days * 86400
    assert calendar.max_length_seconds(ALL_TIME) == length
    bits = calendar.time_bits(ALL_TIME)
    assert 2 ** (bits - 1) < length <= 2**bits
    assert bits > 32
    assert calendar.time_bits(ALL_TIME, 1000) == math.ceil(math.log2(length * 1000))
    short = Calendar(all_time_start=date(2020, 1, 1), all_time_end=date(2030, 1, 1))
    assert short.time_bits(ALL_TIME) == math.ceil(math.log2(3653 * 86400)) == 29
    with pytest.raises(WindowError, match="must be after"):
        Calendar(all_time_start=date(2020, 1, 1), all_time_end=date(2020, 1, 1))


# Window ids are documented as YYYY-...: years below 1000 are zero-padded, and a window that
# would end past datetime.max (December 9999) is a WindowError, not an overflow.
@pytest.mark.parametrize("window_id", ["weekly:0001-W01", "monthly:0999-12", "season:0999-S4"])
def test_ids_of_years_below_1000_round_trip(calendar, window_id):
    assert calendar.window(window_id).id == window_id


@pytest.mark.parametrize("window_id", ["daily:9999-12-31", "monthly:9999-12", "season:9999-S4"])
def test_ids_in_december_9999_raise_window_error(calendar, window_id):
    with pytest.raises(WindowError, match=repr(window_id)):
        calendar.window(window_id)


# -- resolve and next_reset ----------------------------------------------------------------


@pytest.mark.parametrize(("now", "expected"), [
    (_utc(2026, 12, 31, 23, 59, 59, 999999),
     {DAILY: "daily:2026-12-31", WEEKLY: "weekly:2026-W53", MONTHLY: "monthly:2026-12",
      SEASON: "season:2026-S4", ALL_TIME: "all-time"}),
    (_utc(2027, 1, 1),
     {DAILY: "daily:2027-01-01", WEEKLY: "weekly:2026-W53", MONTHLY: "monthly:2027-01",
      SEASON: "season:2027-S1", ALL_TIME: "all-time"}),
    # an aware non-UTC clock is converted: 01:00+02:00 on Jan 1 is still Dec 31 in UTC
    (datetime(2027, 1, 1, 1, 0, tzinfo=timezone(timedelta(hours=2))),
     {DAILY: "daily:2026-12-31", WEEKLY: "weekly:2026-W53", MONTHLY: "monthly:2026-12",
      SEASON: "season:2026-S4", ALL_TIME: "all-time"}),
])
def test_resolve_kind_names_at_now(calendar, now, expected):
    assert {kind: calendar.resolve(kind, now).id for kind in WINDOW_KINDS} == expected


def test_resolve_full_ids_and_unknown_specs(calendar):
    now = _utc(2026, 12, 2, 12)
    assert calendar.resolve("weekly:2020-W53", now).start == _utc(2020, 12, 28)
    assert calendar.resolve("all-time", now).id == "all-time"
    with pytest.raises(WindowError, match="'hourly'"):
        calendar.resolve("hourly", now)


def test_naive_now_is_utc_whatever_the_process_timezone(calendar, monkeypatch):
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        # 23:00 naive = 23:00 UTC on Dec 1 (in New York local time it would be Dec 2, 04:00 UTC)
        assert calendar.resolve(DAILY, datetime(2026, 12, 1, 23, 0)).id == "daily:2026-12-01"
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize(("kind", "now", "reset"), [
    (DAILY, _utc(2026, 12, 1, 12), _utc(2026, 12, 2)),
    (DAILY, _utc(2026, 12, 1), _utc(2026, 12, 2)),                      # at the start
    (DAILY, _utc(2026, 12, 1, 23, 59, 59, 999999), _utc(2026, 12, 2)),
    (WEEKLY, _utc(2026, 12, 2, 12), _utc(2026, 12, 7)),                 # Wed -> next Monday
    (WEEKLY, _utc(2026, 12, 7), _utc(2026, 12, 14)),                    # Monday 00:00: new week
    (WEEKLY, _utc(2026, 12, 31), _utc(2027, 1, 4)),                     # week 53
    (MONTHLY, _utc(2028, 2, 29, 18), _utc(2028, 3, 1)),
    (MONTHLY, _utc(2026, 12, 15), _utc(2027, 1, 1)),
    (SEASON, _utc(2026, 11, 1), _utc(2027, 1, 1)),
    (SEASON, _utc(2026, 3, 31, 23), _utc(2026, 4, 1)),
    (ALL_TIME, _utc(2026, 12, 2), None),
])
def test_next_reset(calendar, kind, now, reset):
    assert calendar.next_reset(kind, now) == reset


def test_next_reset_of_an_explicit_season(seasonal):
    assert seasonal.next_reset(SEASON, _utc(2026, 2, 1)) == _utc(2026, 3, 1)
    assert seasonal.next_reset(SEASON, _utc(2026, 3, 10)) is None  # the gap


# -- the counting rule ---------------------------------------------------------------------


def test_ingested_exactly_at_end_plus_grace_counts_one_microsecond_later_does_not(calendar):
    window = calendar.window("daily:2026-12-01")
    event = _utc(2026, 12, 1, 10)
    deadline = _utc(2026, 12, 9)  # end (Dec 2) + 7 days
    assert window.counts(event, deadline, GRACE)
    assert not window.counts(event, deadline + US, GRACE)
    assert window.counts(event, _utc(2026, 12, 2), timedelta(0)), "zero grace: at end counts"
    assert not window.counts(event, _utc(2026, 12, 2) + US, timedelta(0))


def test_event_time_must_fall_in_the_window(calendar):
    window = calendar.window("daily:2026-12-01")
    ingested = _utc(2026, 12, 1, 12)
    assert window.counts(_utc(2026, 12, 1), ingested, GRACE), "start is inclusive"
    assert not window.counts(_utc(2026, 12, 2), ingested, GRACE), "end is exclusive"
    assert not window.counts(_utc(2026, 12, 1) - US, ingested, GRACE)


def test_all_time_always_counts(calendar):
    window = calendar.window(ALL_TIME)
    assert window.counts(_utc(1970, 1, 1), _utc(2200, 1, 1), timedelta(0))
    assert window.counts(_utc(2026, 12, 1), _utc(2126, 12, 1), GRACE)
    assert not window.counts(_utc(1969, 12, 31, 23), _utc(2026, 1, 1), GRACE), "before origin"


def test_counted_windows_at_the_year_end(calendar):
    event = _utc(2026, 12, 31, 12)

    def counted(ingested: datetime) -> list[str]:
        return [w.id for w in calendar.counted_windows(WINDOW_KINDS, event, ingested, GRACE)]

    # daily, monthly and season all end 2027-01-01 (deadline Jan 8); week 53 ends Jan 4 (Jan 11)
    everything = ["daily:2026-12-31", "weekly:2026-W53", "monthly:2026-12", "season:2026-S4",
                  "all-time"]
    assert counted(event) == everything
    assert counted(_utc(2027, 1, 8)) == everything
    assert counted(_utc(2027, 1, 8) + US) == ["weekly:2026-W53", "all-time"]
    assert counted(_utc(2027, 1, 11)) == ["weekly:2026-W53", "all-time"]
    assert counted(_utc(2027, 1, 11) + US) == ["all-time"]
    assert calendar.counted_windows((DAILY,), event, _utc(2030, 1, 1), GRACE) == []


def test_counted_windows_skip_the_season_gap(seasonal):
    ids = [w.id for w in seasonal.counted_windows((DAILY, SEASON), _utc(2026, 3, 5),
                                                  _utc(2026, 3, 5), GRACE)]
    assert ids == ["daily:2026-03-05"]


@given(event=instants(), delay=st.timedeltas(timedelta(0), timedelta(days=200)),
       extra=st.timedeltas(timedelta(0), timedelta(days=30)),
       grace=st.sampled_from([timedelta(0), timedelta(hours=1), GRACE]))
def test_counting_is_monotone_in_ingest_time(calendar, event, delay, extra, grace):
    """Ingesting later can only drop windows, never add them; all-time never drops."""
    early = calendar.counted_windows(WINDOW_KINDS, event, event + delay, grace)
    late = calendar.counted_windows(WINDOW_KINDS, event, event + delay + extra, grace)
    assert set(late) <= set(early)
    assert calendar.window(ALL_TIME) in late
    for window in early:
        assert window.contains(event)
        assert window.end is None or event + delay <= window.end + grace


# -- windows_between -----------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "first", "last", "ids"), [
    (DAILY, date(2026, 12, 30), date(2027, 1, 2),
     ["daily:2026-12-30", "daily:2026-12-31", "daily:2027-01-01", "daily:2027-01-02"]),
    (WEEKLY, date(2026, 12, 1), date(2027, 1, 4),
     ["weekly:2026-W49", "weekly:2026-W50", "weekly:2026-W51", "weekly:2026-W52",
      "weekly:2026-W53", "weekly:2027-W01"]),
    (MONTHLY, date(2026, 11, 30), date(2027, 2, 1),
     ["monthly:2026-11", "monthly:2026-12", "monthly:2027-01", "monthly:2027-02"]),
    (SEASON, date(2026, 1, 1), date(2026, 12, 31),
     ["season:2026-S1", "season:2026-S2", "season:2026-S3", "season:2026-S4"]),
    (ALL_TIME, date(2000, 1, 1), date(2026, 12, 31), ["all-time"]),
    (DAILY, date(2026, 12, 2), date(2026, 12, 1), []),
    (MONTHLY, date(2026, 12, 31), date(2026, 12, 31), ["monthly:2026-12"]),
])
def test_windows_between(calendar, kind, first, last, ids):
    assert [w.id for w in calendar.windows_between(kind, first, last)] == ids


def test_windows_between_skips_season_gaps(seasonal):
    ids = [w.id for w in seasonal.windows_between(SEASON, date(2025, 12, 1), date(2026, 12, 31))]
    assert ids == ["season:alpha", "season:beta"]


@given(first=dates(date(1990, 1, 1), date(2100, 1, 1)), length=st.integers(0, 800),
       kind=st.sampled_from([DAILY, WEEKLY, MONTHLY, SEASON]))
def test_windows_between_tile_the_range(calendar, first, length, kind):
    last = first + timedelta(days=length)
    windows = calendar.windows_between(kind, first, last)
    assert windows[0].contains(midnight(first))
    assert windows[-1].contains(midnight(last))
    for before, after in itertools.pairwise(windows):
        assert before.end == after.start
    assert len({w.id for w in windows}) == len(windows)


# -- time bits -----------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "bits"), [
    (DAILY, 17),     # 86_400 s < 2^17
    (WEEKLY, 20),    # 604_800 s < 2^20
    (MONTHLY, 22),   # 31 days = 2_678_400 s < 2^22
    (SEASON, 23),    # 92 days = 7_948_800 s < 2^23
    (ALL_TIME, 33),  # 1970-01-01 to 2200-01-01: 7.26e9 s < 2^33
])
def test_time_bits_per_kind(calendar, kind, bits):
    assert calendar.time_bits(kind) == bits
    length = calendar.max_length_seconds(kind)
    assert 2 ** (bits - 1) < length <= 2**bits, "the smallest power of two that holds it"


def test_time_bits_of_explicit_seasons_follow_the_longest_season():
    calendar = Calendar((Season("short", date(2026, 1, 1), date(2026, 1, 2)),
                         Season("long", date(2026, 2, 1), date(2026, 8, 20))))  # 200 days
    assert calendar.max_length_seconds(SEASON) == 200 * 86400
    assert calendar.time_bits(SEASON) == math.ceil(math.log2(200 * 86400)) == 25


@given(day=dates(date(1970, 1, 1), date(2199, 12, 31)), kind=window_kinds())
def test_every_second_of_a_window_fits_its_time_bits(calendar, day, kind):
    window = calendar.window_on(kind, day)
    end = window.end if window.end is not None else datetime.combine(
        calendar.all_time_end, datetime.min.time(), UTC)
    last_offset = int((end - window.start).total_seconds()) - 1
    assert 0 <= last_offset < 2 ** calendar.time_bits(kind)
    assert last_offset < calendar.max_length_seconds(kind)
