"""The serving layer's entry point: every query the game and the CLI ask, for any board and
window, answered from the live version's batch view merged with its speed state.

The version comes from the speed layer's pointer (`lb:current`), so base V+1 is never merged
with speed state V; base arrays are loaded once per (version, board-window) and reloaded when
the pointer moves.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import redis

from leaderboard.batch_view import BatchView
from leaderboard.calendar import Window
from leaderboard.manifest import list_versions, read_current, read_version
from leaderboard.percentile import position_for, top_percent
from leaderboard.registry import Board, Registry
from leaderboard.speed_keys import BoardWindowKeys, SpeedVersion, read_live_version
from leaderboard.timeutil import format_instant
from serving.base import load_base
from serving.basecache import DEFAULT_BASE_CACHE_BYTES, BaseCache
from serving.merge import MergedBoard
from serving.percentiles import keys_at
from serving.profiles import ProfileCache

__all__ = ["MAX_AROUND_K", "MAX_CURSOR_OFFSET", "MAX_FRIENDS", "MAX_TOP_N", "UNRANKED",
           "CursorError", "Leaderboards", "QueryError", "decode_cursor", "encode_cursor"]

UNRANKED = "unranked"

#: Bounds every front end (HTTP, CLI) applies, so no query walks an unbounded listing.
MAX_TOP_N = 1000
MAX_AROUND_K = 50
MAX_FRIENDS = 500


class QueryError(ValueError):
    """A query the registry cannot answer (unknown board or window); say what is valid."""


@dataclass
class _Loaded:
    version: SpeedVersion
    view: BatchView | None


class Leaderboards:
    def __init__(self, lake: Path, registry: Registry, client: redis.Redis,
                 now: Callable[[], datetime], *, pointer_ttl: float = 0.0,
                 base_cache_bytes: int = DEFAULT_BASE_CACHE_BYTES) -> None:
        """`pointer_ttl`: seconds the version pointer read from Redis is reused (0: read on
        every query). A server may reuse it briefly: after a rebase flips the pointer, the
        old version's keys live on for an hour, so a query up to that late is still answered
        consistently from one version, just that much older. `base_cache_bytes`: the bound
        on the base arrays kept between queries (`serving.basecache`)."""
        self.lake = Path(lake)
        self.registry = registry
        self.client = client
        self.now = now
        self._loaded: _Loaded | None = None
        self.pointer_ttl = pointer_ttl
        self._clock: Callable[[], float] = time.monotonic
        self._pointer: tuple[float, SpeedVersion | None] | None = None
        self.bases = BaseCache(base_cache_bytes)
        self.profiles = ProfileCache(client, self.lake)

    # -- version and windows ----------------------------------------------------------------

    def _read_pointer(self) -> SpeedVersion | None:
        """The live speed version (None: no state was ever needed); raises StateLost when
        the speed state lost its past, so a lost state is never served as merged truth."""
        if self.pointer_ttl <= 0:
            return read_live_version(self.client, self.lake)
        now = self._clock()
        cached = self._pointer
        if cached is not None and now - cached[0] < self.pointer_ttl:
            return cached[1]
        pointer = read_live_version(self.client, self.lake)
        self._pointer = (now, pointer)
        return pointer

    def forget_pointer(self) -> None:
        """Read the pointer afresh on the next query (a loss of the speed state was seen)."""
        self._pointer = None

    def version(self) -> _Loaded:
        pointer = self._read_pointer()
        if pointer is None:
            manifest = read_current(self.lake)
            pointer = SpeedVersion(None if manifest is None else manifest.version,
                                   None if manifest is None else manifest.watermark_at)
        if self._loaded is None or self._loaded.version.tag != pointer.tag:
            view = None
            if pointer.version is not None:
                view = BatchView(self.lake, read_version(self.lake, pointer.version))
            self._loaded = _Loaded(pointer, view)
            self.bases.keep_version(pointer.tag)
        return self._loaded

    def resolve(self, board_name: str, window: str | None) -> tuple[Board, Window]:
        try:
            board = self.registry.board(board_name)
        except ValueError as exc:
            raise QueryError(str(exc)) from None
        spec = window or "all-time"
        try:
            found = self.registry.calendar.resolve(spec, self.now())
        except ValueError as exc:
            raise QueryError(str(exc)) from None
        if found.kind not in board.windows:
            raise QueryError(f"board {board.name} has no {found.kind} window; it has "
                             f"{', '.join(board.windows)}")
        return board, found

    def merged(self, board_name: str, window: str | None) -> MergedBoard:
        return self._merged(board_name, window)[0]

    def _merged(self, board_name: str, window: str | None) -> tuple[MergedBoard, _Loaded]:
        board, found = self.resolve(board_name, window)
        loaded = self.version()
        key = (loaded.version.tag, board.name, found.id)
        base = self.bases.get(key, lambda: load_base(loaded.view, board.name, found.id,
                                                     ordinal=board.ties == "earliest"))
        bits = self.registry.layout(board, found.kind).time_bits
        return MergedBoard(board, found, bits, base, self.client,
                           BoardWindowKeys(board.name, found.id, loaded.version.tag)), loaded

    def _named(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`entries` with each player's `display_name` (None when unset), fetched in one
        HMGET for the whole answer."""
        names = self.profiles.names([e["player_id"] for e in entries])
        for entry, name in zip(entries, names, strict=True):
            entry["display_name"] = name
        return entries

    # -- queries ----------------------------------------------------------------------------

    def player(self, board: str, player: str, window: str | None = None) -> dict[str, Any]:
        merged, loaded = self._merged(board, window)
        entry, total, position = merged.lookup(player)
        answer: dict[str, Any] = {"board": merged.board.name, "window": merged.window.id,
                                  "player_id": player}
        self._named([answer])
        yesterday: dict[str, Any] | None = None
        if loaded.view is not None and position is not None:
            yesterday = {"rank": merged.base.rank_at(position),
                         "score": merged.score_of(merged.base.key_at(position)),
                         "as_of": loaded.view.as_of}
        if entry is None:
            answer.update({"status": UNRANKED, "rank": None, "score": None,
                           "percentile": None, "total": total,
                           "as_of_yesterday": yesterday, "change": None})
            return answer
        answer.update({
            "status": "ranked", "rank": entry.rank, "score": entry.score, "total": total,
            "percentile": 100.0 * (total - entry.rank + 1) / total,
            "as_of_yesterday": yesterday,
            "change": None if yesterday is None else yesterday["rank"] - entry.rank,
        })
        return answer

    def top(self, board: str, n: int = 100, window: str | None = None,
            cursor: str | None = None) -> dict[str, Any]:
        offset = decode_cursor(cursor)  # bad input says so whatever the state's health
        merged = self.merged(board, window)
        entries = merged.top(n, offset)
        total = merged.total()
        following = offset + len(entries)
        return {"board": merged.board.name, "window": merged.window.id, "total": total,
                "entries": self._named([e.as_dict() for e in entries]),
                "next_cursor": encode_cursor(following) if following < total else None}

    def around(self, board: str, player: str, k: int = 5,
               window: str | None = None) -> dict[str, Any]:
        merged = self.merged(board, window)
        me, above, below = merged.around(player, k)
        listed = self._named([e.as_dict() for e in [*above, *([] if me is None else [me]),
                                                    *below]])
        return {"board": merged.board.name, "window": merged.window.id,
                "player": None if me is None else listed[len(above)],
                "status": UNRANKED if me is None else "ranked",
                "above": listed[:len(above)], "below": listed[len(listed) - len(below):]}

    def friends(self, board: str, players: Sequence[str],
                window: str | None = None) -> dict[str, Any]:
        merged = self.merged(board, window)
        ranked = merged.friends(players)
        known = {e.player_id for e in ranked}
        return {"board": merged.board.name, "window": merged.window.id,
                "entries": self._named([{**e.as_dict(), "friend_rank": i + 1}
                                        for i, e in enumerate(ranked)]),
                "unranked": [p for p in dict.fromkeys(players) if p not in known]}

    def percentiles(self, board: str, window: str | None = None,
                    tops: Sequence[float | str] | None = None) -> dict[str, Any]:
        """The score needed now to be in the top y% of the merged board for each y of `tops`
        (default 1, 2, ... 100): the score at position ceil(y/100 * total), exact
        (docs/design.md section 6); and the batch view's equal-width histogram (as of the
        base version)."""
        percents = ([Decimal(y) for y in range(1, 101)] if tops is None
                    else [_top_percent(y) for y in tops])
        merged, loaded = self._merged(board, window)
        total, keys = keys_at(merged, percents)
        rows = [{"top_percent": int(y) if y == y.to_integral_value() else float(y),
                 "score": merged.score_of(key), "players": position_for(y, total)}
                for y, key in zip(percents, keys, strict=True) if key is not None]
        table = None if loaded.view is None else loaded.view.histogram(merged.board.name,
                                                                       merged.window.id)
        histogram = [] if table is None else [
            {"lower": r["lower"], "upper": r["upper"], "players": r["players"]}
            for r in table.to_pylist() if r["kind"] == "width"]
        return {"board": merged.board.name, "window": merged.window.id, "total": total,
                "as_of": None if loaded.view is None else loaded.view.as_of,
                "top_percent": rows, "histogram": histogram}

    def score_for_percentile(self, board: str, top: float | str,
                             window: str | None = None) -> int | None:
        """The score needed now to be in the top `top` % of the merged board, `top` in
        (0, 100]: the score at position ceil(top/100 * total), a score someone holds (None
        on an empty board)."""
        merged = self.merged(board, window)
        key = keys_at(merged, [_top_percent(top)])[1][0]
        return None if key is None else merged.score_of(key)

    def history(self, board: str, player: str, window_kind: str = "all-time",
                first: date | None = None, last: date | None = None) -> list[dict[str, Any]]:
        """The player's rank in the window of `window_kind` open on each as_of date."""
        board_obj = self.registry.board(board)
        found = []
        latest: dict[str, Any] = {}
        for manifest in list_versions(self.lake):
            latest[manifest.as_of] = manifest
        for as_of in sorted(latest):
            day = date.fromisoformat(as_of)
            if (first and day < first) or (last and day > last):
                continue
            window = self.registry.calendar.window_on(window_kind, day)
            if window is None:
                continue
            row = BatchView(self.lake, latest[as_of]).player(board_obj.name, window.id, player)
            found.append({"as_of": as_of, "window": window.id,
                          "rank": None if row is None else row["rank"],
                          "score": None if row is None else row["score"],
                          "percentile": None if row is None else row["percentile"]})
        return found

    def boards(self) -> list[dict[str, Any]]:
        now = self.now()
        calendar = self.registry.calendar
        result = []
        for board in self.registry.boards:
            windows = []
            for kind in board.windows:
                window = calendar.window_at(kind, now)
                if window is None:
                    continue
                windows.append({"kind": kind, "window": window.id,
                                "next_reset": None if window.end is None
                                else format_instant(window.end)})
            result.append({"board": board.name, "source": board.source,
                           "aggregation": board.aggregation,
                           "order": board.order, "ties": board.ties, "windows": windows})
        return result


