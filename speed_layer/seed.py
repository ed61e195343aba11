"""A player's base part from the batch's rollup rows: the seed of a recompute after retention.

When a void names a result the live batch version counted, the speed layer recomputes the
player's base part as the next batch will (speed_layer.service). Before retention that is
their raw rows before the watermark; after it, raw rows of old event dates may be gone, and
the next batch keeps its rollup rows for every event date at or before the safe line
(`leaderboard.retained.kept_after`), recomputing only the later dates the voids touch. So the
seed here is the player's rollup rows of the live version, each one an aggregate state per
(event date, region, mode, lateness mask), turned into the same per-(board-window, player)
updates the fold applies (`Update`, FOLD_SCRIPT's wire format): every aggregation merges
commutatively, so these and the raw rows of the recomputed dates combine in the script as
the batch combines rollups into standings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from leaderboard.calendar import ALL_TIME, Window
from leaderboard.lateness import lateness_bits
from leaderboard.manifest import Manifest, rollup_files
from leaderboard.registry import Board, Registry
from leaderboard.timeutil import duration_us, epoch_us
from speed_layer.fold import Update, mark_time, plan_updates, value_fields

__all__ = ["ROLLUP_COLUMNS", "player_rollups", "rollup_updates", "seed_updates"]

#: The rollup columns a seed reads (jobs.spec.ROLLUP_SCHEMA names them alike).
ROLLUP_COLUMNS = ("player_id", "event_date", "region", "mode", "mask", "matches", "points_sum",
                  "max_points", "max_at", "min_points", "min_at", "last_points", "last_match",
                  "last_event_at")


def player_rollups(lake: Path, manifest: Manifest, player: str) -> pa.Table:
    """The player's rollup rows in `manifest`'s version: each file read for the event dates
    the manifest maps to it only (a file may hold rows of dates a later run rewrote)."""
    parts = [pq.read_table(lake / path, columns=list(ROLLUP_COLUMNS),
                           filters=(pc.field("player_id") == player)
                           & pc.field("event_date").isin(pa.array(days, pa.date32())))
             for path, days in sorted(rollup_files(manifest.rollups(lake)).items())]
    if not parts:  # a version without rollups (no event yet)
        return pa.table({"player_id": pa.array([], pa.string()),
                         "event_date": pa.array([], pa.date32())})
    return pa.concat_tables(parts, promote_options="default")


def _applies(board: Board, region: str, mode: str) -> bool:
    """Whether a rollup row of (region, mode) counts on `board`: a direct board's scores
    roll up with region "" and the board's name in `mode` (jobs.spec), match events never
    with region ""."""
    if board.direct:
        return region == "" and mode == board.name
    return region != "" and board.applies_to(region, mode)


def rollup_updates(rows: pa.Table | None, registry: Registry) -> list[Update]:
    """Per (board-window, player): the rollup rows that count there as FOLD_SCRIPT updates
    (one line per row; the script merges a player's lines as it merges files). A row counts
    on a board whose scope holds its (region, mode), in each window of the board's kinds
    holding its event date whose lateness bit is set in its mask (all-time: always)."""
    if rows is None or rows.num_rows == 0 or "mask" not in rows.column_names:
        return []
    bits = {(b.kind, b.grace_us): b.bit for b in lateness_bits(registry)}
    calendar = registry.calendar
    regions = rows.column("region").to_pylist()
    modes = rows.column("mode").to_pylist()
    masks = rows.column("mask").to_pylist()
    days = rows.column("event_date").to_pylist()
    groups: dict[tuple[str, str], tuple[Board, Window, list[int]]] = {}
    for board in registry.boards:
        grace_us = duration_us(board.grace)
        for i in range(rows.num_rows):
            if not _applies(board, regions[i], modes[i]):
                continue
            for kind in board.windows:
                if kind != ALL_TIME and not (masks[i] >> bits[(kind, grace_us)]) & 1:
                    continue
                window = calendar.window_on(kind, days[i])
                if window is None:
                    continue
                found = groups.setdefault((board.name, window.id), (board, window, []))
                found[2].append(i)
    return [_update(board, window, rows.take(pa.array(chosen, pa.int64())), registry)
            for board, window, chosen in groups.values()]


def _update(board: Board, window: Window, rows: pa.Table, registry: Registry) -> Update:
    """One board-window's update from its rollup rows, values as `value_fields(board)`."""
    layout = registry.layout(board, window.kind)
    unit, start = layout.unit_us or 1_000_000, epoch_us(window.start)

    def us(column: str) -> pa.Array:
        return pc.cast(rows.column(column), pa.int64()).combine_chunks()

    def since_start(column: str) -> pa.Array:
        return pc.divide(pc.subtract(us(column), start), unit)

    if board.aggregation == "sum":
        sums = rows.column("points_sum").combine_chunks()
        if board.ties != "earliest":  # the sort key's delta, as the fold's `_sum` sends it
            values = {"points": sums if board.order == "desc" else pc.negate(sums)}
        else:
            values = {"points": sums, "t": since_start("last_event_at")}
    elif board.aggregation in ("max", "min"):
        prefix = board.aggregation
        values = {"points": rows.column(f"{prefix}_points").combine_chunks(),
                  "t": since_start(f"{prefix}_at")}
    else:
        values = {"points": rows.column("last_points").combine_chunks(),
                  "us": mark_time(us("last_event_at")),
                  "match": rows.column("last_match").combine_chunks(),
                  "t": since_start("last_event_at")}
    return Update(board, window, layout.time_bits, rows.column("player_id").combine_chunks(),
                  [pc.cast(values[name], pa.string()) for name in value_fields(board)])


def seed_updates(rows: pa.Table, rollups: pa.Table | None, registry: Registry) -> list[Update]:
    """A seed's updates: the raw rows' (`plan_updates`, unsaturated) and the rollup rows'
    (`rollup_updates`), a sum board's combined into one line per (board-window, player)
    and clamped once, as the batch sums every rollup row of a player before it saturates:
    FOLD_SCRIPT clamps at each line, so lines L+5 then -10 would give L-10, not L-5."""
    sums: dict[tuple[str, str], tuple[Board, Window, int, dict[str, list[int]]]] = {}
    kept: list[Update] = []
    for update in (plan_updates(rows, registry, None, saturate=False)
                   + rollup_updates(rollups, registry)):
        board = update.board
        if board.aggregation != "sum":
            kept.append(update)
            continue
        found = sums.setdefault((board.name, update.window.id),
                                (board, update.window, update.time_bits, {}))[3]
        columns: list[list[Any]] = [v.to_pylist() for v in update.values]
        for i, player in enumerate(update.players.to_pylist()):
            delta = int(columns[0][i])
            if player not in found:
                found[player] = [delta] + [int(c[i]) for c in columns[1:]]
                continue
            found[player][0] += delta
            if len(columns) > 1:  # earliest ties: t of the latest event
                found[player][1] = max(found[player][1], int(columns[1][i]))
    for board, window, time_bits, players in sums.values():
        # A mixed-sign board's fold keeps the exact total itself (FOLD_SCRIPT's ARGV[11]).
        limit = registry.layout(board, window.kind).limit if not board.mixed_sum else 2**62
        names = sorted(players)
        values = [[max(-limit, min(limit, players[p][0])) for p in names]]
        if board.ties == "earliest":
            values.append([players[p][1] for p in names])
        kept.append(Update(board, window, time_bits, pa.array(names, pa.string()),
                           [pa.array([str(v) for v in column], pa.string())
                            for column in values]))
    return kept
