"""The top-N cache: the hottest query answered from memory for a second or two.

Every game client polls the same few top-N pages, and each answer costs several Redis round
trips and a walk of the base arrays. Answers are kept for `ttl` seconds (1-5 s), keyed by
(version tag, board, window id, n, cursor), so a new batch version is a new key and never
serves the old one's answer. One refresh runs per key at a time (single flight): threads
asking for a key being refreshed wait for that result instead of computing it again. When
Redis fails, the last answer is served for up to `max_stale` seconds; past that the cache
raises `CacheUnavailable` rather than serve a board that may be long out of date.

Answers are kept (for that stale fallback) until pushed out, least recently used first, by
`max_entries` or `max_bytes`: a client walking thousands of (window, n, cursor) keys fills
the cache with up to 1000-entry pages, so the bound is in bytes too. An answer weighs its
length when it is bytes (the HTTP app's encoded JSON), else its shallow `sys.getsizeof`.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import redis

from leaderboard.speed_keys import StateLost
from serving.service import Leaderboards, decode_cursor

__all__ = ["DEFAULT_MAX_STALE", "DEFAULT_TTL", "CacheStats", "CacheUnavailable", "TopCache"]

DEFAULT_TTL = 2.0
DEFAULT_MAX_STALE = 60.0
_MAX_ENTRIES = 4096
#: 64 MiB: about a thousand full 1000-entry pages, or all 4096 keys of 16 KB pages.
_MAX_BYTES = 64 * 1024 * 1024

T = TypeVar("T")

#: Failures that mean "the speed layer is unreachable", which a stale answer may cover.
UNAVAILABLE: tuple[type[BaseException], ...] = (redis.RedisError, OSError)


class CacheUnavailable(RuntimeError):
    """Redis failed and no cached answer is young enough to serve in its place."""


@dataclass(frozen=True)
class CacheStats:
    """Counts since start: `hits` fresh answers, `misses` computations, `coalesced` waits on
    another thread's refresh, `stale` answers served while Redis failed, `failures`
    refreshes that failed; now, `entries` kept and their `bytes`."""

    hits: int
    misses: int
    coalesced: int
    stale: int
    failures: int
    entries: int = 0
    bytes: int = 0

    @property
    def hit_ratio(self) -> float:
        """Share of answers that needed no computation of their own."""
        served = self.hits + self.misses + self.coalesced + self.stale
        return 0.0 if served == 0 else (self.hits + self.coalesced + self.stale) / served


@dataclass
class _Entry:
    value: Any
    computed_at: float
    size: int = 0
    players: frozenset[str] = frozenset()  # the players the answer lists


def _size(value: Any) -> int:
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value)
    return sys.getsizeof(value)


class _Flight(Generic[T]):
    """One refresh in progress; followers wait on `done`."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None


