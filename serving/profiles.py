"""The serving cache of player profiles: one Redis hash, read in one HMGET per answer.

`lb:profiles` maps a player id to `<order>\\n<search key>\\n<profile JSON>` (the latest
write, by the lake log's `order`), plus one field `""` (no player id is empty) that says the
hash was loaded from the lake. Every read asks for that field in the same HMGET as the
players, so a hash that lost its data (a flush, a restart without the AOF) is seen on the
next read and reloaded from the lake's profile log then (`leaderboard.profiles`), before
answering. Writes go through one script that keeps a value only if its order is greater
than the one there, so a reload racing a new write, or two writers racing each other,
leave the latest write.
A sorted set beside it indexes the names for a prefix search (`find`, the console's). About
400 bytes a profile in Redis, both together (measured with 100k profiles).
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import redis

from leaderboard.lua import BYTES_AFTER
from leaderboard.profiles import PROFILES_KEY, Profile, latest_profiles
from leaderboard.timeutil import format_instant
from serving.merge import registered_script

__all__ = ["LOADED_FIELD", "NAMES_KEY", "ProfileCache", "search_key"]

#: The field that marks the hash as loaded from the lake (no player id is empty).
LOADED_FIELD = ""
#: The name index: a sorted set of `<search key>\0<player_id>` at score 0, searched by
#: prefix with ZRANGEBYLEX; in the hash's Redis Cluster slot (its hash tag is the hash's
#: name), so the one script keeps both.
NAMES_KEY = "{" + PROFILES_KEY + "}:names"
_CHUNK = 1000

#: KEYS[1]: the hash, KEYS[2]: the name index. ARGV: (player, order, search key, JSON)
#: quadruples; a value replaces the one there only if its order is greater (as bytes, as the
#: lake log sorts it, whatever the server's collation), and the index trades the old name's
#: member for the new one. Returns how many were written.
_SET_IF_SCRIPT = BYTES_AFTER + """
local written = 0
for i = 1, #ARGV, 4 do
  local old = redis.call('HGET', KEYS[1], ARGV[i])
  local older, oldkey = true, nil
  if old then
    local cut = string.find(old, '\\n', 1, true)
    older = cut ~= nil and {kept}
    local rest = cut and string.find(old, '\\n', cut + 1, true)
    if rest then oldkey = string.sub(old, cut + 1, rest - 1) end
  end
  if older then
    if oldkey then redis.call('ZREM', KEYS[2], oldkey .. '\\0' .. ARGV[i]) end
    redis.call('HSET', KEYS[1], ARGV[i],
               ARGV[i + 1] .. '\\n' .. ARGV[i + 2] .. '\\n' .. ARGV[i + 3])
    redis.call('ZADD', KEYS[2], 0, ARGV[i + 2] .. '\\0' .. ARGV[i])
    written = written + 1
  end
