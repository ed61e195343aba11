"""Per-player plausibility of rate: more than `limits.player_events_per_minute` events from
one player in one landing minute are held in quarantine (reason `implausible_rate`). Match
events and direct scores count alike against the player's minute (a score is one event); a
held score keeps its board in the quarantine, so a release lands it there.

Decided once, at landing, by a hash per (player, landing minute) in Redis that every
writer shares, and recorded in the lake: the hash numbers each event identity (match_id, and
a score's board) the first time it is counted (RATE_SCRIPT, atomic per key, so two writers
never both take the last slot), and an event counts iff its number is within the limit. An
identity counts once per minute: a writer killed between counting and landing leaves its
numbers, and the retry of the same events (its claims released at the door) gets them back,
where a plain counter counted them twice and could hold genuine events. (A retry in a later
minute counts there; the dead attempt's numbers stay in their own minute.) A landing that
fails gives back the numbers of its rows that did not land, and the room they leave is
exact (a second count: the identities within the limit). The decision is
recorded in the lake: a held row goes to the quarantine, never to the landing zone. The
batch reads the landing zone and the speed layer folds it, so both layers see the same
decision without deciding again. Rows are taken in batch order: the first rows of a player
up to what is left of their minute count, the rest are held. Only rows that passed the door
count (a retry is not a new event). A held row's id stays claimed at the door, so its retry
is a retry; an operator's release (`speed_layer.review`) lands it.

Minutes are fixed (12:00:00-12:00:59 of the landing clock), not sliding: a player may land
up to twice the limit across a minute boundary, and no event is held by events before the
previous minute.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import redis

from leaderboard.schema import INPUT_FIELDS, QUARANTINE_SCHEMA
from leaderboard.timeutil import format_instant, to_utc
from speed_layer.fold import ScriptPipeline

__all__ = ["GIVE_BACK_SCRIPT", "IMPLAUSIBLE_RATE", "RATE_SCRIPT", "Held", "PlayerRate",
           "held_ids", "rate_key", "row_identities"]

IMPLAUSIBLE_RATE = "implausible_rate"
#: Seconds a minute's counter outlives its minute.
_TTL = 120
_HELD_SCHEMA = QUARANTINE_SCHEMA.remove(QUARANTINE_SCHEMA.get_field_index("ingested_at"))


#: A minute counted by the release before '+' (a rolling deploy, or a minute in progress at
#: the upgrade: its keys live 2 minutes) has '#' only: its identities within the limit are
#: then at most min('#', limit), seeded so, never fewer (read as 0, the minute would admit a
#: whole limit more).
_SEED_WITHIN = """
local function seed_within(limit)
  if not redis.call('HGET', KEYS[1], '+') then
    local counted = tonumber(redis.call('HGET', KEYS[1], '#') or '0')
    redis.call('HSET', KEYS[1], '+', math.min(counted, limit))
  end
