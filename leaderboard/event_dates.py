"""The event dates a lake counts: its landed files' and a version's rollups'.

The nightly batch's calendar must reach every one of them (else a rollup drops events and the
version fails its count check), and a registry rebind must keep them inside the calendar
(else no night can publish): both ask this one question, of the same two sources. Landed
files are read by their Parquet statistics (no rows read); the rollups hold every absorbed
event's date for good, also after retention deleted its raw events.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, date, datetime
from pathlib import Path

from leaderboard.lake import LandedFile, stamp_range
from leaderboard.manifest import Manifest

__all__ = ["event_date_range"]


def event_date_range(lake: Path, files: Iterable[LandedFile], version: Manifest | None
                     ) -> tuple[date, date] | None:
    """The earliest and latest event dates of `files` and of `version`'s rollups (None: no
    event at all). A file without statistics may hold anything: its range is unbounded."""
    low, high = datetime.max.replace(tzinfo=UTC).date(), datetime.min.replace(tzinfo=UTC).date()
    for landed in files:
        first, last = stamp_range(landed.path, "event_time")
        if first <= last:
            low, high = min(low, first.date()), max(high, last.date())
    if version is not None:
        for day in version.rollups(lake):
            rolled = date.fromisoformat(day)
            low, high = min(low, rolled), max(high, rolled)
    return None if low > high else (low, high)
