"""The lateness bits of a rollup row's mask: which (window kind, grace) its events count for.

The batch rolls events up per (player, event date, region, mode, mask), bit j of the mask
set iff the row's events count for windows of bit j's kind under its grace; the speed layer
reads the same rows back when it recomputes a player's base part after retention. One
numbering, so both read a mask alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from leaderboard.calendar import ALL_TIME, WINDOW_KINDS
from leaderboard.registry import Registry
from leaderboard.timeutil import duration_us

__all__ = ["LatenessBit", "lateness_bits"]


@dataclass(frozen=True)
class LatenessBit:
    """Bit `bit` of a rollup row's mask: its events count for windows of `kind` under `grace`."""

    bit: int
    kind: str
    grace_us: int


def lateness_bits(registry: Registry) -> list[LatenessBit]:
    """One bit per distinct (window kind, grace) of the registry; all-time needs none."""
    pairs = sorted({(kind, duration_us(board.grace))
                    for board in registry.boards for kind in board.windows if kind != ALL_TIME},
                   key=lambda p: (WINDOW_KINDS.index(p[0]), p[1]))
    if len(pairs) > 62:
        raise ValueError("more than 62 distinct (window, grace) pairs; simplify the registry")
    return [LatenessBit(i, kind, grace) for i, (kind, grace) in enumerate(pairs)]
