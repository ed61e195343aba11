"""The fold: landed micro-batches into the version-scoped Redis state, exactly once.

A landed file is aggregated client-side per (board-window, player) with the counting rule,
then each board-window gets one script call (pipelined) that applies its updates, the first
touch of a player starting from the base key (recorded in `T`), and advances that
board-window's checkpoint for the writer -- unless the checkpoint already covers the file. A
crash anywhere is repaired by folding again every file past the version's progress mark:
each board-window skips what it already has, so each file counts exactly once everywhere.

Speed: a board-window's updates travel as two text arguments (one line per field, built with
Arrow kernels), not as one argument per field, so neither side spends per-field work in
Python; the script parses them with `string.gmatch`. `sum` boards with shared ties (the
default registry) take a fast path of one ZINCRBY per update (`ZADD XX INCR` for a player the
base version has; on its first touch, when that finds nothing, the base key goes into `T` and
`M`); the banned-set check is skipped while that set is empty.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import redis
from redis.exceptions import NoScriptError

from leaderboard import faults
from leaderboard.batch_view import BatchView
from leaderboard.calendar import Calendar, Window
from leaderboard.lake import LandedFile, landed_files, stamp_range
from leaderboard.lua import BYTES_AFTER
from leaderboard.manifest import read_version
from leaderboard.registry import Board, Registry
from leaderboard.speed_keys import (
    BANNED,
    BANS_GENERATION,
    CURRENT,
    VOIDS,
    BoardWindowKeys,
    SpeedVersion,
    StateLost,
    progress_key,
    windows_key,
)
from leaderboard.timeutil import duration_us, epoch_us
from leaderboard.voids import VoidIndex
from speed_layer.dedupe import Counted, ingest_order, match_ids

__all__ = ["FOLD_SCRIPT", "KEPT_BASES", "PROGRESS_SCRIPT", "BaseKeys", "Call", "Folder", "Progress",
           "ScriptPipeline", "Update", "mark_time", "plan_updates",
           "predecessors", "value_fields"]

_US_PER_DAY = 86_400_000_000

#: KEYS: M, T, C, L, B. ARGV: writer, seq, mode, aggregation, sign, earliest (0|1),
#: 2^time_bits, based rows, plain rows, the writer's floor, mixed-sign sum (0|1). A row is
#: its fields, each followed by '\n' (player and match ids never hold a control character).
#: Plain row: player, values; based row (the player has a base key in this version): player,
#: base key, base mark (`last` only) or exact base total (a mixed-sign sum, see below: the
#: batch's total where the key is at the limit, else ''), values.
#: Values (see `value_fields`): sum with shared ties: sort-key delta (points delta times the
#: sign, so the script hands the text to ZINCRBY as is); sum with earliest ties:
#: delta, t of the latest event; max|min: best points, its t; last: points, event time (us,
#: as 20 characters that order as bytes like the numbers, see `mark_time`), match_id, t;
#: the later of two is the greater (time, match_id), both compared as bytes (`bytes_after`:
#: the batch's order, whatever the server's collation).
#: t counts the board-window's time unit (registry.layout). A sum saturates at the key's
#: exact limit (+-(2^53 - 1), or 2^53 / 2^time_bits - 1 with earliest ties), as in the batch:
#: the score is the exact total, clamped once. ARGV[11] '1' marks a board whose points may
#: be of either sign: its lines are exact per-file totals, and a player whose total left the
#: key's range keeps the exact total in L (unused by sum boards) while M holds it clamped, so
#: a total that comes back below the limit is the batch's (one sign: clamping after each
#: add already is, and the fast path stays).
FOLD_SCRIPT = BYTES_AFTER + """
-- C holds, per writer, the seqs this board-window folded past the writer's floor (ARGV[10]:
-- every file of the writer up to it is folded everywhere), as text 's,s,...'.
-- C's own `floor:<writer>` is the floor it last trimmed to (a caller's floor may be older).
local seq, floor = tonumber(ARGV[2]), tonumber(ARGV[10])
local trimmed = tonumber(redis.call('HGET', KEYS[3], 'floor:' .. ARGV[1]) or '-1')
if trimmed > floor then floor = trimmed end
local done = redis.call('HGET', KEYS[3], ARGV[1]) or ''
local covered = seq <= floor
if not covered then
  for x in string.gmatch(done, '%d+') do
    if tonumber(x) == seq then covered = true break end
  end
end
-- fold: apply a file once. replay (unban): re-apply one player's events of a file this
-- board-window has already folded; files not yet folded here will be folded normally.
if ARGV[3] == 'fold' and covered then return 0 end
if ARGV[3] == 'replay' and not covered then return 0 end
local agg, sign, earliest, span = ARGV[4], tonumber(ARGV[5]), ARGV[6] == '1', tonumber(ARGV[7])
local M, T, L, B = KEYS[1], KEYS[2], KEYS[4], KEYS[5]
local guard = redis.call('EXISTS', B) == 1  -- a ban raced the client's filter
local function banned(p) return guard and redis.call('SISMEMBER', B, p) == 1 end
local F = '([^\\n]*)\\n'
local limit = 9007199254740991
if earliest then limit = math.floor(9007199254740992 / span) - 1 end
local function clamp(s)
  if s > limit then return limit elseif s < -limit then return -limit end
  return s
