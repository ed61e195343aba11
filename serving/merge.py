"""Merged rank queries for one board-window: the batch view's base plus the speed state.

With base B (standings of version V), `M` (merged keys of touched players) and `T` (their
base keys) of the same version, and x a player's merged key:
    rank(p) = 1 + count_B(key > x) - count_T(key > x) + count_M(key > x)
    total   = |B| - |T| + |M|
and listings merge B without touched players with M, key descending, player_id ascending.
Under `earliest` ties ranks are ordinal (equal keys ranked by player_id).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from leaderboard.calendar import Window
from leaderboard.registry import Board
from leaderboard.sortkey import decode
from leaderboard.speed_keys import BoardWindowKeys
from serving.base import BaseBoard

__all__ = ["RANK_SCRIPT", "Entry", "MergedBoard", "registered_script"]

_CHUNK = 256

#: One round trip for a player's merged key, the touched and merged counts above it and the
#: two cardinalities. KEYS: M, T, B. ARGV: player, base key ('' if the base lacks the player).
#: Reply: {key or '', count_T(> key), count_M(> key), |T|, |M|}.
RANK_SCRIPT = """
local p = ARGV[1]
local x = false
if redis.call('SISMEMBER', KEYS[3], p) == 0 then
  x = redis.call('ZSCORE', KEYS[1], p)
  if not x and not redis.call('ZSCORE', KEYS[2], p) and ARGV[2] ~= '' then x = ARGV[2] end
end
local t, m = redis.call('ZCARD', KEYS[2]), redis.call('ZCARD', KEYS[1])
if not x then return {'', 0, 0, t, m} end
return {x, redis.call('ZCOUNT', KEYS[2], '(' .. x, '+inf'),
        redis.call('ZCOUNT', KEYS[1], '(' .. x, '+inf'), t, m}
