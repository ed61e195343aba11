"""The base arrays a serving process keeps: least recently used first out, bounded by bytes.

Every board-window a client asks for is loaded from the batch view's Parquet into compact
arrays (`serving.base`). Kept without a bound, a client walking every historic window id
(years of daily windows) would grow the process until it dies; kept by count, one large
all-time board weighs as much as ten thousand small daily ones. So the bound is in bytes
(`BaseBoard.nbytes`, measured once the lookup index is built, plus `ENTRY_OVERHEAD` for the
objects around the arrays, so that thousands of empty windows count too), entries leave in
least recently used order, and a board-window larger than the whole bound is served but not
kept (a warning names the setting to raise). A new version drops every entry of the old one at once.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from leaderboard.settings import DEFAULT_BASE_CACHE_BYTES
from serving.base import BaseBoard

__all__ = ["DEFAULT_BASE_CACHE_BYTES", "ENTRY_OVERHEAD", "BaseCache", "BaseCacheStats"]

#: Bytes an entry costs beyond its arrays: the BaseBoard, numpy and Arrow objects and Arrow's
#: 64-byte buffer padding, measured at ~0.7 KiB (tracemalloc + Arrow's pool, empty board),
#: plus the key and the LRU link.
ENTRY_OVERHEAD = 1024

_log = logging.getLogger(__name__)

Key = tuple[str, str, str]  # (version tag, board, window id)


@dataclass(frozen=True)
class BaseCacheStats:
    """`bytes` and `entries` held now against `max_bytes`; since start, `evictions`
    (entries dropped for room, not for a new version) and `oversized` (loads larger than the
    whole bound, served without being kept)."""

    bytes: int
    entries: int
    max_bytes: int
    evictions: int
    oversized: int


class BaseCache:
    """(version tag, board, window id) -> BaseBoard, LRU under `max_bytes` (thread-safe)."""

    def __init__(self, max_bytes: int = DEFAULT_BASE_CACHE_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes {max_bytes} must be >= 0")
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[Key, tuple[BaseBoard, int]] = OrderedDict()
        self._bytes = 0
        self._evictions = 0
        self._oversized = 0

    def get(self, key: Key, load: Callable[[], BaseBoard]) -> BaseBoard:
        """The cached base of `key`, or `load()` kept in its place (two threads missing the
        same key at once may both load it; the second result is kept)."""
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                return found[0]
        base = load()
        size = base.nbytes() + ENTRY_OVERHEAD
        with self._lock:
            if size > self.max_bytes:
                self._oversized += 1
                _log.warning(
                    "board-window %s %s holds %d bytes of base arrays, more than "
                    "LEADERBOARD_BASE_CACHE_BYTES=%d: served but not kept, so every query on "
                    "it reloads it; raise the setting above its size", key[1], key[2], size,
                    self.max_bytes)
                return base
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._entries[key] = (base, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped
                self._evictions += 1
        return base

    def keep_version(self, tag: str) -> None:
        """Drop every entry of another version (the pointer moved; they are never asked
        for again)."""
        with self._lock:
            for key in [k for k in self._entries if k[0] != tag]:
                self._bytes -= self._entries.pop(key)[1]

    def stats(self) -> BaseCacheStats:
        with self._lock:
            return BaseCacheStats(self._bytes, len(self._entries), self.max_bytes,
                                  self._evictions, self._oversized)