end
local exact = ARGV[11] == '1'
local any_kept = exact and redis.call('EXISTS', L) == 1  -- skip HGET while none is kept
-- A mixed-sign sum: the player's total so far (cur: exact while the player has no entry in
-- L) plus the line's delta d (integer text), as the clamped score. Redis's HINCRBY adds in
-- int64, exactly; a double is exact only below 2^53, and a total past the limit compares
-- past it as a double too (limit + 1 <= 2^53 is one). The kept total stops at +-2^62, the
-- batch's rollup cap (jobs.spec.ROLLUP_CAP), so HINCRBY never overflows.
local function exact_add(p, cur, d)
  local kept = any_kept and redis.call('HGET', L, p)
  if not kept then
    local dn = tonumber(d)
    if math.abs(cur) + math.abs(dn) <= limit then return cur + dn end
    kept = string.format('%.0f', cur + 0)  -- + 0: never '-0', which HINCRBY refuses
    redis.call('HSET', L, p, kept)
    any_kept = true
  end
  local total = tonumber(kept) + tonumber(d)
  if math.abs(total) >= 4611686018427387904 then
    total = total > 0 and 4611686018427387904 or -4611686018427387904
    redis.call('HSET', L, p, string.format('%.0f', total))
  else
    total = redis.call('HINCRBY', L, p, d)
  end
  if math.abs(total) <= limit then redis.call('HDEL', L, p) return total end
  return clamp(total)
end
-- A based player's first touch on a mixed-sign board: its base key goes to T, and its exact
-- base total (sent where the key is at the limit, else '') is kept.
local function first_touch(p, base, total)
  redis.call('ZADD', T, base, p)
  if total ~= '' then
    redis.call('HSET', L, p, total)
    any_kept = true
  end
end
if agg == 'sum' and not earliest and exact then
  for p, base, total, delta in string.gmatch(ARGV[8], F .. F .. F .. F) do
    if not banned(p) then
      local cur = redis.call('ZSCORE', M, p)
      if cur then cur = tonumber(cur)
      elseif redis.call('ZSCORE', T, p) then cur = 0  -- a recompute left nothing over it
      else
        first_touch(p, base, total)
        cur = tonumber(base)
      end
      redis.call('ZADD', M, exact_add(p, cur, delta), p)
    end
  end
  for p, delta in string.gmatch(ARGV[9], F .. F) do
    if not banned(p) then
      redis.call('ZADD', M, exact_add(p, tonumber(redis.call('ZSCORE', M, p) or '0'), delta), p)
    end
  end
elseif agg == 'sum' and not earliest then
  -- The sort key is sign * score: a (signed) delta is one ZINCRBY. A based player not yet
  -- in M (XX: no update) is touched for the first time: it starts from its base key. A
  -- total past the limit saturates (exact: below it every partial sum is exact).
  for p, base, delta in string.gmatch(ARGV[8], F .. F .. F) do
    if not banned(p) then
      local v = redis.call('ZADD', M, 'XX', 'INCR', delta, p)
      if not v then
        -- In T but not in M: a recompute (a void) left the player nothing over a hidden
        -- base, so the delta starts from zero, not from the base again.
        if redis.call('ZSCORE', T, p) then
          redis.call('ZADD', M, clamp(tonumber(delta)), p)
        else
          redis.call('ZADD', T, base, p)
          redis.call('ZADD', M, clamp(tonumber(base) + tonumber(delta)), p)
        end
      elseif math.abs(tonumber(v)) > limit then
        redis.call('ZADD', M, clamp(tonumber(v)), p)
      end
    end
  end
  for p, delta in string.gmatch(ARGV[9], F .. F) do
    if not banned(p) then
      local v = tonumber(redis.call('ZINCRBY', M, delta, p))
      if math.abs(v) > limit then redis.call('ZADD', M, clamp(v), p) end
    end
  end