end
return written
"""
SET_NEWER_SCRIPT = _SET_IF_SCRIPT.replace(
    "{kept}", "bytes_after(ARGV[i + 1], string.sub(old, 1, cut - 1))")
#: The same, but a value also replaces one of the same order: an erasure redacted that
#: write in place (`ProfileCache.store(..., same_order=True)`).
SET_SAME_OR_NEWER_SCRIPT = _SET_IF_SCRIPT.replace(
    "{kept}", "not bytes_after(string.sub(old, 1, cut - 1), ARGV[i + 1])")


def search_key(name: str) -> str:
    """How names are compared in a search: NFKC, case-folded (so "ANN", "ann" and "Ann"
    find each other, and a full-width letter finds its ASCII twin)."""
    return unicodedata.normalize("NFKC", name).casefold()


def _encode(profile: Profile) -> str:
    return json.dumps({"display_name": profile.display_name, "country": profile.country,
                       "avatar_url": profile.avatar_url,
                       "updated_at": None if profile.updated_at is None
                       else format_instant(profile.updated_at)}, ensure_ascii=False,
                      separators=(",", ":"))


def _decode(raw: bytes | None) -> dict[str, Any] | None:
    """A cached value's profile: its last line (`<order>\n<search key>\n<JSON>`; the JSON
    and the key hold no raw newline, since a display name holds no control character)."""
    if raw is None:
        return None
    return json.loads(raw.rpartition(b"\n")[2])  # type: ignore[no-any-return]


class ProfileCache:
    """Latest profiles for serving, from Redis, reloaded from the lake when Redis lost them."""

    def __init__(self, client: redis.Redis, lake: Path) -> None:
        self.client = client
        self.lake = Path(lake)
        self._set_newer = registered_script(client, SET_NEWER_SCRIPT)
        self._set_same_or_newer = registered_script(client, SET_SAME_OR_NEWER_SCRIPT)

    def store(self, profiles: Iterable[Profile], *, same_order: bool = False) -> int:
        """Put profiles in the cache, each only if newer than the one there (one script
        call per _CHUNK profiles: plain calls, not a pipeline, so they run alike on a Redis
        Cluster, whose pipelines refuse EVALSHA); returns how many were written.
        `same_order`: also replace a value of the same order (a write an erasure redacted in
        the lake: its cached copy, and its name in the index, still held the id)."""
        script = self._set_same_or_newer if same_order else self._set_newer
        written = 0
        batch: list[str] = []
        for profile in profiles:
            batch += [profile.player_id, profile.order, search_key(profile.display_name),
                      _encode(profile)]
            if len(batch) >= 4 * _CHUNK:
                written += int(script(keys=[PROFILES_KEY, NAMES_KEY], args=batch))
                batch = []
        if batch:
            written += int(script(keys=[PROFILES_KEY, NAMES_KEY], args=batch))
        return written

    def reload(self, now: datetime | None = None) -> int:
        """Load every player's latest profile from the lake's log, then mark the hash
        loaded (last, so a reader never takes a half-loaded hash for a whole one); returns
        how many profiles the log holds. Safe to run while writes go on, and twice at once."""
        latest = latest_profiles(self.lake)
        self.store(latest.values())
        self.client.hset(PROFILES_KEY, LOADED_FIELD,
                         "loaded" if now is None else format_instant(now))
        return len(latest)

    def _fetch(self, players: Sequence[str]) -> list[bytes | None]:
        """The raw values of `players`, one HMGET (two and a reload after a loss)."""
        found = self.client.hmget(PROFILES_KEY, [LOADED_FIELD, *players])
        if found[0] is None:
            self.reload()
            found = self.client.hmget(PROFILES_KEY, [LOADED_FIELD, *players])
        return [value if isinstance(value, bytes | None) else value.encode()
                for value in found[1:]]

    def names(self, players: Sequence[str]) -> list[str | None]:
        """Each player's display name (None when unset), in one round trip."""
        if not players:
            return []
        return [None if value is None else value["display_name"]
                for value in map(_decode, self._fetch(players))]

    def forget(self, player: str) -> bool:
        """Remove a player's profile from the cache and every name of theirs from the index
        (an erasure; erase the lake's log first, `jobs.erase.erase_from_lake`, so no reload
        brings it back). Whether the cache held one. The index is swept for the
        player's members whatever the hash says (it may have lost the profile, or a rename
        raced): one ZSCAN of the index, which an erasure can afford. A reload that read the
        log before the erasure and writes after this call would put it back: run erasures
        while no reload runs (a reload runs only after Redis lost the hash)."""
        held = self.client.hdel(PROFILES_KEY, player) > 0
        suffix = b"\0" + player.encode()  # an id holds no glob character ([A-Za-z0-9_.:-])
        mine = [m for m, _ in self.client.zscan_iter(NAMES_KEY, match=b"*" + suffix,
                                                     count=1000) if m.endswith(suffix)]
        for start in range(0, len(mine), _CHUNK):
            self.client.zrem(NAMES_KEY, *mine[start:start + _CHUNK])
        return held

    def find(self, text: str, limit: int = 10) -> list[dict[str, Any]]:
        """Players whose display name starts with `text` (compared by `search_key`), by
        name then id, at most `limit`: one ZRANGEBYLEX on the name index and one HMGET."""
        key = search_key(text).encode()
        if not key or limit < 1:
            return []
        self._fetch([])  # a hash that lost its data is reloaded, the index with it
        members = self.client.zrangebylex(NAMES_KEY, b"[" + key, b"[" + key + b"\xff",
                                          start=0, num=limit)
        players = [(m if isinstance(m, bytes) else m.encode()).rpartition(b"\0")[2].decode()
                   for m in members]
        found = []
        for player, value in zip(players, map(_decode, self._fetch(players)), strict=True):
            if value is not None:
                found.append({"player_id": player, **value})
        return found

    def get(self, player: str) -> dict[str, Any] | None:
        """A player's latest profile (player_id, display_name, country, avatar_url,
        updated_at), or None."""
        value = _decode(self._fetch([player])[0])
        return None if value is None else {"player_id": player, **value}

