"""The fold: landed micro-batches into the version-scoped Redis state, exactly once.

A landed file is aggregated client-side per (board-window, player) with the counting rule,
then each board-window gets one script call (pipelined) that applies its updates, the first
touch of a player starting from the base key (recorded in `T`), and advances that
board-window's checkpoint for the writer -- unless the checkpoint already covers the file. A
crash anywhere is repaired by folding again every file past the version's progress mark:
each board-window skips what it already has, so each file counts exactly once everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import redis

from leaderboard.batch_view import BatchView
from leaderboard.calendar import Window
from leaderboard.lake import LandedFile, landed_files
from leaderboard.manifest import read_version
from leaderboard.registry import Board, Registry
from leaderboard.speed_keys import (
    BANNED,
    BoardWindowKeys,
    SpeedVersion,
    progress_key,
    windows_key,
)

__all__ = ["FOLD_SCRIPT", "BaseKeys", "Folder", "Update", "plan_updates"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US_PER_DAY = 86_400_000_000

#: KEYS: M, T, C, L, B. ARGV: writer, seq, mode, aggregation, sign, earliest (0|1),
#: 2^time_bits, then 7 values per player: player, base key ('' if none), base mark ('' if none), a, b, c, d
#: where sum: a=points delta, b=t of the latest event; max|min: a=best points, b=its t;
#: last: a=points, b=event time (us, 20 digits), c=match_id, d=t.
FOLD_SCRIPT = """
local ck = redis.call('HGET', KEYS[3], ARGV[1])
local covered = ck and tonumber(ck) >= tonumber(ARGV[2])
-- fold: apply a file once. replay (unban): re-apply one player's events of a file this
-- board-window has already folded; files not yet folded here will be folded normally.
if ARGV[3] == 'fold' and covered then return 0 end
if ARGV[3] == 'replay' and not covered then return 0 end
local agg, sign, earliest, span = ARGV[4], tonumber(ARGV[5]), ARGV[6] == '1', tonumber(ARGV[7])
local function decode(key)
  if not earliest then return sign * key, 0 end
  local s = math.floor(key / span)
  return sign * s, span - 1 - (key - s * span)
end
local function encode(score, t)
  if not earliest then return sign * score end
  return (sign * score) * span + (span - 1 - t)
end
local i = 8
while i <= #ARGV do
  local p, base, mark = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local a, b, c, d = ARGV[i + 3], ARGV[i + 4], ARGV[i + 5], ARGV[i + 6]
  i = i + 7
  if redis.call('SISMEMBER', KEYS[5], p) == 0 then
    local cur = redis.call('ZSCORE', KEYS[1], p)
    local curmark = false
    if cur then
      cur = tonumber(cur)
      if agg == 'last' then curmark = redis.call('HGET', KEYS[4], p) end
    elseif base ~= '' then
      cur = tonumber(base)
      redis.call('ZADD', KEYS[2], cur, p)
      if mark ~= '' then curmark = mark end
    end
    local new
    if agg == 'sum' then
      local delta, t = tonumber(a), tonumber(b)
      if cur then
        local s, t0 = decode(cur)
        if t0 > t then t = t0 end
        new = encode(s + delta, t)
      else
        new = encode(delta, t)
      end
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
        later = us > us0 or (us == us0 and m > m0)
      end
      if later then redis.call('HSET', KEYS[4], p, us .. '|' .. m) else new = cur end
    end
    redis.call('ZADD', KEYS[1], new, p)
  end