else
  local function decode(key)
    if not earliest then return sign * key, 0 end
    local s = math.floor(key / span)
    return sign * s, span - 1 - (key - s * span)
  end
  local function encode(score, t)
    if not earliest then return sign * score end
    return (sign * score) * span + (span - 1 - t)
  end
  local function apply(p, base, mark, a, b, c, d)
    if banned(p) then return end
    local cur = redis.call('ZSCORE', M, p)
    local curmark = false
    if cur then
      cur = tonumber(cur)
      if agg == 'last' then curmark = redis.call('HGET', L, p) end
    elseif base and not redis.call('ZSCORE', T, p) then
      cur = tonumber(base)
      if exact then first_touch(p, base, mark) else redis.call('ZADD', T, cur, p) end
      curmark = mark
      -- Keep the base's mark: a later file that finds the player in M reads it from L.
      if agg == 'last' and mark and mark ~= '' then redis.call('HSET', L, p, mark) end
    end
    local new
    if agg == 'sum' then
      local t, s = tonumber(b), 0
      if cur then
        local t0
        s, t0 = decode(cur)
        if t0 > t then t = t0 end
      end
      if exact then new = encode(exact_add(p, s, a), t)
      else new = encode(clamp(s + tonumber(a)), t) end
    elseif agg == 'max' or agg == 'min' then
      local pts, t = tonumber(a), tonumber(b)
      new = encode(pts, t)
      if cur then
        local s, t0 = decode(cur)
        local better
        if agg == 'max' then better = pts > s or (pts == s and t < t0)
        else better = pts < s or (pts == s and t < t0) end
        if not better then new = cur end
      end
    else
      local pts, us, m, t = tonumber(a), b, c, tonumber(d)
      new = encode(pts, t)
      local later = true
      if cur and curmark then
        local sep = string.find(curmark, '|', 1, true)
        local us0, m0 = string.sub(curmark, 1, sep - 1), string.sub(curmark, sep + 1)
        later = bytes_after(us, us0) or (us == us0 and bytes_after(m, m0))
      end
      if later then redis.call('HSET', L, p, us .. '|' .. m) else new = cur end
    end
    redis.call('ZADD', M, new, p)
  end
  if agg == 'last' then
    for p, base, mark, a, b, c, d in string.gmatch(ARGV[8], string.rep(F, 7)) do
      apply(p, base, mark, a, b, c, d)
    end
    for p, a, b, c, d in string.gmatch(ARGV[9], string.rep(F, 5)) do
      apply(p, false, false, a, b, c, d)
    end
  elseif exact then  -- based rows carry the exact base total (in the mark's place)
    for p, base, total, a, b in string.gmatch(ARGV[8], string.rep(F, 5)) do
      apply(p, base, total, a, b)
    end
    for p, a, b in string.gmatch(ARGV[9], string.rep(F, 3)) do
      apply(p, false, false, a, b)
    end
  else
    for p, base, a, b in string.gmatch(ARGV[8], string.rep(F, 4)) do
      apply(p, base, false, a, b)
    end
    for p, a, b in string.gmatch(ARGV[9], string.rep(F, 3)) do
      apply(p, false, false, a, b)
    end
  end
end
if ARGV[3] == 'fold' then
  local kept = {}
  for x in string.gmatch(done, '%d+') do
    if tonumber(x) > floor then kept[#kept + 1] = x end
  end
  kept[#kept + 1] = ARGV[2]
  redis.call('HSET', KEYS[3], ARGV[1], table.concat(kept, ','))
  if floor > trimmed then redis.call('HSET', KEYS[3], 'floor:' .. ARGV[1], floor) end
end
return 1
"""

#: KEYS: the version's progress hash. ARGV: writer, seq folded everywhere (or -1), the seq
#: of the writer's events file before it (-1: none; the seq itself: unknown), a floor from a
#: lake listing (or -1). Per writer, field `floor:<w>` holds the floor (every events file of
#: w up to it is folded or before the watermark) and `after:<w>` the files folded past it, as
#: 'seq:prev,'. A file whose predecessor is within the floor moves the floor up to it, so a
#: file whose fold failed keeps every later one past the floor (a hole `pending` lists).
#: Returns the number of files left past the floor.
PROGRESS_SCRIPT = """
local fk, ak = 'floor:' .. ARGV[1], 'after:' .. ARGV[1]
local floor = tonumber(redis.call('HGET', KEYS[1], fk) or '-1')
local seq, prev, listed = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if listed > floor then floor = listed end
local after = {}
for s, p in string.gmatch(redis.call('HGET', KEYS[1], ak) or '', '(%d+):(%-?%d+),') do
  after[tonumber(s)] = tonumber(p)
end
if seq > floor then after[seq] = prev end
local moved = true
while moved do
  moved = false
  for s, p in pairs(after) do
    if s <= floor then
      after[s] = nil
    elseif p <= floor then
      floor = s
      after[s] = nil
      moved = true
    end
  end
end
redis.call('HSET', KEYS[1], fk, floor)
local rest, left = {}, 0
for s, p in pairs(after) do
  rest[#rest + 1] = s .. ':' .. p .. ','
  left = left + 1
end
if left > 0 then redis.call('HSET', KEYS[1], ak, table.concat(rest))
else redis.call('HDEL', KEYS[1], ak) end
return left
"""


def value_fields(board: Board) -> tuple[str, ...]:
    """The value columns a board's rows carry, in FOLD_SCRIPT's order."""
    if board.aggregation == "sum":
        return ("points", "t") if board.ties == "earliest" else ("points",)
    if board.aggregation in ("max", "min"):
        return ("points", "t")
    return ("points", "us", "match", "t")


@dataclass
class Update:
    """The updates of one micro-batch for one board-window: one row per player."""

    board: Board
    window: Window
    time_bits: int
    players: pa.Array = field(default_factory=lambda: pa.array([], pa.string()))
    #: The value columns of `value_fields(board)`, as text.
    values: list[pa.Array] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.players)


class ScriptPipeline:
    """Pipelined EVALSHA calls (and plain commands) in one round trip.

    A server that lacks a script (restarted, or a cluster node that never saw it) answers
    NOSCRIPT without running anything; those calls are retried once the script is loaded
    (SCRIPT LOAD reaches every primary of a cluster). Works alike on `redis.Redis` and
    `redis.cluster.RedisCluster`: every call's keys share one hash tag.
    """

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.pipe = client.pipeline(transaction=False)
        self._calls: list[tuple[str, Sequence[Any]] | None] = []

    def __len__(self) -> int:
        return len(self._calls)

    def script(self, source: str, sha: str, keys: Sequence[Any], args: Sequence[Any]) -> None:
        # execute_command, not .evalsha(): redis-py's cluster pipeline blocks the method
        # (scripts may be missing on a node; the NOSCRIPT retry below covers that).
        call = ("EVALSHA", sha, len(keys), *keys, *args)
        self.pipe.execute_command(*call)  # type: ignore[no-untyped-call]
        self._calls.append((source, call))

    def command(self, name: str, *args: Any) -> None:
        getattr(self.pipe, name)(*args)
        self._calls.append(None)

    def execute(self) -> list[Any]:
        calls, self._calls = self._calls, []
        if not calls:
            return []
        results = self.pipe.execute(raise_on_error=False)
        missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)
                   and calls[i] is not None]
        if missing:
            for source in {calls[i][0] for i in missing}:  # type: ignore[index]
                self.client.script_load(source)
            retry = self.client.pipeline(transaction=False)
            for i in missing:
                retry.execute_command(*calls[i][1])  # type: ignore[index, no-untyped-call]
            for i, result in zip(missing, retry.execute(raise_on_error=False), strict=True):
                results[i] = result
        for result in results:
            if isinstance(result, Exception):
                raise result
        return list(results)


def _sha(source: str) -> str:
    """The SHA1 EVALSHA names a script by."""
    return hashlib.sha1(source.encode()).hexdigest()




def _deadline(window: Window | None, grace_us: int) -> int:
    """The last ingested_at (us) at which an event still counts in the window."""
    if window is None:
        return -1
    if window.end is None:
        return int(np.iinfo(np.int64).max)
    return epoch_us(window.end) + grace_us


def _decoded(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def _text(values: np.ndarray | pa.Array) -> pa.Array:
    return pc.cast(values if isinstance(values, pa.Array) else pa.array(values), pa.string())


def plan_updates(table: pa.Table, registry: Registry,
                 watermark: datetime | None, *, saturate: bool = True) -> list[Update]:
    """Aggregate landed events per (board-window, player) with the counting rule.

    Only events with ingested_at >= watermark are speed events (the batch absorbed the rest).
    A backfill row counts in every window its event_time falls in (files without the
    column hold none). `saturate` False leaves sums unclamped, for a caller that adds
    them to other parts and clamps once (speed_layer.seed.seed_updates).
    """
    if watermark is not None and table.num_rows:
        table = table.filter(pc.greater_equal(table.column("ingested_at"),
                                              pa.scalar(watermark, table.schema.field(
                                                  "ingested_at").type)))
    if table.num_rows == 0:
        return []
    calendar = registry.calendar
    event_us = np.asarray(pc.cast(table.column("event_time"), pa.int64()).to_numpy())
    landed_us = np.asarray(pc.cast(table.column("ingested_at"), pa.int64()).to_numpy())
    backfill = (np.asarray(pc.fill_null(table.column("backfill"), False).to_numpy(
        zero_copy_only=False), dtype=bool) if "backfill" in table.column_names
        else np.zeros(table.num_rows, dtype=bool))
    days, day_index = np.unique(event_us // _US_PER_DAY, return_inverse=True)
    dates = [date(1970, 1, 1) + timedelta(days=int(d)) for d in days]
    regions = table.column("region")
    modes = table.column("mode")
    # Players as dictionary codes: a sum per (window, player) is one bincount.
    encoded = pc.dictionary_encode(table.column("player_id").combine_chunks())
    player_names = encoded.dictionary
    player_code = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    points = np.asarray(table.column("points").to_numpy())
    players = table.column("player_id")
    matches = table.column("match_id")
    updates: list[Update] = []
    kinds: dict[str, _KindWindows] = {}
    # A direct score (`board` set) counts on its board only, a match event on no direct board.
    boards = (table.column("board") if "board" in table.column_names
              else pa.nulls(table.num_rows, pa.string()))
    is_event = np.asarray(pc.is_null(boards).to_numpy(zero_copy_only=False), dtype=bool)
    for board in registry.boards:
        if board.direct:
            applies = np.asarray(pc.fill_null(pc.equal(boards, board.name), False).to_numpy(
                zero_copy_only=False), dtype=bool)
        elif board.scope == "global":
            applies = is_event
        else:
            column = regions if board.scope == "region" else modes
            applies = is_event & np.asarray(pc.equal(column, board.scope_value).to_numpy(
                zero_copy_only=False), dtype=bool)
        if not applies.any():
            continue
        grace_us = duration_us(board.grace)
        for kind in board.windows:
            if kind not in kinds:
                kinds[kind] = _KindWindows(calendar, kind, dates, day_index, event_us)
            found = kinds[kind]
            deadlines = np.array([_deadline(w, grace_us) for w in found.windows],
                                 dtype=np.int64)
            counts = applies & found.in_window & (backfill | (landed_us <= deadlines[day_index]))
            if not counts.any():
                continue
            layout = registry.layout(board, kind)
            bits = layout.time_bits
            t_of = found.t(layout.unit_us or 1_000_000)
            for window, chunk in found.split(np.flatnonzero(counts)):
                if board.aggregation == "sum":
                    update = _sum(board, window, bits, chunk, player_code, player_names,
                                  points, t_of if board.ties == "earliest" else None,
                                  layout.limit if saturate and not board.mixed_sum
                                  else _UNSATURATED)
                else:
                    update = _ranked(board, window, bits, pa.table({
                        "player": players.take(pa.array(chunk)),
                        "points": pa.array(points[chunk]), "t": pa.array(t_of[chunk]),
                        "us": pa.array(event_us[chunk]), "match": matches.take(pa.array(chunk)),
                    }))
                updates.append(update)
    return updates


class _KindWindows:
    """The windows of one kind on the batch's event dates, shared by every board with it."""

    def __init__(self, calendar: Calendar, kind: str, dates: list[date],
                 day_index: np.ndarray, event_us: np.ndarray) -> None:
        self.windows = [calendar.window_on(kind, d) for d in dates]
        ids = np.array([w.id if w else "" for w in self.windows], dtype=object)
        self.in_window = (ids != "")[day_index]
        # Several event dates share a window: one update per window, not per date.
        self._ids, self._first_day, window_of_day = np.unique(ids, return_index=True,
                                                              return_inverse=True)
        self._window_of = window_of_day[day_index]
        self._day_index, self._event_us = day_index, event_us
        self._offsets: np.ndarray | None = None

    def t(self, unit_us: int) -> np.ndarray:
        """Per row: time since its window's start in units of `unit_us` (the `earliest`
        tie-break; see registry.layout)."""
        if self._offsets is None:
            starts = np.array([epoch_us(w.start) if w else 0 for w in self.windows],
                              dtype=np.int64)
            self._offsets = self._event_us - starts[self._day_index]
        return self._offsets // unit_us

    def split(self, rows: np.ndarray) -> Iterator[tuple[Window, np.ndarray]]:
        """(window, its rows) for the given rows, in window order."""
        window_of = self._window_of[rows]
        if len(self._ids) > 1:
            order = np.argsort(window_of, kind="stable")
            rows, window_of = rows[order], window_of[order]
        for chunk in np.split(rows, np.flatnonzero(np.diff(window_of)) + 1):
            w_index = int(self._window_of[chunk[0]])
            window = self.windows[int(self._first_day[w_index])]
            assert window is not None
            assert window.id == self._ids[w_index]
            yield window, chunk


#: The clamp of an unsaturated sum (`plan_updates(saturate=False)`): int64 room.
_UNSATURATED = 2**62


def _exact_sums(codes: np.ndarray, points: np.ndarray, size: int, present: np.ndarray,
                limit: int) -> np.ndarray:
    """Per present player code, the sum of its points saturated at +-limit, exactly.

    float64 sums are exact while every partial sum stays below 2^53 in magnitude, which a
    bound on |points| * rows proves for nearly every file; otherwise (huge bounds) the file is
    summed in Python integers.
    """
    sums = np.bincount(codes, weights=points, minlength=size)[present]
    if len(points) == 0 or float(np.abs(points).max()) * len(points) < 2.0**52:
        return np.asarray(np.clip(sums.astype(np.int64), -limit, limit), dtype=np.int64)
    exact = dict.fromkeys(present.tolist(), 0)
    for code, value in zip(codes.tolist(), points.tolist(), strict=True):
        exact[code] += value
    return np.array([max(-limit, min(limit, exact[c])) for c in present.tolist()],
                    dtype=np.int64)


def _sum(board: Board, window: Window, bits: int, rows: np.ndarray, player_code: np.ndarray,
         player_names: pa.Array, points: np.ndarray, t_of: np.ndarray | None,
         limit: int) -> Update:
    codes = player_code[rows]
    size = len(player_names)
    seen = np.bincount(codes, minlength=size) > 0
    present = np.flatnonzero(seen)
    # Saturated at the key's limit, as the batch does (leaderboard.sortkey.saturate).
    sums = _exact_sums(codes, points[rows], size, present, limit)
    if board.ties != "earliest":
        # The sort key is sign * score: send the key's delta, which ZINCRBY takes as is.
        return Update(board, window, bits, player_names.take(pa.array(present)),
                      [_text(sums if board.order == "desc" else -sums)])
    assert t_of is not None
    latest = np.full(size, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(latest, codes, t_of[rows])
    return Update(board, window, bits, player_names.take(pa.array(present)),
                  [_text(sums), _text(latest[present])])


def _ranked(board: Board, window: Window, bits: int, chunk: pa.Table) -> Update:
    """max|min: the best points per player (earliest t on ties); last: the latest event."""
    if board.aggregation in ("max", "min"):
        order = "descending" if board.aggregation == "max" else "ascending"
        ranked = chunk.sort_by([("player", "ascending"), ("points", order), ("t", "ascending")])
    else:
        ranked = chunk.sort_by([("player", "ascending"), ("us", "descending"),
                                ("match", "descending")])
    grouped = ranked.group_by("player", use_threads=False).aggregate(
        [("points", "first"), ("t", "first"), ("us", "first"), ("match", "first")])
    columns = {"points": _text(grouped.column("points_first").combine_chunks()),
               "t": _text(grouped.column("t_first").combine_chunks())}
    if board.aggregation == "last":
        columns["us"] = mark_time(grouped.column("us_first").combine_chunks())
        columns["match"] = grouped.column("match_first").combine_chunks()
    return Update(board, window, bits, grouped.column("player").combine_chunks(),
                  [columns[name] for name in value_fields(board)])


def mark_time(us: pa.Array) -> pa.Array:
    """Event times (us since 1970) as 20-character texts that order as bytes like the numbers
    do, before 1970 too (FOLD_SCRIPT compares `last` marks as bytes): t >= 0 zero-padded;
    t < 0 as '-' and 10^18 + t zero-padded to 19 digits ('-' sorts before every digit, and
    years 1-9999 lie within 10^18 us of 1970)."""
    values = np.asarray(pc.cast(us, pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)
    negative = values < 0
    text = pc.utf8_lpad(_text(np.where(negative, values + 10**18, values)), 20, "0")
    if negative.any():
        text = pc.if_else(pa.array(negative), pc.utf8_replace_slice(text, 0, 1, "-"), text)
    return text


def _lines(columns: Sequence[pa.Array | str]) -> bytes:
    """Rows of `columns` as one text: every field followed by a newline."""
    rows = pc.binary_join_element_wise(*columns, "", "\n")
    if len(rows) == 0:
        return b""
    if isinstance(rows, pa.ChunkedArray):
        rows = rows.combine_chunks()
    width = np.int64 if pa.types.is_large_string(rows.type) else np.int32
    offsets = np.frombuffer(rows.buffers()[1], dtype=width)[rows.offset:rows.offset + len(rows)
                                                             + 1]
    begin, end = int(offsets[0]), int(offsets[-1])
    text: bytes = rows.buffers()[2].slice(begin, end - begin).to_pybytes()
    return text


@dataclass
class _BaseWindow:
    """One board-window of a base version: row of each player, sort keys and marks as text."""

    rows: dict[str, int]
    keys: pa.Array
    marks: pa.Array | None
    #: A mixed-sign sum board's players whose base score is at the limit: their exact base
    #: total (text), which the key no longer holds (`BaseKeys.window`).
    exact: dict[str, str] = field(default_factory=dict)


class BaseKeys:
    """Base sort keys (and `last` marks) of one batch version, loaded per board-window."""

    def __init__(self, view: BatchView | None, registry: Registry | None = None) -> None:
        self.view = view
        self.registry = registry
        self._cache: dict[tuple[str, str], _BaseWindow | None] = {}

    def window(self, board: Board, window_id: str) -> _BaseWindow | None:
        key = (board.name, window_id)
        if key not in self._cache:
            found = None
            table = None if self.view is None else self.view.standings(board.name, window_id)
            if table is not None and table.num_rows:
                marks = None
                if board.aggregation == "last":
                    # The mark of the base's score: its latest event, (last_event_at,
                    # last_match_id) -- on a `last` board reached_at is that same instant.
                    # Versions published before the column lack the match ('us|'): a speed
                    # event at the very same instant then wins the tie.
                    latest = mark_time(pc.cast(table.column("last_event_at"), pa.int64())
                                        .combine_chunks())
                    last_match = (pc.fill_null(table.column("last_match_id"), "")
                                  .combine_chunks() if "last_match_id" in table.column_names
                                  else pa.array([""] * table.num_rows, pa.string()))
                    marks = pc.binary_join_element_wise(latest, last_match, "|")
                players = table.column("player_id").to_pylist()
                found = _BaseWindow(dict(zip(players, range(len(players)), strict=True)),
                                    _text(table.column("sort_key").combine_chunks()), marks,
                                    self._exact(board, window_id, table))
            self._cache[key] = found
        return self._cache[key]

    def _exact(self, board: Board, window_id: str, table: pa.Table) -> dict[str, str]:
        """On a mixed-sign sum board, the exact base total of each player whose score is at
        the key's limit, from the version's rollup rows (what the batch sums before it
        clamps): the fold keeps it for them (FOLD_SCRIPT's kept totals), so a live total
        that comes back below the limit is the batch's. Rare (65,536 events at the board's
        largest |points| at least), so read per such player."""
        if (self.view is None or self.registry is None or not board.mixed_sum
                or "score" not in table.column_names):
            return {}
        from speed_layer.seed import player_rollups, rollup_updates  # seed imports the fold

        window = self.registry.calendar.window(window_id)
        limit = self.registry.layout(board, window.kind).limit
        scores = table.column("score")
        at_limit = pc.equal(pc.abs(scores), pa.scalar(limit, scores.type))
        found = {}
        for player in table.column("player_id").filter(at_limit).to_pylist():
            rows = player_rollups(self.view.lake, self.view.manifest, player)
            total = sum(int(v) for update in rollup_updates(rows, self.registry)
                        if (update.board.name, update.window.id) == (board.name, window_id)
                        for v in update.values[0].to_pylist())
            found[player] = str(total)
        return found

    def lookup(self, board: Board, window_id: str) -> dict[str, tuple[str, str]]:
        """{player: (base sort key, base mark or '')} of one board-window (tests, tools)."""
        found = self.window(board, window_id)
        if found is None:
            return {}
        keys = found.keys.to_pylist()
        marks = found.marks.to_pylist() if found.marks is not None else [""] * len(keys)
        return {p: (keys[i], marks[i]) for p, i in found.rows.items()}


def encode_rows(update: Update, base: _BaseWindow | None) -> tuple[bytes, bytes]:
    """(based rows, plain rows) of one update, in FOLD_SCRIPT's wire format."""
    players, values = update.players, update.values
    if base is None or not base.rows:
        return b"", _lines([players, *values])
    get = base.rows.get
    at = np.fromiter((get(p, -1) for p in players.to_pylist()), dtype=np.int64,
                     count=len(players))
    known = at >= 0
    if not known.any():
        return b"", _lines([players, *values])
    based = pa.array(known)
    base_columns = [base.keys.take(pa.array(at[known]))]
    if update.board.mixed_sum:  # the exact base total where the key is at the limit
        exact = base.exact.get
        base_columns.append(pa.array([exact(p, "") for p in
                                      players.filter(based).to_pylist()], pa.string()))
    if update.board.aggregation == "last":
        assert base.marks is not None
        base_columns.append(base.marks.take(pa.array(at[known])))
    based_rows = _lines([players.filter(based), *base_columns,
                         *(v.filter(based) for v in values)])
    if known.all():
        return based_rows, b""
    plain = pc.invert(based)
    return based_rows, _lines([players.filter(plain), *(v.filter(plain) for v in values)])


@dataclass(frozen=True)
class Progress:
    """Which files of a version are folded everywhere, per writer: every events file up to
    `floors[w]` (or before the watermark), and the seqs in `after[w]` (with the seq of each
    one's predecessor) past it."""

    floors: dict[str, int]
    after: dict[str, dict[int, int]]

    def folded(self, writer: str, seq: int) -> bool:
        return seq <= self.floors.get(writer, -1) or seq in self.after.get(writer, {})


@dataclass
class Call:
    """One board-window's FOLD_SCRIPT call of one file."""

    keys: BoardWindowKeys
    args: list[str | int | bytes]


#: Versions whose base keys a Folder keeps (the live one, and the next while a rebase runs).
KEPT_BASES = 2


class Folder:
    """Folds landed files into the speed state of one version.

    `on_ban_race(version, windows)` (set by the speed layer) runs when a ban or unban
    changed the banned set while a fold was applying a file with the old set: it applies
    the players' resulting state again to the board-windows that fold touched.
    """

    def __init__(self, client: redis.Redis, registry: Registry, lake: Path) -> None:
        self.client = client
        self.registry = registry
        self.lake = Path(lake)
        self._sha = _sha(FOLD_SCRIPT)
        self._progress_sha = _sha(PROGRESS_SCRIPT)
        self._bases: dict[str, BaseKeys] = {}
        self._newest: dict[Path, datetime] = {}
        #: Per (version tag, writer): files folded past the writer's floor after the last
        #: fold (a hole before them, or a predecessor not known yet).
        self.past_floor: dict[tuple[str, str], int] = {}
        self.on_ban_race: Callable[[SpeedVersion, set[str], list[tuple[str, str]]],
                                   None] | None = None
        #: Runs when a void named rows of a file while it was being folded without it:
        #: (version, the players of those rows, the board-windows the fold wrote).
        self.on_void_race: Callable[[SpeedVersion, set[str], list[tuple[str, str]]],
                                    None] | None = None

    def base(self, version: SpeedVersion) -> BaseKeys:
        """The base keys of a version, kept for the KEPT_BASES versions used last (the live
        one and the one a rebase builds): a long-running process drops older ones."""
        tag = version.tag
        if tag in self._bases:
            self._bases[tag] = self._bases.pop(tag)  # most recently used last
            return self._bases[tag]
        view = None
        if version.version is not None:
            view = BatchView(self.lake, read_version(self.lake, version.version))
        self._bases[tag] = BaseKeys(view, self.registry)
        while len(self._bases) > KEPT_BASES:
            dropped = next(iter(self._bases))
            del self._bases[dropped]
            for key in [k for k in self.past_floor if k[0] == dropped]:
                del self.past_floor[key]
        return self._bases[tag]

    def voids_of(self, table: pa.Table, *, any_void: bool | None = None) -> VoidIndex:
        """The voids naming a match of `table` (one HMGET of its matches; none while the
        lake has no void). `any_void`: whether the voids hash exists, when the caller read
        it already (the fold reads it with its other state: no round trip of its own)."""
        if any_void is None:
            any_void = bool(table.num_rows) and bool(self.client.exists(VOIDS))
        if table.num_rows == 0 or not any_void:
            return VoidIndex()
        matches = pc.unique(table.column("match_id")).to_pylist()
        found = self.client.hmget(VOIDS, matches)
        return VoidIndex({m: _decoded(p).split("\n") for m, p in zip(matches, found,
                                                                        strict=True) if p})

    def calls(self, version: SpeedVersion, writer: str, seq: int, table: pa.Table, *,
              mode: str, banned: set[str], floor: int, since_watermark: bool = True,
              based: bool = True) -> list[Call]:
        """The FOLD_SCRIPT calls of one file, one per board-window it touches; banned
        players' rows dropped (every board-window still gets its call, so its checkpoint
        covers the file and an unban replays from there). `since_watermark=False` counts
        rows of any age (a player's base part recomputed from the lake); `based=False`
        sends every row as a plain one (the player's base key is not the starting point)."""
        updates = plan_updates(table, self.registry,
                               version.watermark if since_watermark else None)
        return self.calls_of(version, writer, seq, updates, mode=mode, banned=banned,
                             floor=floor, based=based)

    def calls_of(self, version: SpeedVersion, writer: str, seq: int, updates: list[Update],
                 *, mode: str, banned: set[str], floor: int, based: bool = True) -> list[Call]:
        """The FOLD_SCRIPT calls of planned updates (`calls`; the speed layer's seed of a
        player's base part from rollup rows, speed_layer.seed)."""
        if banned:
            ban_set = pa.array(sorted(banned), pa.string())
            for update in updates:
                keep = pc.invert(pc.is_in(update.players, value_set=ban_set))
                if not pc.all(keep).as_py():
                    update.players = update.players.filter(keep)
                    update.values = [v.filter(keep) for v in update.values]
        base = self.base(version)
        calls = []
        for update in updates:
            based_rows, plain_rows = encode_rows(update, base.window(
                update.board, update.window.id) if based else None)
            calls.append(Call(BoardWindowKeys(update.board.name, update.window.id, version.tag),
                              [writer, seq, mode, update.board.aggregation,
                               1 if update.board.order == "desc" else -1,
                               1 if update.board.ties == "earliest" else 0,
                               1 << update.time_bits, based_rows, plain_rows, floor,
                               1 if update.board.mixed_sum else 0]))
        return calls

    def fold(self, version: SpeedVersion, writer: str, seq: int, table: pa.Table,
             *, prev: int | None = None, mode: str = "fold",
             banned: set[str] | None = None, building: bool = False) -> int:
        """Fold one landed file; returns the number of board-windows that applied it.

        `prev`: the seq of the writer's events file before this one (-1: none; None: not
        known here), which lets the progress floor move past this file. Banned players'
        rows are dropped first. `mode="replay"` re-applies a file's rows (one unbanned
        player's) where the file was already folded, leaving checkpoints alone.
        A version with an epoch is folded only while the pointer carries that epoch (a state
        that lost its past raises StateLost), unless `building` (a rebuild's own folds,
        before it writes the pointer). Fault checkpoints: fold.after_script (each
        board-window call, sent one at a time while a hook is installed),
        fold.before_progress.
        """
        read = self.client.pipeline(transaction=False)
        read.get(BANS_GENERATION)
        read.smembers(BANNED)
        read.hget(progress_key(version.tag), f"floor:{writer}")
        read.get(CURRENT)
        read.exists(VOIDS)
        generation, banned_now, floor, pointer, any_void = read.execute()
        if version.epoch is not None and not building and (
                pointer is None or SpeedVersion.from_json(pointer).epoch != version.epoch):
            raise StateLost("the speed state lost its past (its epoch changed or is gone) "
                            "while a file was about to be folded onto it")
        if banned is None:
            banned = {_decoded(b) for b in banned_now}
        # Voided rows never count (a void may come before its match lands).
        original, voids = table, self.voids_of(table, any_void=bool(any_void))
        table = voids.drop(table)
        calls = self.calls(version, writer, seq, table, mode=mode, banned=banned,
                           floor=-1 if floor is None else int(floor))
        applied = 0
        pipe = ScriptPipeline(self.client)
        stepwise = faults.active()
        for call in calls:
            pipe.script(FOLD_SCRIPT, self._sha, call.keys.all(), call.args)
            if stepwise:
                applied += sum(int(r) for r in pipe.execute())
                faults.checkpoint("fold.after_script")
        touched = [(c.keys.board, c.keys.window_id) for c in calls]
        if touched:
            pipe.command("sadd", windows_key(version.tag), *[f"{b}|{w}" for b, w in touched])
        results = pipe.execute()
        if not stepwise:
            applied += sum(int(r) for r in results[: len(calls)])
        faults.checkpoint("fold.before_progress")
        after = ScriptPipeline(self.client)
        if mode == "fold":
            after.script(PROGRESS_SCRIPT, self._progress_sha, [progress_key(version.tag)],
                         [writer, seq, seq if prev is None else prev, -1])
        after.command("get", BANS_GENERATION)
        replies = after.execute()
        if mode == "fold":
            self.past_floor[(version.tag, writer)] = int(replies[0])
        if replies[-1] != generation and self.on_ban_race is not None and touched:
            # A ban or unban ran while this file was folded with the banned set read before
            # it: apply the players' resulting state again where this fold wrote.
            changed = banned ^ {_decoded(b) for b in self.client.smembers(BANNED)}
            if changed:
                self.on_ban_race(version, changed, touched)
        if replies[-1] != generation and self.on_void_race is not None and touched:
            # A void ran meanwhile: the players of rows it names in this file are
            # recomputed where this fold wrote (their rows may have counted).
            newly = pc.and_(self.voids_of(original).mask(original),
                            pc.invert(voids.mask(original)))
            if pc.any(newly).as_py():
                self.on_void_race(version, set(original.column("player_id").filter(
                    newly).to_pylist()), touched)
        return applied

    def progress(self, version: SpeedVersion) -> Progress:
        floors: dict[str, int] = {}
        after: dict[str, dict[int, int]] = {}
        for raw_field, raw_value in self.client.hgetall(progress_key(version.tag)).items():
            kind, _, writer = _decoded(raw_field).partition(":")
            value = _decoded(raw_value)
            if kind == "floor":
                floors[writer] = int(value)
            elif kind == "after":
                after[writer] = {int(s): int(p) for s, _, p in
                                 (item.partition(":") for item in value.split(",") if item)}
        return Progress(floors, after)

    def advance(self, version: SpeedVersion, files: list[LandedFile] | None = None) -> None:
        """Move each writer's floor over its files that are folded or before the watermark,
        from a listing of the lake (files landed before their predecessor was known)."""
        progress = self.progress(version)
        listed = landed_files(self.lake) if files is None else files
        by_writer: dict[str, list[LandedFile]] = {}
        for landed in listed:
            by_writer.setdefault(landed.writer, []).append(landed)
        pipe = ScriptPipeline(self.client)
        for writer, found in sorted(by_writer.items()):
            floor = progress.floors.get(writer, -1)
            for landed in sorted(found, key=lambda f: f.seq):
                if landed.seq <= floor:
                    continue
                if progress.folded(writer, landed.seq) or not self._after(landed,
                                                                          version.watermark):
                    floor = landed.seq
                else:
                    break
            if floor > progress.floors.get(writer, -1):
                pipe.script(PROGRESS_SCRIPT, self._progress_sha, [progress_key(version.tag)],
                            [writer, -1, -1, floor])
        pipe.execute()

    def _after(self, landed: LandedFile, watermark: datetime | None) -> bool:
        """Whether a landed file may hold rows ingested at or after the watermark. Every file
        lands in its landing day's partition with one stamp; only backfill files of older
        lakes (partitioned by their earliest event stamp) hold later rows in an earlier
        partition, so files there are checked by their ingested_at statistics (cached:
        files are immutable)."""
        if watermark is None or landed.ingest_date >= watermark.date():
            return True
        if landed.path not in self._newest:
            self._newest[landed.path] = stamp_range(landed.path)[1]
        return self._newest[landed.path] >= watermark

    def pending(self, version: SpeedVersion, writer: str | None = None) -> list[LandedFile]:
        """Landed files past this version's watermark not yet folded everywhere (a file
        whose fold failed stays pending whatever landed after it), by (writer, seq)."""
        progress = self.progress(version)
        return sorted((f for f in landed_files(self.lake)
                       if (writer is None or f.writer == writer)
                       and not progress.folded(f.writer, f.seq)
                       and self._after(f, version.watermark)),
                      key=lambda f: (f.writer, f.seq))

    def pending_or_folded(self, version: SpeedVersion) -> list[LandedFile]:
        """Every landed file that may hold speed events of this version (past its watermark)."""
        return [f for f in landed_files(self.lake) if self._after(f, version.watermark)]

    def catch_up(self, version: SpeedVersion, files: Iterable[LandedFile] | None = None, *,
                 building: bool = False, dedupe: bool = False) -> int:
        """Fold every pending file (crash repair, a rebase or rebuild), then move the floors
        over them.

        `dedupe` (a rebase or rebuild folding many files): an identity counts once over the
        base and all of them, first ingested wins, as the batch counts it
        (speed_layer.dedupe.Counted). The door drops retries within its horizon; this drops
        older re-deliveries, of events the base absorbed or spread over these files.
        """
        listing = landed_files(self.lake)
        todo = list(self.pending(version) if files is None else files)
        counted = None
        if dedupe:
            todo = ingest_order(todo)
            counted = Counted.of_base(self.lake, version.watermark, match_ids(
                pq.read_table(f.path, columns=["match_id"]) for f in todo))
        else:
            todo.sort(key=lambda f: (f.writer, f.seq))
        prevs = predecessors(listing)
        for landed in todo:
            table = pq.read_table(landed.path)
            if counted is not None:
                table = counted.fresh(table)
            self.fold(version, landed.writer, landed.seq, table,
                      prev=prevs.get((landed.writer, landed.seq)), building=building)
        self.advance(version, listing)
        return len(todo)


def predecessors(listing: Iterable[LandedFile]) -> dict[tuple[str, int], int]:
    """Per (writer, seq) of a lake listing: the seq of the writer's events file before it
    (-1: none)."""
    found: dict[tuple[str, int], int] = {}
    last: dict[str, int] = {}
    for landed in sorted(listing, key=lambda f: (f.writer, f.seq)):
        found[(landed.writer, landed.seq)] = last.get(landed.writer, -1)
        last[landed.writer] = landed.seq
    return found
