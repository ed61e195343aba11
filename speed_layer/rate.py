"""Per-player plausibility of rate: more than `limits.player_events_per_minute` events from
one player in one landing minute are held in quarantine (reason `implausible_rate`). Match
events and direct scores count alike against the player's minute (a score is one event); a
held score keeps its board in the quarantine, so a release lands it there.

Decided once, at landing, by a counter per (player, landing minute) in Redis that every
writer shares (INCRBY is atomic per key, so two writers never both take the last slot), and
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
from collections import Counter
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

__all__ = ["IMPLAUSIBLE_RATE", "Held", "PlayerRate", "held_ids", "rate_key"]

IMPLAUSIBLE_RATE = "implausible_rate"
#: Seconds a minute's counter outlives its minute.
_TTL = 120
_HELD_SCHEMA = QUARANTINE_SCHEMA.remove(QUARANTINE_SCHEMA.get_field_index("ingested_at"))


def rate_key(player_id: str, minute: int) -> str:
    """The counter of a player's events landed in one minute (minutes since the epoch).
    The key holds a hash of the id, not the id: an erasure leaves no trace of it in Redis
    or its AOF through these counters."""
    digest = hashlib.blake2b(player_id.encode(), digest_size=10).hexdigest()
    return f"lb:rate:{{{digest}}}:{minute}"


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
    counted: dict[str, int]  # per player: the batch's rows counted against their minute
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
        players = accepted.column("player_id").to_pylist()
        counts = Counter(players)
        pipe = self.client.pipeline(transaction=False)
        for player, count in counts.items():
            pipe.incrby(rate_key(player, minute), count)
            pipe.expire(rate_key(player, minute), _TTL)
        totals = pipe.execute()[0::2]
        # Per player: how many of this batch's rows still fit in the minute.
        room = {player: max(0, min(count, self.per_minute - (int(total) - count)))
                for (player, count), total in zip(counts.items(), totals, strict=True)}
        counted = dict(counts)
        if all(room[p] == counts[p] for p in counts):
            return Held(accepted, empty.held, empty.held_rows, counted, minute)
        keep = np.ones(len(players), dtype=bool)
        for row, player in enumerate(players):
            if room[player] > 0:
                room[player] -= 1
            else:
                keep[row] = False
        held_rows = np.flatnonzero(~keep)
        totals_of = dict(zip(counts, (int(t) for t in totals), strict=True))
        return Held(accepted.filter(pa.array(keep)),
                    self._quarantined(accepted.take(pa.array(held_rows)), totals_of, minute,
                                      source),
                    held_rows, counted, minute)

    def give_back(self, held: Held) -> None:
        """The kept rows did not land (the landing failed): uncount the whole batch, so
        that its retry (the held rows are retries by then) gets the room the first attempt
        had and keeps the same rows."""
        if not held.counted:
            return
        pipe = self.client.pipeline(transaction=False)
        for player, count in held.counted.items():
            if count:
                pipe.decrby(rate_key(player, held.minute), count)
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
        details = [f"player {player} landed {totals[player]} events in the minute from "
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
