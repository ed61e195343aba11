"""A second reference for merged answers, written from docs/design.md section 3 and the key rules
in docs/architecture.md without the product's code: no calendar, counting, ban, lake or
sort-key module of the product is imported (tests/oracle.py reuses some; this one must not).

It reads the landed Parquet files and ban tombstones straight from the lake layout and takes
the registry only as configuration (boards, bounds, seasons, all-time span). Ranking never
builds a sort key: entries are compared as (score, time reached in the key's unit, player_id).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

__all__ = ["PlainRow", "plain_standings"]

_EXACT = 2**53 - 1
_US = timedelta(microseconds=1)


@dataclass(frozen=True)
class PlainRow:
    player_id: str
    score: int
    rank: int
    percentile: float


@dataclass(frozen=True)
class _Window:
    id: str
    kind: str
    start: datetime
    end: datetime | None  # None: all-time (no lateness rule)


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time.min, UTC)


def _window(kind: str, day: date, calendar: Any) -> _Window | None:
    """The window of `kind` holding `day`, from the documented id formats."""
    if kind == "daily":
        return _Window(f"daily:{day.isoformat()}", kind, _midnight(day),
                       _midnight(day) + timedelta(days=1))
    if kind == "weekly":
        monday = day - timedelta(days=day.weekday())
        year, week, _ = monday.isocalendar()
        return _Window(f"weekly:{year:04d}-W{week:02d}", kind, _midnight(monday),
                       _midnight(monday) + timedelta(days=7))
    if kind == "monthly":
        first = day.replace(day=1)
        following = date(first.year + first.month // 12, first.month % 12 + 1, 1)
        return _Window(f"monthly:{first.year:04d}-{first.month:02d}", kind, _midnight(first),
                       _midnight(following))
    if kind == "season":
        if calendar.seasons is None:
            quarter = (day.month - 1) // 3
            first = date(day.year, 3 * quarter + 1, 1)
            following = (date(day.year + 1, 1, 1) if quarter == 3
                         else date(day.year, 3 * quarter + 4, 1))
            return _Window(f"season:{day.year:04d}-S{quarter + 1}", kind, _midnight(first),
                           _midnight(following))
        for season in calendar.seasons:
            if season.start <= day < season.end:
                return _Window(f"season:{season.id}", kind, _midnight(season.start),
                               _midnight(season.end))
        return None
    if calendar.all_time_start <= day < calendar.all_time_end:
        return _Window("all-time", kind, _midnight(calendar.all_time_start), None)
    return None


def _longest_us(kind: str, calendar: Any) -> int:
    days = {"daily": 1, "weekly": 7, "monthly": 31}.get(kind)
    if days is None and kind == "season":
        days = 92 if calendar.seasons is None else max(
            (s.end - s.start).days for s in calendar.seasons)
    if days is None:
        days = (calendar.all_time_end - calendar.all_time_start).days
    return days * 86_400_000_000


def _key_rule(board: Any, kind: str, calendar: Any) -> tuple[int, int]:
    """(unit in us, |score| limit) of a board-window, from the documented rule: shared ties
    hold 2^53 - 1; earliest ties take the finest of us, ms, s whose limit 2^(53 - bits) - 1
    holds the largest |points| (on sum boards 2^20 of them, less one), else seconds."""
    if board.ties == "shared":
        return 1, _EXACT
    worst = max(abs(board.min_points), abs(board.max_points))
    need = max(worst, worst * 2**20 - 1) if board.aggregation == "sum" else worst
    length = _longest_us(kind, calendar)
    options = []
    for unit in (1, 1_000, 1_000_000):
        bits = max(1, math.ceil(math.log2(-(-length // unit))))
        if bits < 53:
            options.append((unit, 2 ** (53 - bits) - 1))
    return next((o for o in options if o[1] >= need), options[-1])


def _events(lake: Path, watermark: datetime | None) -> list[dict[str, Any]]:
    """Landed rows (ingested before `watermark`), first delivery of each identity."""
    rows = []
    for path in sorted((lake / "events").glob("ingest_date=*/part-*.parquet")):
        for row in pq.read_table(path).to_pylist():
            if watermark is None or row["ingested_at"] < watermark:
                rows.append((row["ingested_at"], str(path), row))
    rows.sort(key=lambda r: (r[0], r[1]))
    seen: set[tuple[str, str, str | None]] = set()
    kept = []
    for _, _, row in rows:
        # A direct score's identity names its board (files without the column: none).
        identity = (row["match_id"], row["player_id"], row.get("board"))
        if identity not in seen:
            seen.add(identity)
            kept.append(row)
    return kept


def _banned(lake: Path, watermark: datetime | None) -> set[str]:
    """The latest tombstone per player decides (an unban wins a tie at one instant)."""
    latest: dict[str, tuple[datetime, str]] = {}
    for path in sorted((lake / "bans").glob("*.parquet")):
        for row in pq.read_table(path).to_pylist():
            if watermark is not None and row["at"] >= watermark:
                continue
            mark = (row["at"], row["action"])
            if row["player_id"] not in latest or mark >= latest[row["player_id"]]:
                latest[row["player_id"]] = mark
    return {p for p, (_, action) in latest.items() if action == "ban"}


def _applies(board: Any, event: dict[str, Any]) -> bool:
    """A direct score counts on its own board only, a match event on no direct board."""
    if event.get("board") or board.source == "direct":
        return bool(event.get("board") == board.name)
    if board.scope == "global":
        return True
    return event[board.scope] == board.scope_value


def plain_standings(lake: Path, registry: Any, as_of: date | None = None, *,
                    watermark: datetime | None = None) -> dict[tuple[str, str], list[PlainRow]]:
    """{(board, window_id): rows by rank, then player_id} for every window with counted
    events (banned players left out, so a window may be empty)."""
    del as_of  # the merged answers compared here exist only where events counted
    calendar = registry.calendar
    banned = _banned(lake, watermark)
    state: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    windows: dict[tuple[str, str], _Window] = {}
    for event in _events(lake, watermark):
        at, landed = event["event_time"], event["ingested_at"]
        for board in registry.boards:
            if not _applies(board, event):
                continue
            for kind in board.windows:
                window = _window(kind, at.astimezone(UTC).date(), calendar)
                if window is None or at < window.start:
                    continue
                # A backfill counts in every window its event_time falls in.
                if window.end is not None and (at >= window.end or (
                        not event.get("backfill") and landed > window.end + board.grace)):
                    continue
                key = (board.name, window.id)
                windows[key] = window
                players = state.setdefault(key, {})
                players.setdefault(event["player_id"], []).append(event)
    result = {}
    for (name, window_id), players in state.items():
        board = registry.board(name)
        window = windows[(name, window_id)]
        unit, limit = _key_rule(board, window.kind, calendar)
        entries = []
        for player, events in players.items():
            if player in banned:
                continue
            if board.aggregation == "sum":
                score = max(-limit, min(limit, sum(e["points"] for e in events)))
                reached = max(e["event_time"] for e in events)
            elif board.aggregation in ("max", "min"):
                pick = max if board.aggregation == "max" else min
                score = pick(e["points"] for e in events)
                reached = min(e["event_time"] for e in events if e["points"] == score)
            else:
                latest = max(events, key=lambda e: (e["event_time"], e["match_id"]))
                score, reached = latest["points"], latest["event_time"]
            better = score if board.order == "desc" else -score
            when = (reached - window.start) // (_US * unit) if board.ties == "earliest" else 0
            entries.append((-better, when, player, score))
        entries.sort()
        rows: list[PlainRow] = []
        total = len(entries)
        for position, (worse, _when, player, score) in enumerate(entries, start=1):
            if board.ties == "shared" and rows and entries[position - 2][0] == worse:
                rank = rows[-1].rank
            else:
                rank = position
            rows.append(PlainRow(player, score, rank, 100.0 * (total - rank + 1) / total))
        result[(name, window_id)] = rows
    return result