def _top_percent(value: float | str) -> Decimal:
    try:
        return top_percent(value)
    except ValueError as exc:
        raise QueryError(str(exc)) from None


#: The largest offset a cursor may hold: every JSON reader holds it exactly (2^53 - 1), and
#: Redis ranks (int64) are far beyond any board's size.
MAX_CURSOR_OFFSET = 2**53 - 1


class CursorError(QueryError):
    """A cursor this API did not return (forged, truncated, out of range)."""


def encode_cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"o": offset}).encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> int:
    """The offset a cursor holds: base64url of `{"o": <integer 0..2^53-1>}`, nothing else
    (a float, a bool, a string or a number past the bound is a forged cursor, refused)."""
    if not cursor:
        return 0
    shown = cursor if len(cursor) <= 40 else cursor[:40] + "..."
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded))
    except (ValueError, TypeError, RecursionError):
        data = None
    offset = data.get("o") if isinstance(data, dict) and len(data) == 1 else None
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise CursorError(f"cursor {shown!r} is not one this API returned; pass the "
                          "next_cursor of the previous page, or none for the first page")
    if not 0 <= offset <= MAX_CURSOR_OFFSET:
        raise CursorError(f"cursor {shown!r} holds offset {str(offset)[:24]}, out of range "
                          f"(0 to {MAX_CURSOR_OFFSET:,}); pass the next_cursor of the "
                          "previous page, or none for the first page")
    return offset


