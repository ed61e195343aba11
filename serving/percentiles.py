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
   `FANOUT` + 1 ways per round trip (all targets' probes counted by one script call).
2. No base key lies strictly between b_j and the base key listed just above it, and T's
   keys are base keys, so over that gap f(k) = C + count_M(>= k) with
   C = j - count_T(> b_j). The answer is the (r - C)-th largest M key if it is greater
   than b_j, else b_j itself: one more script call for every target.

So there is no "large board" approximation: the base keys are in memory (docs/design.md section 6
allows one equal-depth bucket of error on large boards; this error is zero), and a query
costs 2 + ceil(log_{FANOUT+1}(|M| + |T| + 1)) round trips whatever the board's size.
Rounds are separate reads: a fold landing between them can make the answer a concurrent
mix, never a key nobody held at some point of the read.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal

import numpy as np
import numpy.typing as npt

from leaderboard.percentile import position_for
from serving.merge import MergedBoard, registered_script

__all__ = ["COUNT_SCRIPT", "FANOUT", "GAP_SCRIPT", "keys_at"]

#: Probes per target per round trip: the search window shrinks FANOUT + 1 times a round.
FANOUT = 8

#: count_T(>= k) and count_M(>= k) for every k of ARGV[1] (comma-separated), as one
#: comma-separated string: thousands of probes cost one argument and one reply, not thousands
#: of each through the client. KEYS: T, M.
COUNT_SCRIPT = """
local out = {}
for k in string.gmatch(ARGV[1], '[^,]+') do
  out[#out + 1] = redis.call('ZCOUNT', KEYS[1], k, '+inf')
  out[#out + 1] = redis.call('ZCOUNT', KEYS[2], k, '+inf')
end
return table.concat(out, ',')
"""

#: Step 2 for each (b_j or '' past the base's end, j, r) in ARGV: the M key at descending
#: position r - (j - count_T(> b_j)), or '' when M has none there. KEYS: T, M.
GAP_SCRIPT = """
local out = {}
for i = 1, #ARGV, 3 do
  local v, j, r = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local above
  if v == '' then above = redis.call('ZCARD', KEYS[1])
  else above = redis.call('ZCOUNT', KEYS[1], '(' .. v, '+inf') end
  local at = math.max(r - (j - above), 1) - 1
  local got = redis.call('ZREVRANGE', KEYS[2], at, at, 'WITHSCORES')
  out[#out + 1] = got[2] or ''
end
return out
"""

def keys_at(board: MergedBoard, positions: Sequence[int | Decimal]
            ) -> tuple[int, list[int | None]]:
    """(the merged total, the merged key at each position). A position is an int (1-based)
    or a top percent (`Decimal`, resolved against the total read in the same call); positions
    outside [1, total] answer None."""
    pipe = board.client.pipeline(transaction=False)
    pipe.zcard(board.keys.touched)
    pipe.zcard(board.keys.merged)
    touched_size, merged_size = (int(v) for v in pipe.execute())
    total = board.base.size - touched_size + merged_size
    wanted = [position_for(p, total) if isinstance(p, Decimal) else int(p) for p in positions]
    targets = np.array(sorted({r for r in wanted if 1 <= r <= total}), dtype=np.int64)
    found = _search(board, targets, touched_size, merged_size)
    return total, [found.get(r) for r in wanted]


def _run_starts(board: MergedBoard, q: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """For each q: the first listing position whose count_B(>= key) is at least q."""
    negated = board.base.negated
    size = len(negated)
    if size == 0:
        return np.zeros(len(q), dtype=np.int64)
    inside = np.clip(q - 1, 0, size - 1)
    starts = np.searchsorted(negated, negated[inside], side="left").astype(np.int64)
    return np.where(q <= 1, 0, np.where(q > size, size, starts))


def _search(board: MergedBoard, targets: npt.NDArray[np.int64], touched_size: int,
            merged_size: int) -> dict[int, int | None]:
    if len(targets) == 0:
        return {}
    negated = board.base.negated
    lo = _run_starts(board, targets - merged_size)
    hi = _run_starts(board, targets + touched_size)
    count = registered_script(board.client, COUNT_SCRIPT)
    steps = np.arange(1, FANOUT + 1, dtype=np.int64)
    while True:
        active = np.flatnonzero(lo < hi)
        if len(active) == 0:
            break
        a_lo, a_hi = lo[active], hi[active]
        probes = a_lo[:, None] + (a_hi - a_lo)[:, None] * steps // (FANOUT + 1)
        probes = np.clip(probes, a_lo[:, None], a_hi[:, None] - 1)
        keys = -negated[probes]  # (targets, FANOUT)
        unique, where = np.unique(keys, return_inverse=True)
        reply = count(keys=[board.keys.touched, board.keys.merged],
                      args=[",".join(map(str, unique.tolist()))])
        replies = np.array((reply.decode() if isinstance(reply, bytes) else str(reply)
                            ).split(","), dtype=np.int64)
        at_least = (np.searchsorted(negated, -unique, side="right")
                    - replies[0::2] + replies[1::2])
        reached = at_least[where.reshape(keys.shape)] >= targets[active][:, None]
        run_start = np.searchsorted(negated, -keys, side="left")
        run_end = np.searchsorted(negated, -keys, side="right")
        lo[active] = np.maximum(a_lo, np.where(reached, a_lo[:, None], run_end).max(axis=1))
        hi[active] = np.minimum(a_hi, np.where(reached, run_start, a_hi[:, None]).min(axis=1))
        lo = np.minimum(lo, hi)
    return _finish(board, targets, hi)


def _finish(board: MergedBoard, targets: npt.NDArray[np.int64], starts: npt.NDArray[np.int64]
            ) -> dict[int, int | None]:
    """Step 2: the base key at j, or the M key in the gap above it."""
    base = board.base
    args: list[int | str] = []
    for r, j in zip(targets.tolist(), starts.tolist(), strict=True):
        args += [base.key_at(j) if j < base.size else "", j, r]
    replies = registered_script(board.client, GAP_SCRIPT)(
        keys=[board.keys.touched, board.keys.merged], args=args)
    found: dict[int, int | None] = {}
    for r, j, reply in zip(targets.tolist(), starts.tolist(), replies, strict=True):
        text = reply.decode() if isinstance(reply, bytes) else str(reply)
        speed = int(float(text)) if text else None
        held = base.key_at(j) if j < base.size else None
        found[r] = held if speed is None or (held is not None and speed <= held) else speed
    return found