end
"""

#: KEYS: a player's minute (`rate_key`). ARGV: seconds to keep it, the limit, then the
#: identities of the batch's rows of that player in batch order (each holds a newline, so
#: none is '#' or '+', the fields that count the identities numbered and those of them
#: within the limit). A new identity is within the limit iff fewer than `limit` numbered
#: ones are (its number is then that count, else the count of all, which is past the limit):
#: after a give-back the room left is exact, where numbering every identity one past all
#: counted let a held one take the room of a kept one given back. Returns the identities
#: numbered in the minute, then per row its number and 1 if this call gave it (0: counted
#: before, by an earlier attempt, which decided alike).
RATE_SCRIPT = _SEED_WITHIN + """
local out = {0}
local limit = tonumber(ARGV[2])
seed_within(limit)
for i = 3, #ARGV do
  local n, new = redis.call('HGET', KEYS[1], ARGV[i]), 0
  if not n then
    n = redis.call('HINCRBY', KEYS[1], '#', 1)
    if tonumber(redis.call('HGET', KEYS[1], '+')) < limit then
      n = redis.call('HINCRBY', KEYS[1], '+', 1)
    end
    redis.call('HSET', KEYS[1], ARGV[i], n)
    new = 1
  end
  out[#out + 1] = tonumber(n)
  out[#out + 1] = new
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
out[1] = tonumber(redis.call('HGET', KEYS[1], '#'))
return out
"""

#: KEYS: a player's minute. ARGV: the limit, then identities of a batch's rows that did not
#: land. Their numbers go, and the counts with them (a minute already expired stays gone:
#: nothing is created); one HDEL each (a request may carry 10,000 rows of one player, past
#: what Lua's unpack takes).
GIVE_BACK_SCRIPT = _SEED_WITHIN + """
local limit, removed, within = tonumber(ARGV[1]), 0, 0
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
seed_within(limit)
for i = 2, #ARGV do
  local n = redis.call('HGET', KEYS[1], ARGV[i])
  if n then
    redis.call('HDEL', KEYS[1], ARGV[i])
    removed = removed + 1
    if tonumber(n) <= limit then within = within + 1 end
  end
end
if removed > 0 then redis.call('HINCRBY', KEYS[1], '#', -removed) end
if within > 0 then redis.call('HINCRBY', KEYS[1], '+', -within) end
return removed
"""


_RATE_SHA = hashlib.sha1(RATE_SCRIPT.encode()).hexdigest()
_GIVE_BACK_SHA = hashlib.sha1(GIVE_BACK_SCRIPT.encode()).hexdigest()


def rate_key(player_id: str, minute: int) -> str:
    """The counter of a player's events landed in one minute (minutes since the epoch).
    The key holds a hash of the id, not the id: an erasure leaves no trace of it in Redis
    or its AOF through these counters."""
    digest = hashlib.blake2b(player_id.encode(), digest_size=10).hexdigest()
    return f"lb:rate:{{{digest}}}:{minute}"


def row_identities(table: pa.Table) -> tuple[list[str], list[str]]:
    """Each row's player and its identity in the player's minute: the match_id, and a
    direct score's board (a table without `board` holds match events)."""
    matches = table.column("match_id").to_pylist()
    boards = (table.column("board").to_pylist() if "board" in table.column_names
              else [None] * table.num_rows)
    return (table.column("player_id").to_pylist(),
            [f"{m}\n{b or ''}" for m, b in zip(matches, boards, strict=True)])


def held_ids(path: Path) -> pa.Table:
    """The ids (match_id, player_id, ingested_at, and a direct score's board) a quarantine
    file holds for rate: their claims at the door stand like those of landed rows (a retry
    of them is a retry)."""
    ids = ["match_id", "player_id", "ingested_at"]
    if "board" in pq.read_schema(path).names:
        ids.append("board")
    table = pq.read_table(path, columns=[*ids, "reason"])
    held = table.filter(pc.equal(table.column("reason"), IMPLAUSIBLE_RATE))
    return held.select(ids)


@dataclass(frozen=True)
class Held:
    """The outcome of one batch: the rows that count, the rows held (quarantine form, with
    each held row's position in the input table), and what to give back if landing fails."""

    kept: pa.Table
    held: pa.Table
    held_rows: np.ndarray
    counted: dict[str, list[str]]  # per player: the identities this batch numbered
    minute: int


class PlayerRate:
    """The per-player limit over one Redis (every writer of the lake shares it)."""

    def __init__(self, client: redis.Redis, per_minute: int) -> None:
        self.client = client
        self.per_minute = per_minute

    def split(self, accepted: pa.Table, at: datetime, source: str) -> Held:
        """Count the batch's rows against each player's landing minute (one pipelined round
        trip); the rows past the limit are held."""
        minute = int(to_utc(at).timestamp() // 60)
        empty = Held(accepted, _HELD_SCHEMA.empty_table(), np.zeros(0, dtype=np.int64), {},
                     minute)
        if accepted.num_rows == 0:
            return empty
        players, identity = row_identities(accepted)
        rows_of: dict[str, list[int]] = {}
        for row, player in enumerate(players):
            rows_of.setdefault(player, []).append(row)
        pipe = ScriptPipeline(self.client)
        for player, rows in rows_of.items():
            pipe.script(RATE_SCRIPT, _RATE_SHA, [rate_key(player, minute)],
                        [_TTL, self.per_minute, *(identity[r] for r in rows)])
        keep = np.ones(len(players), dtype=bool)
        counted: dict[str, list[str]] = {}
        totals_of: dict[str, int] = {}
        for (player, rows), reply in zip(rows_of.items(), pipe.execute(), strict=True):
            totals_of[player] = int(reply[0])
            counted[player] = []
            for i, row in enumerate(rows):
                number, new = int(reply[1 + 2 * i]), int(reply[2 + 2 * i])
                keep[row] = number <= self.per_minute
                if new:
                    counted[player].append(identity[row])
        if keep.all():
            return Held(accepted, empty.held, empty.held_rows, counted, minute)
        held_rows = np.flatnonzero(~keep)
        return Held(accepted.filter(pa.array(keep)),
                    self._quarantined(accepted.take(pa.array(held_rows)), totals_of, minute,
                                      source),
                    held_rows, counted, minute)

    def give_back(self, held: Held, landed: Iterable[pa.Table] = ()) -> None:
        """The landing failed: uncount what the batch numbered and did not land, so that a
        batch never retried leaves its minute's room (its retry in the minute gets the same
        rows kept either way; the held rows are retries by then). `landed`: the files (their
        match_id, player_id and a score's board) the landing wrote before it failed, over
        several files: their rows count, so their numbers stay (given back, the player
        could land more than the limit in the minute)."""
        stay: set[tuple[str, str]] = set()
        for table in landed:
            stay.update(zip(*row_identities(table), strict=True))
        pipe = ScriptPipeline(self.client)
        for player, identities in held.counted.items():
            lost = [i for i in identities if (player, i) not in stay]
            if lost:
                pipe.script(GIVE_BACK_SCRIPT, _GIVE_BACK_SHA, [rate_key(player, held.minute)],
                            [self.per_minute, *lost])
        pipe.execute()

    def _quarantined(self, rows: pa.Table, totals: dict[str, int], minute: int,
                     source: str) -> pa.Table:
        """Held rows in quarantine form: the values as text, reason and detail."""
        start = datetime.fromtimestamp(minute * 60, tz=UTC)
        columns: dict[str, pa.Array] = {}
        for name in INPUT_FIELDS:
            if name == "event_time":
                columns[name] = pa.array([format_instant(t) for t in
                                          rows.column(name).to_pylist()], pa.string())
            else:
                columns[name] = pc.cast(rows.column(name), pa.string()).combine_chunks()
        # `sent`: the minute's count holds the held events too, which never landed.
        details = [f"player {player} sent {totals[player]} events in the minute from "
                   f"{format_instant(start)} (limits.player_events_per_minute = "
                   f"{self.per_minute}): held for review; `leaderboard quarantine release` "
                   "lands it if it is genuine"
                   for player in rows.column("player_id").to_pylist()]
        columns["reason"] = pa.array([IMPLAUSIBLE_RATE] * rows.num_rows, pa.string())
        columns["detail"] = pa.array(details, pa.string())
        columns["source"] = pa.array([source] * rows.num_rows, pa.string())
        if "board" in rows.column_names:  # direct scores: a release lands them on it
            columns["board"] = pc.cast(rows.column("board"), pa.string()).combine_chunks()
            return pa.table(columns, schema=_HELD_SCHEMA.append(pa.field("board", pa.string())))
        return pa.table(columns, schema=_HELD_SCHEMA)