end
if ARGV[3] == 'fold' then redis.call('HSET', KEYS[3], ARGV[1], ARGV[2]) end
return 1
"""


@dataclass
class Update:
    """The updates of one micro-batch for one board-window."""

    board: Board
    window: Window
    time_bits: int
    players: list[str] = field(default_factory=list)
    values: list[tuple[str, str, str, str]] = field(default_factory=list)


def _us(instant: datetime) -> int:
    return (instant - _EPOCH) // timedelta(microseconds=1)


def plan_updates(table: pa.Table, registry: Registry,
                 watermark: datetime | None) -> list[Update]:
    """Aggregate landed events per (board-window, player) with the counting rule.

    Only events with ingested_at >= watermark are speed events (the batch absorbed the rest).
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
    days, day_index = np.unique(event_us // _US_PER_DAY, return_inverse=True)
    dates = [date(1970, 1, 1) + timedelta(days=int(d)) for d in days]
    regions = np.asarray(table.column("region").to_numpy(zero_copy_only=False))
    modes = np.asarray(table.column("mode").to_numpy(zero_copy_only=False))
    players = table.column("player_id")
    points = np.asarray(table.column("points").to_numpy())
    matches = table.column("match_id")
    updates: list[Update] = []
    for board in registry.boards:
        if board.scope == "global":
            applies = np.ones(table.num_rows, dtype=bool)
        elif board.scope == "region":
            applies = regions == board.scope_value
        else:
            applies = modes == board.scope_value
        if not applies.any():
            continue
        grace_us = board.grace // timedelta(microseconds=1)
        for kind in board.windows:
            windows = [calendar.window_on(kind, d) for d in dates]
            ids = np.array([w.id if w else "" for w in windows], dtype=object)
            starts = np.array([_us(w.start) if w else 0 for w in windows], dtype=np.int64)
            deadlines = np.array([np.iinfo(np.int64).max if (w and w.end is None) else
                                  (_us(w.end) + grace_us if w else -1) for w in windows],
                                 dtype=np.int64)
            counts = applies & (landed_us <= deadlines[day_index]) & (ids[day_index] != "")
            if not counts.any():
                continue
            rows = np.flatnonzero(counts)
            # Several event dates share a window: one update per window, not per date.
            window_ids, window_of_day = np.unique(ids, return_inverse=True)
            window_of = window_of_day[day_index[rows]]
            t = (event_us[rows] - starts[day_index[rows]]) // 1_000_000
            part = pa.table({
                "w": pa.array(window_of, pa.int64()), "player": players.take(pa.array(rows)),
                "points": pa.array(points[rows]), "t": pa.array(t),
                "us": pa.array(event_us[rows]), "match": matches.take(pa.array(rows)),
            })
            bits = calendar.time_bits(kind) if board.ties == "earliest" else 0
            first_day_of = {w: int(np.flatnonzero(window_of_day == w)[0])
                            for w in np.unique(window_of).tolist()}
            for w_index, day_number in first_day_of.items():
                window = windows[day_number]
                assert window is not None and window.id == window_ids[w_index]
                chunk = part.filter(pc.equal(part.column("w"), w_index))
                updates.append(_aggregate(board, window, bits, chunk))
    return updates


def _aggregate(board: Board, window: Window, bits: int, chunk: pa.Table) -> Update:
    update = Update(board, window, bits)
    if board.aggregation == "sum":
        grouped = chunk.group_by("player").aggregate([("points", "sum"), ("t", "max")])
        update.players = grouped.column("player").to_pylist()
        update.values = [(str(a), str(b), "", "") for a, b in zip(
            grouped.column("points_sum").to_pylist(), grouped.column("t_max").to_pylist(),
            strict=True)]
        return update
    if board.aggregation in ("max", "min"):
        order = "descending" if board.aggregation == "max" else "ascending"
        ranked = chunk.sort_by([("player", "ascending"), ("points", order), ("t", "ascending")])
    else:
        ranked = chunk.sort_by([("player", "ascending"), ("us", "descending"),
                                ("match", "descending")])
    grouped = ranked.group_by("player", use_threads=False).aggregate(
        [("points", "first"), ("t", "first"), ("us", "first"), ("match", "first")])
    update.players = grouped.column("player").to_pylist()
    pts = grouped.column("points_first").to_pylist()
    ts = grouped.column("t_first").to_pylist()
    if board.aggregation == "last":
        update.values = [(str(p), f"{u:020d}", m, str(t)) for p, u, m, t in zip(
            pts, grouped.column("us_first").to_pylist(), grouped.column("match_first").to_pylist(),
            ts, strict=True)]
    else:
        update.values = [(str(p), str(t), "", "") for p, t in zip(pts, ts, strict=True)]
    return update


class BaseKeys:
    """Base sort keys (and `last` marks) of one batch version, loaded per board-window."""

    def __init__(self, view: BatchView | None) -> None:
        self.view = view
        self._cache: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}

    def lookup(self, board: Board, window_id: str) -> dict[str, tuple[str, str]]:
        key = (board.name, window_id)
        if key not in self._cache:
            found: dict[str, tuple[str, str]] = {}
            table = None if self.view is None else self.view.standings(board.name, window_id)
            if table is not None and table.num_rows:
                keys = [str(k) for k in table.column("sort_key").to_pylist()]
                marks = [""] * table.num_rows
                if board.aggregation == "last":
                    reached = pc.cast(table.column("reached_at"), pa.int64()).to_pylist()
                    last_match = (table.column("last_match_id").to_pylist()
                                  if "last_match_id" in table.column_names
                                  else [""] * table.num_rows)
                    marks = [f"{u:020d}|{m or ''}" for u, m in zip(reached, last_match,
                                                                   strict=True)]
                found = dict(zip(table.column("player_id").to_pylist(),
                                 zip(keys, marks, strict=True), strict=True))
            self._cache[key] = found
        return self._cache[key]


