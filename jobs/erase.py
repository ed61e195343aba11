"""Erasure of a player from the lake (GDPR right to erasure; issue 12 part 4).

Every file under the lake that holds the player's id is rewritten without it, atomically
(temp file + fsync + rename), and every version stays consistent with its files:

- the landing zone and the quarantine (a quarantined row whose any text holds the id), the
  ban and void logs and the profile log (a file left empty is deleted; in the rows kept, a
  reason or display name naming the id has it replaced by `[erased]`), the quarantine
  releases' ledger;
- the rollups, and each version's rollup index (rows, events, points) and event totals;
- every standings file of every version: the player's rows go and the others are re-ranked
  exactly (a shared rank moves up by one below the player's key, an ordinal rank below the
  player's row), percentiles recomputed, and the window's histograms recomputed with the
  batch's own SQL (`jobs.duckdb_engine.histogram_sql`); the standings indexes (rows, score
  total, histogram rows), the manifests' bans, totals and board summaries follow.

The ledger of erasures (`leaderboard.erasure`) is written first, so ingest refuses the id
while the files are rewritten. Redis, the warehouse and the live version's new id are the
composition's part (`app/erasure.py`). Usage: `leaderboard erase PLAYER` (or the admin
route `DELETE /v1/admin/players/{player_id}`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jobs.duckdb_engine import histogram_sql
from leaderboard.bans import bans_dir
from leaderboard.erasure import erasure_dir, record_erasure, without_player
from leaderboard.lake import atomic_write_bytes, atomic_write_parquet
from leaderboard.manifest import Manifest, manifests_dir, write_version
from leaderboard.profiles import profiles_dir
from leaderboard.registry import Registry
from leaderboard.voids import voids_dir

__all__ = ["LakeErasure", "erase_from_lake"]

Say = Callable[[str], None]


@dataclass
class LakeErasure:
    """What an erasure rewrote in the lake."""

    rows: int = 0  # rows removed, every kind of file together
    files: int = 0  # files rewritten or deleted
    versions: int = 0  # manifests rewritten (those holding the player)
    windows: int = 0  # standings windows re-ranked
    by_kind: dict[str, int] = field(default_factory=dict)
    #: an erasure of the id was stopped part-way before: this run finished its work
    resumed: bool = False
    #: the marker of an erasure under way (`erase_from_lake`), removed by `done`
    marker: Path | None = None

    def done(self) -> None:
        """The whole erasure is over (the lake, Redis and the warehouse): a later run of it
        is no longer a resumed one."""
        if self.marker is not None:
            self.marker.unlink(missing_ok=True)

    @property
    def found(self) -> bool:
        """Whether the versions, Redis and the warehouse must follow (the id was in the lake,
        now or when the stopped run began)."""
        return self.rows > 0 or self.resumed

    def as_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "files": self.files, "versions": self.versions,
                "windows": self.windows, "resumed": self.resumed,
                "by_kind": dict(sorted(self.by_kind.items()))}


def _rewrite(report: LakeErasure, kind: str, paths: list[Path], player: str, *,
             any_text: bool = False, drop_empty: bool = False,
             redact: tuple[str, ...] = ()) -> set[str]:
    """Rewrite each file without the player's rows (and the id redacted from the `redact`
    text columns of the rows kept); returns the paths changed."""
    changed = set()
    for path in paths:
        removed = without_player(path, player, any_text=any_text, drop_empty=drop_empty,
                                 redact=redact)
        if removed:
            changed.add(str(path))
            report.rows += removed
            report.files += 1
            report.by_kind[kind] = report.by_kind.get(kind, 0) + removed
    return changed


def _rerank(table: pa.Table, player: str, earliest: bool) -> pa.Table:
    """A standings file (rows ordered by window_id, rank) without the player's rows, the
    others re-ranked and their percentiles recomputed, as the batch ranks."""
    hit = pc.fill_null(pc.equal(table.column("player_id"), player), False)
    gone = table.filter(hit).to_pylist()
    kept = table.filter(pc.invert(hit))
    if not gone or kept.num_rows == 0:
        return kept
    removed = {row["window_id"]: (row["sort_key"], row["rank"]) for row in gone}
    windows = kept.column("window_id").to_pylist()
    keys = np.asarray(kept.column("sort_key").to_numpy(), dtype=np.int64)
    ranks = np.asarray(kept.column("rank").to_numpy(), dtype=np.int64).copy()
    totals = np.zeros(kept.num_rows, dtype=np.int64)
    counts: dict[str, int] = {}
    for window in windows:
        counts[window] = counts.get(window, 0) + 1
    for i, window in enumerate(windows):
        totals[i] = counts[window]
        if window in removed:
            key, rank = removed[window]
            if (rank < ranks[i]) if earliest else (key > keys[i]):
                ranks[i] -= 1
    kept = kept.set_column(kept.schema.get_field_index("rank"), "rank",
                           pa.array(ranks, pa.int64()))
    percentile = 100.0 * (totals - ranks + 1) / totals
    return kept.set_column(kept.schema.get_field_index("percentile"), "percentile",
                           pa.array(percentile, pa.float64()))


def _histograms(standings: pa.Table, windows: set[str]) -> pa.Table:
    """The histogram rows (window_id first) of the given windows of a standings file."""
    rows = standings.filter(pc.is_in(standings.column("window_id"),
                                     value_set=pa.array(sorted(windows), pa.string())))
    con = duckdb.connect()
    try:
        con.register("standings_t", rows.select(["window_id", "score", "rank"]))
        con.execute("""
            CREATE TEMP TABLE ranked AS
            SELECT window_id AS bw, score, rank,
                   row_number() OVER (PARTITION BY window_id ORDER BY rank, rowid) AS rn,
                   count(*) OVER (PARTITION BY window_id) AS total
            FROM (SELECT *, row_number() OVER () AS rowid FROM standings_t)
        """)
        return con.sql(f"""
            WITH h AS ({histogram_sql("ranked")})
            SELECT bw AS window_id, kind, bucket, lower, upper, players, rank_from, rank_to
            FROM h ORDER BY window_id, kind, bucket
        """).to_arrow_table()
    finally:
        con.close()


def _standings(lake: Path, registry: Registry, player: str, report: LakeErasure
               ) -> tuple[dict[tuple[str, str], tuple[int, int]], dict[tuple[str, str], int]]:
    """Re-rank every standings file holding the player and rewrite the histograms of the
    windows they left. Returns (rows, score total) per (standings path, window_id) changed
    and histogram rows per (histogram path, window_id) changed."""
    earliest = {b.name for b in registry.boards if b.ties == "earliest"}
    changed: dict[tuple[str, str], tuple[int, int]] = {}
    histogram_rows: dict[tuple[str, str], int] = {}
    for path in sorted((lake / "standings").rglob("*.parquet")):
        if not pq.read_table(path, columns=["player_id"],
                             filters=[("player_id", "=", player)]).num_rows:
            continue  # the id's column only, pruned by row-group statistics
        table = pq.read_table(path)
        hit = pc.fill_null(pc.equal(table.column("player_id"), player), False)
        if not pc.any(hit).as_py():
            continue
        windows = set(table.filter(hit).column("window_id").to_pylist())
        board = path.as_posix().split("board=", 1)[1].split("/", 1)[0]
        fresh = _rerank(table, player, board in earliest)
        # The histogram file of the same (board, kind, run) holds these windows' buckets.
        # Written first: a run stopped between the two finds the player in the standings
        # file again and writes both (the other way round, the histogram stayed stale).
        histogram = lake / "histograms" / path.relative_to(lake / "standings")
        if histogram.exists():
            old = pq.read_table(histogram)
            keep = old.filter(pc.invert(pc.is_in(old.column("window_id"), value_set=pa.array(
                sorted(windows), pa.string()))))
            new = _histograms(fresh, windows).cast(keep.schema) if fresh.num_rows else None
            merged = keep if new is None else pa.concat_tables([keep, new])
            merged = merged.sort_by([("window_id", "ascending"), ("kind", "ascending"),
                                     ("bucket", "ascending")])
            atomic_write_parquet(merged, histogram)
            report.files += 1
            hrel = str(histogram.relative_to(lake))
            for window in windows:
                histogram_rows[(hrel, window)] = int(pc.sum(pc.equal(
                    merged.column("window_id"), window)).as_py() or 0)
        atomic_write_parquet(fresh, path)
        report.rows += len(table) - len(fresh)
        report.files += 1
        report.windows += len(windows)
        report.by_kind["standings"] = report.by_kind.get("standings", 0) + (
            len(table) - len(fresh))
        relative = str(path.relative_to(lake))
        for window in windows:
            mine = fresh.filter(pc.equal(fresh.column("window_id"), window))
            changed[(relative, window)] = _standings_entry(mine)
    return changed, histogram_rows


def _standings_entry(rows: pa.Table) -> tuple[int, int]:
    """(rows, score total) of one window's standings rows, as the standings index holds."""
    return rows.num_rows, int(pc.sum(rows.column("score")).as_py() or 0)


