"""What "the top x%" of a board means, for every reader of it (the percentiles route, the
CLI's chart): the score at ordinal position ceil(x/100 * total) of the board's order, best
first (the highest score of a `desc` board, the lowest of an `asc` one), so a score someone
holds; and when a score axis is drawn logarithmic.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal, InvalidOperation

__all__ = ["heavy_tail", "position_for", "scores_at", "top_percent"]


def top_percent(value: float | str) -> Decimal:
    """A top-x% as an exact decimal in (0, 100] (so 0.1 % of 1000 players is 1, not 2)."""
    try:
        exact = Decimal(str(value))
    except InvalidOperation:
        raise ValueError(f"top percent {value!r} is not a number; give one in (0, 100]"
                         ) from None
    if not exact.is_finite() or not 0 < exact <= 100:
        raise ValueError(f"top percent {value} is outside (0, 100]; e.g. 1 for the top 1%")
    return exact


def position_for(percent: Decimal, total: int) -> int:
    """ceil(percent / 100 * total): the position whose score makes the top `percent`."""
    scaled = percent * total / 100
    whole = int(scaled)
    return whole + (1 if scaled > whole else 0)


def scores_at(ordered: Sequence[int], percents: Sequence[Decimal]) -> list[int]:
    """The score that makes each top percent of a board whose scores are `ordered` best
    first (a batch version's standings by rank): the one at `position_for`. An empty board
    has no such score: ValueError."""
    if not ordered:
        raise ValueError("an empty board has no top-percent scores")
    return [ordered[position_for(p, len(ordered)) - 1] for p in percents]


def heavy_tail(lo: float, hi: float, median: float) -> bool:
    """Whether a score axis is drawn logarithmic (of score + 1), given the least and the
    greatest of the top 1%, 2%, ..., 100% scores and the top 50% one: when none is negative
    and the greatest is 10x the median or more (a linear axis then puts nearly every player
    in its first few pixels). The console's charts apply the same rule to the same scores
    (app/console/static/console.js)."""
    return lo >= 0 and hi >= 10 * max(1, median)
