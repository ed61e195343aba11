"""The read-ahead thread (leaderboard.read_ahead) on plain generators; the batch's use of it
on Arrow streams is tested in tests/jobs/test_rank_stream.py."""

from __future__ import annotations

import threading
from collections.abc import Generator

import pytest

from leaderboard.read_ahead import read_ahead


def _alive(name: str) -> bool:
    return any(t.name == name for t in threading.enumerate())


def test_items_come_in_order_and_the_error_after_the_items_before_it() -> None:
    def source() -> Generator[int, None, None]:
        yield from range(7)
        raise KeyError("the source failed")

    seen: list[int] = []
    with pytest.raises(KeyError, match="the source failed"):
        seen.extend(read_ahead(source(), name="ra-order", depth=2).items)
    assert seen == list(range(7))
    assert not _alive("ra-order")


def test_a_consumer_that_stops_early_ends_the_producer_and_closes_its_source() -> None:
    """The producer must not go on running its source once nobody reads: `stop` (or closing
    the items) ends it at its next item, and the source's own cleanup runs."""
    closed = threading.Event()

    def source() -> Generator[int, None, None]:
        try:
            yield from range(10_000)
        finally:
            closed.set()

    ahead = read_ahead(source(), name="ra-stop", depth=3)
    assert next(ahead.items) == 0
    ahead.stop()
    assert not _alive("ra-stop")
    assert closed.is_set()
    ahead.items.close()  # after stop: harmless
    ahead.stop()