def _rollup_entry(lake: Path, path: str, day: Any) -> tuple[int, int, int]:
    """(rows, events, points) of one event date in a rollup file."""
    table = pq.read_table(lake / path, columns=["matches", "points_sum"],
                          filters=[("event_date", "=", day)])
    return (table.num_rows, int(pc.sum(table.column("matches")).as_py() or 0),
            int(pc.sum(table.column("points_sum")).as_py() or 0))


class _FromFiles:
    """Index entries read from the files themselves, each file once: what a resumed erasure
    writes, since the files the stopped run rewrote are not known."""

    def __init__(self, lake: Path) -> None:
        self.lake = lake
        self._standings: dict[str, dict[str, tuple[int, int]]] = {}
        self._histograms: dict[str, dict[str, int]] = {}

    def standings(self, path: str, window: str) -> tuple[int, int]:
        if path not in self._standings:
            table = pq.read_table(self.lake / path, columns=["window_id", "score"])
            self._standings[path] = {
                w: _standings_entry(table.filter(pc.equal(table.column("window_id"), w)))
                for w in set(table.column("window_id").to_pylist())}
        return self._standings[path].get(window, (0, 0))

    def histogram(self, path: str, window: str) -> int:
        if path not in self._histograms:
            windows = pq.read_table(self.lake / path, columns=["window_id"]).column(
                "window_id").to_pylist()
            counts: dict[str, int] = {}
            for w in windows:
                counts[w] = counts.get(w, 0) + 1
            self._histograms[path] = counts
        return self._histograms[path].get(window, 0)