"""


@dataclass(frozen=True)
class Entry:
    player_id: str
    score: int
    sort_key: int
    rank: int

    def as_dict(self) -> dict[str, Any]:
        return {"player_id": self.player_id, "score": self.score, "rank": self.rank}


_SCRIPTS: dict[tuple[int, str], Any] = {}


def registered_script(client: redis.Redis, text: str) -> Any:
    """A script registered once per client (EVALSHA, loaded again after NOSCRIPT)."""
    found = _SCRIPTS.get((id(client), text))
    if found is None or found.registered_client is not client:
        found = _SCRIPTS[(id(client), text)] = client.register_script(text)
    return found


def _rank_script(client: redis.Redis) -> Any:
    """RANK_SCRIPT registered once per client."""
    return registered_script(client, RANK_SCRIPT)


def _scored(raw: Any) -> list[tuple[int, str]]:
    """(key, player) pairs from a WITHSCORES reply (the client types it loosely)."""
    return [(int(score), member.decode()) for member, score in raw]


def _order(entry: tuple[int, str]) -> tuple[int, str]:
    return (-entry[0], entry[1])


class MergedBoard:
    """Queries over one board-window of one version (base arrays + Redis)."""

    def __init__(self, board: Board, window: Window, time_bits: int, base: BaseBoard,
                 client: redis.Redis, keys: BoardWindowKeys) -> None:
        self.board = board
        self.window = window
        self.time_bits = time_bits
        self.base = base
        self.client = client
        self.keys = keys
        self.ordinal = board.ties == "earliest"
        self._rank_script = _rank_script(client)

    # -- keys -------------------------------------------------------------------------------

    def score_of(self, key: int) -> int:
        return decode(key, order=self.board.order, ties=self.board.ties,
                      time_bits=self.time_bits)[0]

    def keys_of(self, players: Sequence[str]) -> list[int | None]:
        """Merged keys (None: unknown or banned), one round trip for all players."""
        if not players:
            return []
        pipe = self.client.pipeline(transaction=False)
        pipe.zmscore(self.keys.merged, list(players))
        pipe.zmscore(self.keys.touched, list(players))
        pipe.smismember(self.keys.banned, list(players))
        merged, touched, banned = pipe.execute()
        found: list[int | None] = []
        for player, m, t, b in zip(players, merged, touched, banned, strict=True):
            if b or (m is None and t is not None):
                found.append(None)  # banned, or removed from the speed state
            elif m is not None:
                found.append(int(m))
            else:
                found.append(self.base.key_of(player))
        return found

    # -- counts -----------------------------------------------------------------------------

    def _ties_before(self, key: int, player: str) -> int:
        """Merged entries with the same key listed before `player` (earliest ties only)."""
        start, end = self.base.count_above(key), self.base.count_at_least(key)
        base_ids = self.base.players_in(start, end)
        pipe = self.client.pipeline(transaction=False)
        pipe.zrangebyscore(self.keys.merged, key, key)
        pipe.zrangebyscore(self.keys.touched, key, key)
        merged, touched = pipe.execute()
        touched_ids = {t.decode() for t in touched}
        before = bisect_left(base_ids, player) - sum(1 for t in touched_ids if t < player)
        before += sum(1 for m in merged if m.decode() < player)
        return before

    def ranks_of(self, keyed: Sequence[tuple[int, str]]) -> list[int]:
        """Board ranks of (key, player) pairs of present players, one round trip."""
        if not keyed:
            return []
        pipe = self.client.pipeline(transaction=False)
        for key, _ in keyed:
            pipe.zcount(self.keys.touched, f"({key}", "+inf")
            pipe.zcount(self.keys.merged, f"({key}", "+inf")
        counts = pipe.execute()
        ranks = []
        for i, (key, player) in enumerate(keyed):
            above = self.base.count_above(key) - counts[2 * i] + counts[2 * i + 1]
            if self.ordinal:
                above += self._ties_before(key, player)
            ranks.append(1 + above)
        return ranks

    def total(self) -> int:
        pipe = self.client.pipeline(transaction=False)
        pipe.zcard(self.keys.touched)
        pipe.zcard(self.keys.merged)
        touched, merged = pipe.execute()
        return int(self.base.size - touched + merged)

    # -- queries ----------------------------------------------------------------------------

    def player(self, player: str) -> Entry | None:
        return self.lookup(player)[0]

    def lookup(self, player: str) -> tuple[Entry | None, int, int | None]:
        """(the player's entry or None, the board's total, the player's base position or
        None), in one round trip (two for an `earliest` board whose key is tied)."""
        position = self.base.position(player)
        base_key = None if position is None else self.base.key_at(position)
        raw, touched_above, merged_above, touched, merged = self._rank_script(
            keys=[self.keys.merged, self.keys.touched, self.keys.banned],
            args=[player, "" if base_key is None else base_key])
        total = self.base.size - int(touched) + int(merged)
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        if not text:
            return None, total, position
        key = int(float(text)) if ("e" in text or "." in text) else int(text)
        above = self.base.count_above(key) - int(touched_above) + int(merged_above)
        if self.ordinal:
            above += self._ties_before(key, player)
        return Entry(player, self.score_of(key), key, 1 + above), total, position

    def _base_walk(self, start: int, step: int, want: int) -> list[tuple[int, str]]:
        """Up to `want` base entries from index `start` moving by `step`, skipping players
        the speed layer touched (their merged key is in M, or they are gone)."""
        found: list[tuple[int, str]] = []
        index = start
        while len(found) < want and 0 <= index < self.base.size:
            if step > 0:
                chunk = range(index, min(index + _CHUNK, self.base.size))
            else:
                chunk = range(index, max(index - _CHUNK, -1), -1)
            ids = (self.base.players_in(chunk[0], chunk[-1] + 1) if step > 0
                   else self.base.players_in(chunk[-1], chunk[0] + 1)[::-1])
            touched = self.client.zmscore(self.keys.touched, ids)
            for i, player, t in zip(chunk, ids, touched, strict=True):
                if t is None:
                    found.append((self.base.key_at(i), player))
                    if len(found) >= want:
                        break
            index = chunk[-1] + step
        return found

    def _with_ranks(self, listing: list[tuple[int, str]], first_rank_known: int | None
                    ) -> list[Entry]:
        """Entries for a contiguous slice of the merged listing."""
        if not listing:
            return []
        if self.ordinal and first_rank_known is not None:
            ranks = [first_rank_known + i for i in range(len(listing))]
        else:
            distinct: dict[int, int] = {}
            firsts: list[tuple[int, str]] = []
            for key, player in listing:
                if key not in distinct:
                    distinct[key] = len(firsts)
                    firsts.append((key, player))
            key_ranks = self.ranks_of(firsts) if not self.ordinal else [0] * len(firsts)
            if self.ordinal:
                ranks = self.ranks_of(listing)
            else:
                ranks = [key_ranks[distinct[key]] for key, _ in listing]
        return [Entry(p, self.score_of(k), k, r) for (k, p), r in zip(listing, ranks,
                                                                       strict=True)]

    def top(self, n: int, offset: int = 0) -> list[Entry]:
        """Entries [offset, offset + n) of the merged listing."""
        want = offset + n
        merged_raw = self.client.zrange(self.keys.merged, 0, want - 1, desc=True,
                                        withscores=True)
        merged = _scored(merged_raw)
        if merged:
            boundary = merged[-1][0]  # fetch every tie at the cut, so player order is exact
            merged = [e for e in merged if e[0] != boundary] + _scored(
                self.client.zrangebyscore(self.keys.merged, boundary, boundary,
                                          withscores=True))
        listing = sorted(merged + self._base_walk(0, 1, want), key=_order)[offset:want]
        return self._with_ranks(listing, offset + 1)

    def around(self, player: str, k: int) -> tuple[Entry | None, list[Entry], list[Entry]]:
        """(the player, up to k entries listed before, up to k after)."""
        me = self.player(player)
        if me is None:
            return None, [], []
        x = me.sort_key
        pipe = self.client.pipeline(transaction=False)
        pipe.zrangebyscore(self.keys.merged, f"({x}", "+inf", start=0, num=k, withscores=True)
        pipe.zrevrangebyscore(self.keys.merged, f"({x}", "-inf", start=0, num=k,
                              withscores=True)
        pipe.zrangebyscore(self.keys.merged, x, x, withscores=True)
        higher, lower, equal = pipe.execute()
        # A tie group cut by LIMIT may hide nearer players: fetch the cut groups whole.
        for group in (higher, lower):
            if len(group) == k and group:
                cut = group[-1][1]
                group.extend(self.client.zrangebyscore(self.keys.merged, cut, cut,
                                                       withscores=True))
        candidates = _scored([*higher, *lower, *equal])
        top_index = self.base.count_above(x)
        end_index = self.base.count_at_least(x)
        candidates += self._base_walk(top_index - 1, -1, k)
        candidates += self._base_walk(end_index, 1, k)
        candidates += [e for e in self._base_walk(top_index, 1, end_index - top_index)
                       if e[0] == x]
        ordered = sorted(set(candidates) - {(x, player)}, key=_order)
        position = bisect_left([_order(e) for e in ordered], _order((x, player)))
        above = ordered[max(0, position - k):position]
        below = ordered[position:position + k]
        first = me.rank - len(above) if self.ordinal else None
        entries_above = self._with_ranks(above, first)
        entries_below = self._with_ranks(below, me.rank + 1 if self.ordinal else None)
        return me, entries_above, entries_below

    def friends(self, players: Sequence[str]) -> list[Entry]:
        """The given players ranked on the board, in listing order (unknown ones left out)."""
        unique = list(dict.fromkeys(players))
        keyed = [(key, p) for p, key in zip(unique, self.keys_of(unique), strict=True)
                 if key is not None]
        keyed.sort(key=_order)
        ranks = self.ranks_of(keyed)
        return [Entry(p, self.score_of(k), k, r) for (k, p), r in zip(keyed, ranks,
                                                                       strict=True)]