class Folder:
    """Folds landed files into the speed state of one version."""

    def __init__(self, client: redis.Redis, registry: Registry, lake: Path) -> None:
        self.client = client
        self.registry = registry
        self.lake = Path(lake)
        self._script = client.register_script(FOLD_SCRIPT)
        self._bases: dict[str, BaseKeys] = {}

    def base(self, version: SpeedVersion) -> BaseKeys:
        tag = version.tag
        if tag not in self._bases:
            view = None
            if version.version is not None:
                view = BatchView(self.lake, read_version(self.lake, version.version))
            self._bases[tag] = BaseKeys(view)
        return self._bases[tag]

    def fold(self, version: SpeedVersion, writer: str, seq: int, table: pa.Table,
             *, crash_after: int | None = None, mode: str = "fold",
             banned: set[str] | None = None) -> int:
        """Fold one landed file; returns the number of board-windows that applied it.

        Banned players' rows are dropped first. `mode="replay"` re-applies a file's rows
        (one unbanned player's) where the file was already folded, leaving checkpoints alone.
        `crash_after` (tests only) kills the process after that many board-window calls.
        """
        if banned is None:
            banned = {b.decode() for b in self.client.smembers(BANNED)}
        if banned and table.num_rows:
            table = table.filter(pc.invert(pc.is_in(table.column("player_id"),
                                                    value_set=pa.array(sorted(banned)))))
        updates = plan_updates(table, self.registry, version.watermark)
        base = self.base(version)
        applied = 0
        pipe = self.client.pipeline(transaction=False)
        touched = []
        for number, update in enumerate(updates):
            keys = BoardWindowKeys(update.board.name, update.window.id, version.tag)
            known = base.lookup(update.board, update.window.id)
            args: list[str | int] = [
                writer, seq, mode, update.board.aggregation,
                1 if update.board.order == "desc" else -1,
                1 if update.board.ties == "earliest" else 0, 1 << update.time_bits,
            ]
            for player, (a, b, c, d) in zip(update.players, update.values, strict=True):
                key, mark = known.get(player, ("", ""))
                args.extend((player, key, mark, a, b, c, d))
            touched.append(f"{update.board.name}|{update.window.id}")
            self._script(keys=keys.all(), args=args, client=pipe)
            if crash_after is not None and number + 1 >= crash_after:
                applied += sum(int(r) for r in pipe.execute())
                import os
                import signal

                os.kill(os.getpid(), signal.SIGKILL)
        if touched:
            pipe.sadd(windows_key(version.tag), *touched)
        results = pipe.execute()
        applied += sum(int(r) for r in results[: len(updates)])
        if mode == "fold":
            self.client.hset(progress_key(version.tag), writer, seq)
        return applied

    def pending(self, version: SpeedVersion) -> list[LandedFile]:
        """Landed files past this version's progress mark (per writer) and its watermark."""
        marks = {k.decode(): int(v) for k, v in
                 self.client.hgetall(progress_key(version.tag)).items()}
        first_day = None if version.watermark is None else version.watermark.date()
        return [f for f in landed_files(self.lake)
                if (first_day is None or f.ingest_date >= first_day)
                and f.seq > marks.get(f.writer, -1)]

    def pending_or_folded(self, version: SpeedVersion) -> list[LandedFile]:
        """Every landed file that may hold speed events of this version (past its watermark)."""
        first_day = None if version.watermark is None else version.watermark.date()
        return [f for f in landed_files(self.lake)
                if first_day is None or f.ingest_date >= first_day]

    def catch_up(self, version: SpeedVersion, files: Iterable[LandedFile] | None = None) -> int:
        """Fold every file past the progress mark, in seq order per writer (crash repair)."""
        folded = 0
        for landed in sorted(self.pending(version) if files is None else files,
                             key=lambda f: (f.writer, f.seq)):
            self.fold(version, landed.writer, landed.seq, pq.read_table(landed.path))
            folded += 1
        return folded
