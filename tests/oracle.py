"""A slow, obviously-correct reference for standings: plain Python over the landed files.

Every layer's answers are compared with this: the batch engines directly, the merged
batch + speed answers through the serving layer (the lambda identity).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq

from leaderboard.bans import banned_players
from leaderboard.lake import landed_files
from leaderboard.registry import Registry
from leaderboard.sortkey import encode

__all__ = ["Row", "absorbed_events", "reference_standings"]


@dataclass(frozen=True)
class Row:
    player_id: str
    score: int
    sort_key: int
    rank: int
    percentile: float
    matches: int
    reached_at: datetime
    first_event_at: datetime
    last_event_at: datetime
    #: the match of the latest counted event (ties on event_time: the larger match_id)
    last_match_id: str


def absorbed_events(lake: Path, watermark: datetime | None) -> list[dict]:
    """Landed events with ingested_at < watermark, deduped: first ingested wins, then the
    file path (the engines' tie-break), one row per (match_id, player_id), or per (board,
    match_id, player_id) for direct scores; then the events a void with `at` before the
    watermark names (the match, or the match and player) go."""
    voided = {(v["match_id"], v["player_id"]) for path in sorted((lake / "voids").glob("*"))
              for v in pq.read_table(path).to_pylist()
              if watermark is None or v["at"] < watermark}
    rows = []
    for landed in landed_files(lake):
        for row in pq.read_table(landed.path).to_pylist():
            if watermark is None or row["ingested_at"] < watermark:
                row["_file"] = str(landed.path)
                rows.append(row)
    rows.sort(key=lambda r: (r["ingested_at"], r["_file"]))
    seen: set[tuple[str, str, str | None]] = set()
    kept = []
    for row in rows:
        identity = (row["match_id"], row["player_id"], row.get("board"))
        if identity not in seen:
            seen.add(identity)
            if ((row["match_id"], None) not in voided
                    and (row["match_id"], row["player_id"]) not in voided):
                kept.append(row)
    return kept


def _better(aggregation: str, new: dict, old: dict) -> bool:
    if aggregation == "max":
        return (new["points"], -new["event_time"].timestamp()) > (
            old["points"], -old["event_time"].timestamp())
    if aggregation == "min":
        return (new["points"], new["event_time"]) < (old["points"], old["event_time"])
    return (new["event_time"], new["match_id"]) > (old["event_time"], old["match_id"])


def reference_standings(
    lake: Path, registry: Registry, as_of: date | None, *, watermark: datetime | None = None,
    banned: set[str] | None = None,
) -> dict[tuple[str, str], list[Row]]:
    """{(board, window_id): rows by rank, player_id} for every window with data, plus the
    windows open on `as_of` (empty)."""
    from leaderboard.manifest import watermark_for

    if watermark is None and as_of is not None:
        watermark = watermark_for(as_of)
    if banned is None:
        banned = banned_players(lake, before=watermark)
    calendar = registry.calendar
    groups: dict[tuple[str, str], dict[str, dict]] = {}
    windows: dict[tuple[str, str], object] = {}
    for event in absorbed_events(lake, watermark):
        boards = ([registry.board(event["board"])] if event.get("board")
                  else registry.boards_for(event["region"], event["mode"]))
        for board in boards:
            # A backfill counts in every window its event_time falls in: as if it had
            # landed at its event_time (files without the column hold no backfill).
            landed = event["event_time"] if event.get("backfill") else event["ingested_at"]
            for window in calendar.counted_windows(board.windows, event["event_time"],
                                                   landed, board.grace):
                key = (board.name, window.id)
                windows[key] = window
                players = groups.setdefault(key, {})
                state = players.get(event["player_id"])
                if state is None:
                    players[event["player_id"]] = {
                        "sum": event["points"], "best": event, "latest": event, "matches": 1,
                        "first": event["event_time"], "last": event["event_time"]}
                    continue
                state["sum"] += event["points"]
                state["matches"] += 1
                state["first"] = min(state["first"], event["event_time"])
                state["last"] = max(state["last"], event["event_time"])
                if _better("last", event, state["latest"]):
                    state["latest"] = event
                if board.aggregation != "sum" and _better(board.aggregation, event,
                                                          state["best"]):
                    state["best"] = event
    if as_of is not None:
        for board in registry.boards:
            for kind in board.windows:
                window = calendar.window_on(kind, as_of)
                if window is not None:
                    groups.setdefault((board.name, window.id), {})
                    windows[(board.name, window.id)] = window
    result: dict[tuple[str, str], list[Row]] = {}
    for (board_name, window_id), players in groups.items():
        board = registry.board(board_name)
        window = windows[(board_name, window_id)]
        layout = registry.layout(board, window.kind)
        entries = []
        for player_id, state in players.items():
            if player_id in banned:
                continue
            if board.aggregation == "sum":  # saturates at the key's limit
                score = max(-layout.limit, min(layout.limit, state["sum"]))
                reached = state["last"]
            else:
                score, reached = state["best"]["points"], state["best"]["event_time"]
            t = (reached - window.start) // timedelta(microseconds=layout.unit_us or 1)
            key = encode(score, order=board.order, ties=board.ties, t=t,
                         time_bits=layout.time_bits)
            entries.append((key, player_id, score, reached, state))
        entries.sort(key=lambda e: (-e[0], e[1]))
        total = len(entries)
        rows = []
        for position, (key, player_id, score, reached, state) in enumerate(entries, start=1):
            if board.ties == "earliest" or position == 1 or key != entries[position - 2][0]:
                rank = position
            else:
                rank = rows[-1].rank
            rows.append(Row(player_id, score, key, rank, 100.0 * (total - rank + 1) / total,
                            state["matches"], reached, state["first"], state["last"],
                            state["latest"]["match_id"]))
        result[(board_name, window_id)] = rows
    return result
