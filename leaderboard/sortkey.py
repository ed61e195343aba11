"""The sort-key codec: one exact integer per (player, board-window), higher ranks first.

`shared` ties: the key is the score (negated for `asc` boards). `earliest` ties: the key packs
score and time, `s * 2^b + (2^b - 1 - t)`, with t the time since the window start in the
layout's unit (microseconds, milliseconds or seconds: the finest the board's bounds leave room
for, see `choose_layout`), so that among equal scores whoever reached it first has the larger
key; the same instant (in that unit) ties, and listings order ties by player_id ascending.
Every key is an exact integer of magnitude below 2^53, so a Redis double holds it exactly;
the registry is refused at load when a board's bounds and windows cannot promise that, and a
`sum` total that would outgrow it saturates at the limit (`saturate`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "MAX_EXACT",
    "MIXED_SUM_HEADROOM",
    "SUM_HEADROOM",
    "UNITS_US",
    "KeyLayout",
    "SortKeyOverflow",
    "choose_layout",
    "decode",
    "encode",
    "encode_array",
    "max_abs_score",
    "saturate",
]

MAX_EXACT = 2**53 - 1
#: Time units an `earliest` key may count in, finest first: 1 us, 1 ms, 1 s.
UNITS_US = (1, 1_000, 1_000_000)
#: A `sum` board uses a finer time unit only if its key still holds this many events at its
#: largest |points| before the total saturates (see `choose_layout`).
SUM_HEADROOM = 2**20
#: A `sum` board whose points may be of either sign must hold this many events at its
#: largest |points|, or the registry is refused (see `choose_layout`).
MIXED_SUM_HEADROOM = 2**16


class SortKeyOverflow(ValueError):
    """A score (or time) that does not fit the exact range of a sort key."""


def max_abs_score(ties: str, time_bits: int) -> int:
    """The largest |score| a board-window of this policy can encode exactly."""
    if ties == "shared":
        return MAX_EXACT
    return int(2 ** (53 - time_bits)) - 1


def _signed(score: int, order: str) -> int:
    return score if order == "desc" else -score


def encode(score: int, *, order: str, ties: str, t: int = 0, time_bits: int = 0) -> int:
    """Sort key of one entry; `t` is whole seconds since the window start (earliest only)."""
    signed = _signed(int(score), order)
    limit = max_abs_score(ties, time_bits)
    if abs(signed) > limit:
        raise SortKeyOverflow(
            f"score {score} does not fit an exact sort key (|score| <= {limit} with ties={ties}"
            f" and {time_bits} time bits); lower the board's points bounds or use ties=shared"
        )
    if ties == "shared":
        return signed
    span = 1 << time_bits
    if not 0 <= t < span:
        raise SortKeyOverflow(
            f"time offset {t}s is outside the window's {time_bits}-bit range [0, {span})"
        )
    return signed * span + (span - 1 - int(t))


def decode(key: int, *, order: str, ties: str, time_bits: int = 0) -> tuple[int, int]:
    """Inverse of encode: (score, t). `t` is 0 under shared ties."""
    key = int(key)
    if ties == "shared":
        return _signed(key, order), 0
    span = 1 << time_bits
    signed, low = divmod(key, span)
    return _signed(signed, order), span - 1 - low


def encode_array(
    scores: npt.ArrayLike,
    *,
    order: str,
    ties: str,
    t: npt.ArrayLike | None = None,
    time_bits: int = 0,
) -> npt.NDArray[np.int64]:
    """Vectorised encode over int64 arrays; raises SortKeyOverflow naming the worst score."""
    values = np.asarray(scores, dtype=np.int64)
    signed = values if order == "desc" else -values
    limit = max_abs_score(ties, time_bits)
    if signed.size and int(np.abs(signed).max()) > limit:
        worst = int(values[np.argmax(np.abs(signed))])
        raise SortKeyOverflow(
            f"score {worst} does not fit an exact sort key (|score| <= {limit} with ties={ties}"
            f" and {time_bits} time bits); lower the board's points bounds or use ties=shared"
        )
    if ties == "shared":
        return signed.astype(np.int64, copy=True)
    offsets = np.asarray(t, dtype=np.int64)
    span = 1 << time_bits
    if offsets.size and (int(offsets.min()) < 0 or int(offsets.max()) >= span):
        raise SortKeyOverflow(f"time offsets outside the window's {time_bits}-bit range")
    return signed * span + (span - 1 - offsets)


@dataclass(frozen=True)
class KeyLayout:
    """How one board-window's keys are built: time bits and unit (earliest ties; 0 and 0
    under shared ties) and `limit`, the largest |score| a key holds exactly."""

    time_bits: int
    unit_us: int
    limit: int


def choose_layout(*, ties: str, aggregation: str, min_points: int, max_points: int,
                  bits_for_unit: dict[int, int]) -> KeyLayout:
    """The key layout of one board-window, or ValueError saying why none fits.

    Shared ties: no time bits, limit 2^53 - 1. Earliest ties: the finest unit of UNITS_US
    whose limit holds the board's largest |points| -- times SUM_HEADROOM on a `sum` board, so
    that the finer unit is not bought with totals that saturate after a few events; if no
    unit leaves that headroom, whole seconds. `bits_for_unit` maps a unit to the bits the
    window's longest offset needs in it.

    Every single event must fit exactly. A `sum` total saturates at the limit; that is
    independent of arrival order only when every event has the same sign, so a `sum` board
    whose bounds allow both signs must leave MIXED_SUM_HEADROOM events of room at the largest
    |points| (its total saturates only after 65,536 extreme events of one player in one
    window; docs/architecture.md says what then).
    """
    worst = max(abs(min_points), abs(max_points))
    mixed = aggregation == "sum" and min_points < 0 < max_points
    need = max(worst, worst * SUM_HEADROOM - 1) if aggregation == "sum" else worst
    if ties == "shared":
        layout = KeyLayout(0, 0, MAX_EXACT)
    else:
        layouts = [KeyLayout(bits_for_unit[u], u, max_abs_score("earliest", bits_for_unit[u]))
                   for u in UNITS_US if bits_for_unit[u] < 53]
        if not layouts:
            raise ValueError("the window is too long for any time unit of an earliest key")
        layout = next((x for x in layouts if x.limit >= need), layouts[-1])
    if worst > layout.limit:
        raise ValueError(f"allows |points| up to {worst}, but an exact key holds |score| <= "
                         f"{layout.limit}")
    if mixed and worst * MIXED_SUM_HEADROOM > layout.limit + 1:
        raise ValueError(
            f"sums points of both signs up to |{worst}|, which leaves room for fewer than "
            f"{MIXED_SUM_HEADROOM} such events below the exact limit {layout.limit} (a "
            "saturated total of mixed signs would depend on arrival order)")
    return layout


def saturate(total: int, limit: int) -> int:
    """A `sum` total clamped to [-limit, limit]: what a board-window's score is."""
    return max(-limit, min(limit, total))
