"""The sort-key codec: one exact integer per (player, board-window), higher ranks first.

`shared` ties: the key is the score (negated for `asc` boards). `earliest` ties: the key packs
score and time, `s * 2^b + (2^b - 1 - t)`, with t the whole seconds since the window start,
so that among equal scores whoever reached it first has the larger key. Every key is an exact
integer of magnitude below 2^53, so a Redis double holds it exactly; anything else is refused.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = [
    "MAX_EXACT",
    "SortKeyOverflow",
    "decode",
    "encode",
    "encode_array",
    "max_abs_score",
]

MAX_EXACT = 2**53 - 1


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