class TopCache:
    """A TTL cache with single-flight refreshes and bounded stale serving (thread-safe)."""

    def __init__(self, ttl: float = DEFAULT_TTL, max_stale: float = DEFAULT_MAX_STALE, *,
                 clock: Callable[[], float] = time.monotonic,
                 unavailable: tuple[type[BaseException], ...] = UNAVAILABLE,
                 max_entries: int = _MAX_ENTRIES, max_bytes: int = _MAX_BYTES) -> None:
        if ttl <= 0:
            raise ValueError(f"ttl {ttl!r} must be > 0 seconds")
        if max_stale < ttl:
            raise ValueError(f"max_stale {max_stale!r} must be >= ttl {ttl!r}")
        self.ttl = ttl
        self.max_stale = max_stale
        self.clock = clock
        self.unavailable = unavailable
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._bytes = 0
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._flights: dict[Hashable, _Flight[Any]] = {}
        self._down_since: float | None = None  # last failure, while Redis is failing
        self._last_tag: str | None = None
        self._hits = self._misses = self._coalesced = self._stale = self._failures = 0

    # -- the generic part -------------------------------------------------------------------

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        """The cached value of `key`, computed by one caller at a time when it is missing or
        older than the TTL. While `compute` fails with an `unavailable` error the previous
        value is returned if younger than `max_stale`; other errors propagate."""
        return self._get(key, lambda: (compute(), frozenset()))

    def _get(self, key: Hashable, compute: Callable[[], tuple[T, frozenset[str]]]) -> T:
        """`get`, where `compute` also names the players its value lists (for
        `forget_players`)."""
        with self._lock:
            now = self.clock()
            entry = self._entries.get(key)
            if entry is not None and now - entry.computed_at < self.ttl:
                self._hits += 1
                self._entries.move_to_end(key)
                return entry.value  # type: ignore[no-any-return]
            if (entry is not None and self._down_since is not None
                    and now - self._down_since < self.ttl
                    and now - entry.computed_at <= self.max_stale):
                # Redis failed a moment ago: do not make every request wait on it again.
                self._stale += 1
                return entry.value  # type: ignore[no-any-return]
            flight = self._flights.get(key)
            leader = flight is None
            if flight is None:
                flight = self._flights[key] = _Flight()
                self._misses += 1
            else:
                self._coalesced += 1
        if not leader:
            flight.done.wait()
            if flight.error is None:
                return flight.value  # type: ignore[return-value]
            return cast(T, self._fallback(key, flight.error))
        try:
            value, players = compute()
        except BaseException as exc:
            with self._lock:
                self._failures += 1
                if isinstance(exc, self.unavailable):
                    self._down_since = self.clock()
                del self._flights[key]
            flight.error = exc
            flight.done.set()
            return cast(T, self._fallback(key, exc))
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.size
            entry = self._entries[key] = _Entry(value, self.clock(), _size(value), players)
            self._bytes += entry.size
            while self._entries and (len(self._entries) > self.max_entries
                                     or self._bytes > self.max_bytes):
                self._bytes -= self._entries.popitem(last=False)[1].size
            self._down_since = None
            del self._flights[key]
        flight.value = value
        flight.done.set()
        return value

    def _fallback(self, key: Hashable, error: BaseException) -> Any:
        """The stale value of `key` after a failed refresh, or the error."""
        if not isinstance(error, self.unavailable):
            raise error
        with self._lock:
            entry = self._entries.get(key)
            age = None if entry is None else self.clock() - entry.computed_at
            if entry is not None and age is not None and age <= self.max_stale:
                self._stale += 1
                return entry.value
        if age is None:
            raise CacheUnavailable(
                f"the speed layer (Redis) is unavailable ({error}) and this answer was never "
                "cached; retry when Redis is back") from error
        raise CacheUnavailable(
            f"the speed layer (Redis) is unavailable ({error}) and the cached answer is "
            f"{age:.0f} s old, past the {self.max_stale:.0f} s limit (LEADERBOARD_TOP_STALE); "
            "retry when Redis is back") from error

    def clear(self) -> None:
        """Forget every answer (after a ban or unban, which must show in the next read)."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def forget_players(self, players: Iterable[str]) -> int:
        """Forget every answer that lists one of `players` (their profile changed, so the
        display name it holds is old); returns how many were forgotten."""
        wanted = frozenset(players)
        with self._lock:
            gone = [key for key, entry in self._entries.items() if entry.players & wanted]
            for key in gone:
                self._bytes -= self._entries.pop(key).size
        return len(gone)

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, self._misses, self._coalesced, self._stale,
                              self._failures, len(self._entries), self._bytes)

    # -- top-N ------------------------------------------------------------------------------

    def top(self, boards: Leaderboards, board: str, n: int = 100, window: str | None = None,
            cursor: str | None = None, *, encode: Callable[[dict[str, Any]], Any] | None = None
            ) -> Any:
        """`boards.top(...)` through the cache. The version tag is read from Redis on every
        call (one GET), so a rebase is seen at once; while Redis fails, the last tag seen
        stands in for it, so the stale answer of the right key can be found. `encode` (e.g.
        to JSON bytes) is applied once per refresh and cached in place of the answer."""
        found_board, found = boards.resolve(board, window)  # QueryError: never cached
        decode_cursor(cursor)  # a bad cursor is the caller's error whatever Redis says
        failure: BaseException | None = None
        try:
            tag = boards.version().version.tag
            with self._lock:
                self._last_tag = tag
        except self.unavailable as exc:
            failure = exc
            with self._lock:
                last = self._last_tag
            if last is None:
                if isinstance(exc, StateLost):
                    raise  # says what to run (and lets the app start the rebuild)
                raise CacheUnavailable(
                    f"the speed layer (Redis) is unavailable ({exc}) and nothing is cached "
                    "yet; retry when Redis is back") from exc
            tag = last
        key = (tag, found_board.name, found.id, n, cursor or "", encode)

        def compute() -> tuple[Any, frozenset[str]]:
            if failure is not None:
                raise failure
            answer = boards.top(found_board.name, n, found.id, cursor)
            listed = frozenset(e["player_id"] for e in answer["entries"])
            return (answer if encode is None else encode(answer)), listed

        return self._get(key, compute)