def _versions(lake: Path, player: str, rollups: set[str],
              standings: dict[tuple[str, str], tuple[int, int]],
              histograms: dict[tuple[str, str], int], report: LakeErasure, *,
              every: bool = False) -> None:
    """Bring every manifest (published, sealed or set aside) whose files the pass rewrote,
    or whose bans name the player, in line with its files; the others are left as they are
    (an id the lake never held rewrote every manifest and answered them all). `every`
    (resuming a stopped erasure): every manifest, each entry read from its file."""
    files = _FromFiles(lake) if every else None
    for path in sorted(manifests_dir(lake).glob("*.json*")):
        if path.name == "current.json":
            continue
        manifest = Manifest.from_json(path.read_text())
        index = pq.read_table(lake / manifest.index["rollups"]["path"])
        entries = index.to_pylist()
        table = manifest.standings(lake).to_pylist()
        if not (every or player in manifest.inputs.get("banned", [])
                or any(str(lake / e["path"]) in rollups for e in entries)
                or any((e["path"], e["window_id"]) in standings
                       or (e["histogram"], e["window_id"]) in histograms for e in table)):
            continue
        for entry in entries:
            if every or str(lake / entry["path"]) in rollups:
                entry["rows"], entry["events"], entry["points"] = _rollup_entry(
                    lake, entry["path"], entry["event_date"])
        rollup_index = pa.Table.from_pylist(entries, schema=index.schema)
        for entry in table:
            key = (entry["path"], entry["window_id"])
            hkey = (entry["histogram"], entry["window_id"])
            if files is not None:
                entry["rows"], entry["score_total"] = files.standings(*key)
                if entry["histogram"]:
                    entry["histogram_rows"] = files.histogram(*hkey)
                continue
            if key in standings:
                entry["rows"], entry["score_total"] = standings[key]
            if hkey in histograms:
                entry["histogram_rows"] = histograms[hkey]
        standings_index = pa.Table.from_pylist(
            table, schema=manifest.standings(lake).schema)
        manifest.inputs["banned"] = [p for p in manifest.inputs.get("banned", []) if p != player]
        events = sum(e["events"] for e in entries)
        new_events = int(manifest.inputs.get("new_events", 0))
        old_events = int(manifest.inputs.get("events", events))
        manifest.inputs["events"] = events
        manifest.inputs["new_events"] = max(0, new_events - (old_events - events))
        manifest.checks["events"] = events
        manifest.checks.pop("scope_points", None)  # totals of the counted points: changed
        grouped = standings_index.group_by("board").aggregate([("window_id", "count"),
                                                               ("rows", "sum")])
        manifest.boards = {b: {"windows": int(w), "rows": int(r)} for b, w, r in zip(
            grouped.column("board").to_pylist(), grouped.column("window_id_count").to_pylist(),
            grouped.column("rows_sum").to_pylist(), strict=True)}
        if path.suffix == ".json":
            write_version(lake, manifest, rollups=rollup_index, standings=standings_index)
        else:  # set aside (`.json.rejected`): its indexes and manifest in place
            atomic_write_parquet(rollup_index, lake / manifest.index["rollups"]["path"])
            atomic_write_parquet(standings_index, lake / manifest.index["standings"]["path"])
            atomic_write_bytes(path, manifest.to_json().encode())
        report.versions += 1


