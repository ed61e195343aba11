"""Epoch microseconds, written once for every layer (it was copied into seven modules)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from leaderboard.timeutil import EPOCH, duration_us, epoch_us, from_epoch_us


def test_known_values():
    assert epoch_us(EPOCH) == 0
    assert epoch_us(datetime(2026, 12, 1, tzinfo=UTC)) == 1_796_083_200_000_000
    assert epoch_us(datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)) == -1
    assert duration_us(timedelta(days=7)) == 7 * 86_400 * 1_000_000


def test_naive_means_utc_and_offsets_are_converted():
    aware = datetime(2026, 12, 1, 12, tzinfo=UTC)
    assert epoch_us(aware.replace(tzinfo=None)) == epoch_us(aware)
    assert epoch_us(datetime(2026, 12, 1, 13, tzinfo=timezone(timedelta(hours=1)))) == \
        epoch_us(aware)


@given(st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30),
                    timezones=st.just(UTC)))
def test_round_trip_is_exact_over_the_whole_range(instant):
    """Integer arithmetic only: a float of seconds would lose microseconds past 2**53."""
    assert from_epoch_us(epoch_us(instant)) == instant
