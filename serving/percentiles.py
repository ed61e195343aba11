"""Scores for a top-x% of the merged board (docs/design.md section 6), exact at every size.

    top_score(y) = the key at ordinal position r = ceil(y/100 * total) of the merged order

The merged order is base B without the touched players T, plus their merged keys M. Its
count of keys >= k is

    f(k) = count_B(>= k) - count_T(>= k) + count_M(>= k)

(B in memory, a binary search; T and M two ZCOUNTs), and the key at position r is the
largest k with f(k) >= r: always a key someone holds. It is found in two steps, exactly:

1. Over the base's listing positions i (keys b_i, descending), the smallest j with
   f(b_j) >= r. f is monotone in i, and since -|T| <= f(k) - count_B(>= k) <= |M| the
   search starts within a window of about |M| + |T| positions around r, then narrows it
   `FANOUT` + 1 ways per round trip (all targets' probes in one pipeline).
2. No base key lies strictly between b_j and the base key listed just above it, and T's
   keys are base keys, so over that gap f(k) = C + count_M(>= k) with
   C = j - count_T(> b_j). The answer is the (r - C)-th largest M key if it is greater
   than b_j, else b_j itself: one ZCOUNT, then one ZREVRANGE.

So there is no "large board" approximation: the base keys are in memory (docs/design.md section 6
allows one equal-depth bucket of error on large boards; this error is zero), and a query
costs 3 + ceil(log_{FANOUT+1}(|M| + |T| + 1)) round trips whatever the board's size.
Rounds are separate reads: a fold landing between them can make the answer a concurrent
mix, never a key nobody held at some point of the read.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal, InvalidOperation

from serving.merge import MergedBoard

__all__ = ["FANOUT", "keys_at", "position_for", "top_percent"]

#: Probes per target per round trip: the search window shrinks FANOUT + 1 times a round.
FANOUT = 16


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


def keys_at(board: MergedBoard, positions: Sequence[int | Decimal]) -> tuple[int, list[int | None]]:
    """(the merged total, the merged key at each position). A position is an int (1-based)
    or a top percent (`Decimal`, resolved against the total read in the same call); positions
    outside [1, total] answer None."""
    pipe = board.client.pipeline(transaction=False)
    pipe.zcard(board.keys.touched)
    pipe.zcard(board.keys.merged)
    touched_size, merged_size = (int(v) for v in pipe.execute())
    base = board.base
    total = base.size - touched_size + merged_size
    wanted = [position_for(p, total) if isinstance(p, Decimal) else int(p) for p in positions]
    live = [r for r in wanted if 1 <= r <= total]
    found = _search(board, sorted(set(live)), touched_size, merged_size)
    return total, [found.get(r) for r in wanted]


def _run_start(board: MergedBoard, q: int) -> int:
    """The first listing position whose count_B(>= key) is at least q."""
    base = board.base
    if q <= 1:
        return 0
    if q > base.size:
        return base.size
    return base.count_above(base.key_at(q - 1))


def _search(board: MergedBoard, targets: list[int], touched_size: int, merged_size: int
            ) -> dict[int, int | None]:
    if not targets:
        return {}
    base = board.base
    bounds = {r: [_run_start(board, r - merged_size), _run_start(board, r + touched_size)]
              for r in targets}
    while True:
        probes: dict[int, list[int]] = {}
        for r, (lo, hi) in bounds.items():
            if lo < hi:
                width = hi - lo
                step = [lo + width * k // (FANOUT + 1) for k in range(1, FANOUT + 1)]
                probes[r] = sorted({p for p in step if lo <= p < hi} or {lo})
        if not probes:
            break
        keys = sorted({base.key_at(p) for ps in probes.values() for p in ps})
        pipe = board.client.pipeline(transaction=False)
        for key in keys:
            pipe.zcount(board.keys.touched, key, "+inf")
            pipe.zcount(board.keys.merged, key, "+inf")
        counts = pipe.execute()
        at_least = {key: base.count_at_least(key) - int(counts[2 * i]) + int(counts[2 * i + 1])
                    for i, key in enumerate(keys)}
        for r, ps in probes.items():
            span = bounds[r]
            for p in ps:
                key = base.key_at(p)
                if at_least[key] >= r:
                    span[1] = min(span[1], base.count_above(key))
                else:
                    span[0] = max(span[0], base.count_at_least(key))
            span[0] = min(span[0], span[1])
    return _finish(board, {r: span[0] for r, span in bounds.items()}, touched_size)


def _finish(board: MergedBoard, starts: dict[int, int], touched_size: int
            ) -> dict[int, int | None]:
    """Step 2: the base key at j, or the M key in the gap above it."""
    base = board.base
    pipe = board.client.pipeline(transaction=False)
    inside = [r for r, j in starts.items() if j < base.size]
    for r in inside:
        pipe.zcount(board.keys.touched, f"({base.key_at(starts[r])}", "+inf")
    above = dict(zip(inside, (int(c) for c in pipe.execute()), strict=True))
    pipe = board.client.pipeline(transaction=False)
    ordered = list(starts)
    for r in ordered:
        j = starts[r]
        before = j - above[r] if r in above else base.size - touched_size
        at = max(r - before, 1) - 1
        pipe.zrevrange(board.keys.merged, at, at, withscores=True)
    found: dict[int, int | None] = {}
    for r, reply in zip(ordered, pipe.execute(), strict=True):
        speed = int(reply[0][1]) if reply else None
        j = starts[r]
        held = base.key_at(j) if j < base.size else None
        if speed is None or (held is not None and speed <= held):
            found[r] = held
        else:
            found[r] = speed
    return found