def _releases(lake: Path, player: str, report: LakeErasure) -> None:
    """Drop the player's rows from every entry of the quarantine releases' ledger. Entries
    name rows by id only (`leaderboard.quarantine`: no player id, nothing to drop); an
    entry naming rows by identity (a dict with player_id) loses the player's."""
    folder = lake / "quarantine_releases"
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        raw = json.loads(path.read_text())
        rows = [r for r in raw.get("rows", [])
                if not (isinstance(r, dict) and r.get("player_id") == player)]
        if len(rows) != len(raw.get("rows", [])):
            report.rows += len(raw["rows"]) - len(rows)
            report.files += 1
            raw["rows"] = rows
            atomic_write_bytes(path, json.dumps(raw, indent=1).encode())


def erase_from_lake(lake: Path, registry: Registry, player: str, *, at: datetime,
                    say: Say = lambda _m: None) -> LakeErasure:
    """Erase every row of `player` from the lake and keep every version consistent.

    Resumable: a marker (`pending-<hash>` beside the ledger, no id in it) stays until the
    whole erasure is done (`LakeErasure.done`, once Redis and the warehouse followed too). A
    run that finds it finishes a stopped one: its files hold no id any more, so every
    version's indexes are read again from the files and everything after the lake is done
    again (a stopped erasure then run again left every version inconsistent with its files
    and the id in Redis: nothing of the id was found, so nothing followed)."""
    digest = record_erasure(lake, player, at)
    marker = erasure_dir(lake) / f"pending-{digest}"
    report = LakeErasure(resumed=marker.exists(), marker=marker)
    atomic_write_bytes(marker, b"")
    _rewrite(report, "events", sorted((lake / "events").rglob("*.parquet")), player)
    # An emptied quarantine file goes (its rows' ids name it; none is left to name).
    _rewrite(report, "quarantine", sorted((lake / "quarantine").rglob("*.parquet")), player,
             any_text=True, drop_empty=True)
    # Other rows of the logs keep their place; an operator's free text naming the id (a
    # reason, a display name) loses it.
    for kind, folder, text in (("bans", bans_dir(lake), "reason"),
                               ("voids", voids_dir(lake), "reason"),
                               ("profiles", profiles_dir(lake), "display_name")):
        _rewrite(report, kind, sorted(folder.glob("*.parquet")), player, drop_empty=True,
                 redact=(text,))
    _releases(lake, player, report)
    say(f"landing zone, quarantine and logs: {report.rows} row(s) removed")
    rollups = _rewrite(report, "rollups", sorted((lake / "rollups").rglob("*.parquet")),
                       player)
    standings, histograms = _standings(lake, registry, player, report)
    _versions(lake, player, rollups, standings, histograms, report, every=report.resumed)
    say(f"rollups and {report.windows} standings window(s) of {report.versions} version(s) "
        "rewritten")
    return report
