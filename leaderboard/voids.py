"""Void tombstones in the lake: a `(match_id[, player_id])` that counts nowhere from then on.

A void is one row (match_id, player_id or null for every player of the match, reason, at),
one file per void under `lake/voids/`, kept forever (a version is recomputed with the voids
it had: those with `at` before its watermark). A void of a match the lake does not hold yet
is recorded as is: the event may arrive after the void (a game server retrying late), and
it is not counted when it does. There is no un-void: a corrected result is a new
submission under a new match id, so the voided one stays voided in every recomputation.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from leaderboard.erasure import ErasureLedger, redact_erased
from leaderboard.lake import atomic_write_parquet
from leaderboard.schema import TIMESTAMP
from leaderboard.timeutil import to_utc

__all__ = ["ALL_PLAYERS", "VOID_SCHEMA", "Void", "VoidIndex", "VoidLimit", "read_voids",
           "voids_before", "voids_digest", "voids_dir", "write_void"]

VOID_SCHEMA = pa.schema([
    pa.field("match_id", pa.string(), nullable=False),
    pa.field("player_id", pa.string()),  # null: every player of the match
    pa.field("reason", pa.string(), nullable=False),
    pa.field("at", TIMESTAMP, nullable=False),
])

#: The player part of a whole-match void, in `VoidIndex` and the speed layer's Redis hash.
ALL_PLAYERS = "*"


@dataclass(frozen=True)
class Void:
    match_id: str
    player_id: str | None
    reason: str
    at: datetime

    def describe(self) -> str:
        """The void's target for a sentence: `match M` or `P's result in match M`."""
        if self.player_id is None:
            return f"match {self.match_id}"
        return f"{self.player_id}'s result in match {self.match_id}"

    def as_dict(self) -> dict[str, object]:
        return {"match_id": self.match_id, "player_id": self.player_id, "reason": self.reason,
                "at": self.at.isoformat().replace("+00:00", "Z")}


@dataclass(frozen=True)
class VoidLimit:
    """What a void could not remove, after retention deleted raw events: the results the
    live batch version counted on event dates at or before the safe line
    (`leaderboard.retained.kept_after`), or, when no raw row of the void is left at all,
    whatever results it may have had there. Neither layer can recompute those dates without
    their raw events, so such results keep counting in every window they fell in (the
    published standings, the live boards and every later version)."""

    void: Void
    line: date  # the safe line: raw events of later event dates are all kept
    kept: tuple[tuple[str, date], ...]  # (player_id, event_date) of the results that stay
    unseen: bool  # no raw row of the void is left in the lake
    #: event dates after the line whose kept raw events no longer give back what the batch
    #: counted (`leaderboard.retained.redoable`): neither layer recomputes them either
    refused: tuple[date, ...] = ()
    #: the rows seen may not be the whole match (a whole match's void with results on
    #: dates at or before the line, whether they stay or not): results whose raw rows
    #: retention deleted are unlisted; `kept` may then be empty
    partial: bool = False
    #: the newest ingest partition retention deleted (`leaderboard.retained.deleted_through`)
    deleted_through: date | None = None
    #: a whole match of a direct board (its scores under one match id span days) none of
    #: whose rows seen is at or before the line: results of it ingested on or before
    #: `deleted_through` may have had their raw rows deleted, unseen here (`partial` too)
    spans: bool = False

    def message(self) -> str:
        """The plain sentence an operator reads (CLI, HTTP)."""
        if self.unseen:
            return (f"No raw event of {self.void.describe()} is left in the lake. If it was "
                    f"played on or before {self.line.isoformat()}, retention deleted its raw "
                    "events: its results still count on every board and window they fell in, "
                    "and neither the live boards nor any later batch can remove them. If it "
                    "has not landed yet, its events will not count when they land.")
        if not self.kept and self.spans and self.deleted_through is not None:
            return (f"Every result of {self.void.describe()} still in the lake is removed. "
                    f"Retention deleted the raw events ingested on or before "
                    f"{self.deleted_through.isoformat()}, and this match's scores (a direct "
                    "board's) may span days: results of it ingested then cannot be listed, "
                    "and they may still count on every board and window they fell in "
                    "(neither the live boards nor any later batch can remove them).")
        if not self.kept:  # partial: every result seen is removed
            return (f"Every result of {self.void.describe()} still in the lake is removed. "
                    f"Retention deleted raw events of event dates on or before "
                    f"{self.line.isoformat()}, and this match has results on or before it: "
                    "results of it whose raw events were in deleted partitions are not "
                    "listed, and they may still count on every board and window they fell "
                    "in (neither the live boards nor any later batch can remove them).")
        results = ", ".join(f"{p} ({d.isoformat()})" for p, d in self.kept)
        refused = ""
        if self.refused:
            dates = ", ".join(d.isoformat() for d in self.refused)
            refused = (f" The raw events still kept of {dates} no longer add up to what the "
                       "batch counted for those dates (a copy of some result there was in a "
                       "deleted partition), so those dates are not recomputed either.")
        partial = (" Results of this match whose raw events were in deleted partitions are "
                   "not listed: they may also still count." if self.partial else "")
        return (f"{len(self.kept)} result(s) of {self.void.describe()} could not be removed: "
                f"{results}. Retention deleted raw events of event dates on or before "
                f"{self.line.isoformat()}, so neither the live boards nor any later batch can "
                f"recompute them: they still count on every board and window they fell in."
                f"{refused}{partial} Results of other dates are removed.")

    def as_dict(self) -> dict[str, object]:
        return {"line": self.line.isoformat(), "unseen": self.unseen,
                "refused": [d.isoformat() for d in self.refused], "partial": self.partial,
                "deleted_through": (None if self.deleted_through is None
                                    else self.deleted_through.isoformat()),
                "results": [{"player_id": p, "event_date": d.isoformat()}
                            for p, d in self.kept],
                "message": self.message()}


def voids_dir(lake: Path) -> Path:
    return lake / "voids"


def write_void(lake: Path, match_id: str, player_id: str | None, at: datetime,
               reason: str = "") -> Path:
    """Write one void file atomically; the name orders voids by time. An erased id in the
    reason becomes `[erased]`, as the erasure leaves it."""
    at = to_utc(at)
    reason = redact_erased(reason, ErasureLedger.load(lake))
    table = pa.table({"match_id": [match_id], "player_id": pa.array([player_id], pa.string()),
                      "reason": [reason], "at": pa.array([at], TIMESTAMP)}, schema=VOID_SCHEMA)
    stamp = at.strftime("%Y%m%dT%H%M%S%fZ")
    target = voids_dir(lake) / f"{stamp}-void-{uuid.uuid4().hex[:12]}.parquet"
    atomic_write_parquet(table, target)
    return target


def read_voids(lake: Path, before: datetime | None = None) -> list[Void]:
    """Every void (those with `at < before`, if given), oldest first."""
    files = sorted(voids_dir(lake).glob("*.parquet"))
    cutoff = None if before is None else to_utc(before)
    found = []
    for path in files:
        for row in pq.read_table(path, schema=VOID_SCHEMA).to_pylist():
            if cutoff is None or row["at"] < cutoff:
                found.append(Void(row["match_id"], row["player_id"], row["reason"], row["at"]))
    return sorted(found, key=lambda v: (v.at, v.match_id, v.player_id or ""))


def voids_before(lake: Path, before: datetime | None) -> pa.Table:
    """The voids with `at < before` as a table (match_id, player_id), one row per void:
    what a batch of that watermark filters out."""
    voids = read_voids(lake, before)
    return pa.table({"match_id": pa.array([v.match_id for v in voids], pa.string()),
                     "player_id": pa.array([v.player_id for v in voids], pa.string())})


def voids_digest(voids: pa.Table) -> str:
    """A fingerprint of a set of voids (order and repeats ignored): a manifest records it so
    the next batch knows whether the set changed (then it recomputes in full)."""
    keys = sorted({f"{m}\x00{p if p is not None else ALL_PLAYERS}" for m, p in zip(
        voids.column("match_id").to_pylist(), voids.column("player_id").to_pylist(),
        strict=True)})
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()[:32] if keys else ""


class VoidIndex:
    """Voids by match: match_id -> the voided players ({ALL_PLAYERS} for the whole match).

    Built from the lake's voids or from the speed layer's Redis hash; `mask` says which
    rows of an events table are voided.
    """

    def __init__(self, by_match: Mapping[str, Iterable[str]] | None = None) -> None:
        self.by_match: dict[str, frozenset[str]] = {
            m: frozenset(p) for m, p in (by_match or {}).items() if p}

    @classmethod
    def of(cls, voids: Iterable[Void]) -> VoidIndex:
        found: dict[str, set[str]] = {}
        for void in voids:
            found.setdefault(void.match_id, set()).add(void.player_id or ALL_PLAYERS)
        return cls(found)

    def __bool__(self) -> bool:
        return bool(self.by_match)

    def voided(self, match_id: str, player_id: str) -> bool:
        players = self.by_match.get(match_id)
        return players is not None and (ALL_PLAYERS in players or player_id in players)

    def mask(self, table: pa.Table) -> pa.Array:
        """A boolean per row of `table` (match_id, player_id): true where voided."""
        if not self.by_match or table.num_rows == 0:
            return pa.array([False] * table.num_rows, pa.bool_())
        matches = table.column("match_id")
        candidate = pc.is_in(matches, value_set=pa.array(sorted(self.by_match), pa.string()))
        if not pc.any(candidate).as_py():
            return pa.array([False] * table.num_rows, pa.bool_())
        players = table.column("player_id").to_pylist()
        flags = [bool(c) and self.voided(m, p) for c, m, p in zip(
            candidate.to_pylist(), matches.to_pylist(), players, strict=True)]
        return pa.array(flags, pa.bool_())

    def drop(self, table: pa.Table) -> pa.Table:
        """The rows of `table` no void covers."""
        if not self.by_match or table.num_rows == 0:
            return table
        mask = self.mask(table)
        return table if not pc.any(mask).as_py() else table.filter(pc.invert(mask))
