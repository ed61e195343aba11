"""Ban and unban tombstones in the lake, and the set of players banned as of a watermark.

A tombstone is one row (player_id, action ban|unban, reason, at); the latest tombstone per
player at or before the watermark decides. Tombstones are kept forever, so any version can
be recomputed with the bans it had.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from leaderboard.erasure import ErasureLedger, redact_erased
from leaderboard.lake import atomic_write_parquet
from leaderboard.schema import TIMESTAMP
from leaderboard.timeutil import to_utc

__all__ = ["BAN_SCHEMA", "banned_players", "bans_dir", "read_tombstones", "write_tombstone"]

BAN_SCHEMA = pa.schema([
    pa.field("player_id", pa.string(), nullable=False),
    pa.field("action", pa.string(), nullable=False),  # "ban" | "unban"
    pa.field("reason", pa.string(), nullable=False),
    pa.field("at", TIMESTAMP, nullable=False),
])


def bans_dir(lake: Path) -> Path:
    return lake / "bans"


def write_tombstone(lake: Path, player_id: str, action: str, at: datetime,
                    reason: str = "") -> Path:
    """Write one tombstone file atomically; the name orders tombstones by time. An erased
    id in the reason becomes `[erased]`, as the erasure leaves it."""
    if action not in ("ban", "unban"):
        raise ValueError(f"action {action!r} must be 'ban' or 'unban'")
    at = to_utc(at)
    reason = redact_erased(reason, ErasureLedger.load(lake))
    table = pa.table({"player_id": [player_id], "action": [action], "reason": [reason],
                      "at": pa.array([at], TIMESTAMP)}, schema=BAN_SCHEMA)
    stamp = at.strftime("%Y%m%dT%H%M%S%fZ")
    target = bans_dir(lake) / f"{stamp}-{action}-{uuid.uuid4().hex[:12]}.parquet"
    atomic_write_parquet(table, target)
    return target


def read_tombstones(lake: Path) -> pa.Table:
    files = sorted(bans_dir(lake).glob("*.parquet"))
    if not files:
        return BAN_SCHEMA.empty_table()
    return pa.concat_tables([pq.read_table(f, schema=BAN_SCHEMA) for f in files])


def banned_players(lake: Path, before: datetime | None = None) -> set[str]:
    """Players whose latest tombstone with `at < before` (all, if None) is a ban."""
    table = read_tombstones(lake)
    latest: dict[str, tuple[datetime, str]] = {}
    cutoff = None if before is None else to_utc(before)
    for player, action, at in zip(table.column("player_id").to_pylist(),
                                  table.column("action").to_pylist(),
                                  table.column("at").to_pylist(), strict=True):
        if cutoff is not None and at >= cutoff:
            continue
        if player not in latest or (at, action) >= latest[player]:
            latest[player] = (at, action)
    return {player for player, (_, action) in latest.items() if action == "ban"}
