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
while the files are rewritten. Then the files of batch runs that died before their manifest
are swept (`jobs.sweep`): a killed run leaves a half-written Parquet file in place, which no
reader of versions meets (none is named) but a walk of the lake does. A file the pass still
cannot read is not a reason to stop half-way: it is listed (`LakeErasure.unreadable`), the
rest is done, and the erasure stays under way until a run finds no such file. A file it
cannot write (a full disk, a permission), the ledger first, stops it (`RewriteFailed`; a
sweep's failed delete is an OSError naming the file), as a kill does: the file is whole as
it was, and a run once the cause is fixed resumes it. Redis, the
warehouse and the live version's new id are the composition's part (`app/erasure.py`).
Usage: `leaderboard erase PLAYER` (or the admin route `DELETE /v1/admin/players/{player_id}`).
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
from jobs.sweep import SweepRefused, SweepReport, sweep_dead_runs, sweep_orphans
from leaderboard.bans import bans_dir
from leaderboard.erasure import (
    erasure_dir,
    holds_player,
    record_erasure,
    rewriting,
    without_player,
)
from leaderboard.lake import atomic_write_bytes, atomic_write_parquet
from leaderboard.manifest import Manifest, manifests_dir, write_version
from leaderboard.profiles import profiles_dir
from leaderboard.registry import Registry
from leaderboard.voids import voids_dir

__all__ = ["LakeErasure", "erase_from_lake", "repair_stopped", "stopped_erasures"]

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
    #: files of killed batch runs deleted before the pass (`jobs.sweep`)
    swept: int = 0
    #: files (below the lake) the pass could not read: they may still hold the id
    unreadable: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Whether every file of the lake was read (and rewritten where it held the id)."""
        return not self.unreadable

    def done(self) -> None:
        """The whole erasure is over (the lake, Redis and the warehouse): a later run of it
        is no longer a resumed one. Not while a file could not be read: the marker stays,
        so each night's batch says the erasure is to be run again."""
        if self.marker is not None and self.complete:
            with rewriting(self.marker):
                self.marker.unlink(missing_ok=True)

    @property
    def found(self) -> bool:
        """Whether the versions, Redis and the warehouse must follow (the id was in the lake,
        now or when the stopped run began)."""
        return self.rows > 0 or self.resumed

    def as_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "files": self.files, "versions": self.versions,
                "windows": self.windows, "resumed": self.resumed, "swept": self.swept,
                "unreadable": sorted(self.unreadable),
                "by_kind": dict(sorted(self.by_kind.items()))}


def _rewrite(lake: Path, report: LakeErasure, kind: str, paths: list[Path], player: str, *,
             any_text: bool = False, drop_empty: bool = False,
             redact: tuple[str, ...] = ()) -> set[str]:
    """Rewrite each file without the player's rows (and the id redacted from the `redact`
    text columns of the rows kept); returns the paths changed. A file it cannot read is
    listed in the report's `unreadable` and left as it is; one it cannot write stops the
    erasure (`leaderboard.erasure.RewriteFailed`: it is finished by running it again)."""
    changed = set()
    for path in paths:
        try:
            removed = without_player(path, player, any_text=any_text, drop_empty=drop_empty,
                                     redact=redact)
        except FileNotFoundError:
            continue
        except _UNREADABLE:
            report.unreadable.append(str(path.relative_to(lake)))
            continue
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


def _histogram_of(lake: Path, standings: Path) -> Path:
    """The histogram file of the same (board, kind, run) as a standings file."""
    return lake / "histograms" / standings.relative_to(lake / "standings")


def _standings(lake: Path, registry: Registry, player: str, paths: list[Path],
               report: LakeErasure
               ) -> tuple[dict[tuple[str, str], tuple[int, int]], dict[tuple[str, str], int]]:
    """Re-rank the standings files `paths` (those holding the player) and rewrite the
    histograms of the windows they left. Returns (rows, score total) per (standings path,
    window_id) changed and histogram rows per (histogram path, window_id) changed."""
    earliest = {b.name for b in registry.boards if b.ties == "earliest"}
    changed: dict[tuple[str, str], tuple[int, int]] = {}
    histogram_rows: dict[tuple[str, str], int] = {}
    for path in paths:
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
        histogram = _histogram_of(lake, path)
        if histogram.exists():
            old = pq.read_table(histogram)
            keep = old.filter(pc.invert(pc.is_in(old.column("window_id"), value_set=pa.array(
                sorted(windows), pa.string()))))
            new = _histograms(fresh, windows).cast(keep.schema) if fresh.num_rows else None
            merged = keep if new is None else pa.concat_tables([keep, new])
            merged = merged.sort_by([("window_id", "ascending"), ("kind", "ascending"),
                                     ("bucket", "ascending")])
            with rewriting(histogram):
                atomic_write_parquet(merged, histogram)
            report.files += 1
            hrel = str(histogram.relative_to(lake))
            for window in windows:
                histogram_rows[(hrel, window)] = int(pc.sum(pc.equal(
                    merged.column("window_id"), window)).as_py() or 0)
        with rewriting(path):
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


def _entries_from_files(lake: Path, files: set[str], rollups: set[str],
                        standings: dict[tuple[str, str], tuple[int, int]],
                        histograms: dict[tuple[str, str], int]) -> set[str]:
    """Add to the pass's changes the rollup, standings and histogram files `files` (paths
    below the lake) a stopped erasure had set out to rewrite: their index entries are read
    from the files as they are now (a file gone since, by retention, names no live entry).
    Returns the standings and histogram files read whole: a window an entry names that is
    not in such a file any more (the erased player was all it held) has no rows."""
    read: set[str] = set()
    for relative in sorted(files):
        path = lake / relative
        if not path.exists():
            continue
        if relative.startswith("rollups/"):
            rollups.add(str(path))
            continue
        table = pq.read_table(path, columns=["window_id", "score"])
        grouped = table.group_by("window_id").aggregate([("score", "count"), ("score", "sum")])
        for window, rows, total in zip(grouped.column("window_id").to_pylist(),
                                       grouped.column("score_count").to_pylist(),
                                       grouped.column("score_sum").to_pylist(), strict=True):
            standings.setdefault((relative, window), (int(rows), int(total or 0)))
        read.add(relative)
        histogram = _histogram_of(lake, path)
        if histogram.exists():
            hrel = str(histogram.relative_to(lake))
            read.add(hrel)
            counts = pq.read_table(histogram, columns=["window_id"]).group_by(
                "window_id").aggregate([("window_id", "count")])
            for window, rows in zip(counts.column("window_id").to_pylist(),
                                    counts.column("window_id_count").to_pylist(), strict=True):
                histograms.setdefault((hrel, window), int(rows))
    return read


def _versions(lake: Path, player: str | None, rollups: set[str],
              standings: dict[tuple[str, str], tuple[int, int]],
              histograms: dict[tuple[str, str], int], report: LakeErasure,
              read: frozenset[str] = frozenset()) -> None:
    """Bring every manifest (published, sealed or set aside) whose files the pass rewrote,
    or whose bans name the player, in line with its files; the others are left as they are
    (an id the lake never held rewrote every manifest and answered them all). `read`: files
    whose every window is in `standings`/`histograms` (`_entries_from_files`)."""
    for path in sorted(manifests_dir(lake).glob("*.json*")):
        if path.name == "current.json":
            continue
        manifest = Manifest.from_json(path.read_text())
        index = pq.read_table(lake / manifest.index["rollups"]["path"])
        entries = index.to_pylist()
        table = manifest.standings(lake).to_pylist()
        if not (player in manifest.inputs.get("banned", [])
                or any(str(lake / e["path"]) in rollups for e in entries)
                or any((e["path"], e["window_id"]) in standings or e["path"] in read
                       or (e["histogram"], e["window_id"]) in histograms for e in table)):
            continue
        for entry in entries:
            if str(lake / entry["path"]) in rollups:
                entry["rows"], entry["events"], entry["points"] = _rollup_entry(
                    lake, entry["path"], entry["event_date"])
        rollup_index = pa.Table.from_pylist(entries, schema=index.schema)
        for entry in table:
            key = (entry["path"], entry["window_id"])
            hkey = (entry["histogram"], entry["window_id"])
            if key in standings:
                entry["rows"], entry["score_total"] = standings[key]
            elif entry["path"] in read:  # a window the file no longer holds: emptied
                entry["rows"], entry["score_total"] = 0, 0
            if hkey in histograms:
                entry["histogram_rows"] = histograms[hkey]
            elif entry["histogram"] in read:
                entry["histogram_rows"] = 0
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
        with rewriting(path):
            if path.suffix == ".json":
                write_version(lake, manifest, rollups=rollup_index, standings=standings_index)
            else:  # set aside (`.json.rejected`): its indexes and manifest in place
                atomic_write_parquet(rollup_index, lake / manifest.index["rollups"]["path"])
                atomic_write_parquet(standings_index,
                                     lake / manifest.index["standings"]["path"])
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
            with rewriting(path):
                atomic_write_bytes(path, json.dumps(raw, indent=1).encode())


def erase_from_lake(lake: Path, registry: Registry, player: str, *, at: datetime,
                    say: Say = lambda _m: None) -> LakeErasure:
    """Erase every row of `player` from the lake and keep every version consistent.

    Resumable: a marker (`pending-<hash>` beside the ledger, no id in it) stays until the
    whole erasure is done (`LakeErasure.done`, once Redis and the warehouse followed too),
    and lists the rollup and standings files the run sets out to rewrite, before it does.
    A run that finds its own marker finishes a stopped one: the versions naming those
    files are brought in line with them, and everything after the lake is done again (a
    stopped erasure then run again found nothing of the id and did none of it: every
    version disagreed with its files and Redis kept the player). Other players' stopped
    erasures' files are brought in line too (`repair_stopped`); their markers stay until
    their own runs end them."""
    digest = record_erasure(lake, player, at)
    marker = erasure_dir(lake) / f"pending-{digest}"
    report = LakeErasure(resumed=marker.exists(), marker=marker)
    mine = _journal(marker) if report.resumed else set()
    _write_journal(marker, mine)
    _swept(report, say, sweep_dead_runs, lake)
    _rewrite(lake, report, "events", sorted((lake / "events").rglob("*.parquet")), player)
    # An emptied quarantine file goes (its rows' ids name it; none is left to name).
    _rewrite(lake, report, "quarantine", sorted((lake / "quarantine").rglob("*.parquet")),
             player, any_text=True, drop_empty=True)
    # Other rows of the logs keep their place; an operator's free text naming the id (a
    # reason, a display name) loses it.
    for kind, folder, text in (("bans", bans_dir(lake), "reason"),
                               ("voids", voids_dir(lake), "reason"),
                               ("profiles", profiles_dir(lake), "display_name")):
        _rewrite(lake, report, kind, sorted(folder.glob("*.parquet")), player, drop_empty=True,
                 redact=(text,))
    _releases(lake, player, report)
    say(f"landing zone, quarantine and logs: {report.rows} row(s) removed")
    held_rollups, held_standings = _holding(lake, player, report, say)
    journal = mine | {str(p.relative_to(lake)) for p in held_rollups + held_standings}
    _write_journal(marker, journal)
    rollups = _rewrite(lake, report, "rollups", held_rollups, player)
    standings, histograms = _standings(lake, registry, player, held_standings, report)
    # The files a stopped run of this erasure rewrote (the pass knows this run's own), and
    # those of other players' stopped erasures whose versions are not in line yet.
    others = {m: f for m, f in _markers(lake, unrepaired=True).items() if m != marker}
    _in_line(lake, player, others, mine, rollups, standings, histograms, report)
    _write_journal(marker, journal, repaired=True)
    say(f"rollups and {report.windows} standings window(s) of {report.versions} version(s) "
        "rewritten")
    return report


#: What reading a Parquet file that is not whole raises (a killed writer's file, cut short).
_UNREADABLE = (pa.ArrowException, OSError)


def _swept(report: LakeErasure, say: Say, sweep: Callable[[Path], SweepReport],
           lake: Path) -> None:
    """Delete the files of batch runs that died before their manifest (`jobs.sweep`), so
    the pass does not meet them. Safe here: the erasure holds the barrier exclusively, so
    no run writes files meanwhile (a run waiting at the barrier has written none, and its
    lock keeps the sweep off its name anyway)."""
    try:
        swept = sweep(lake)
    except SweepRefused as exc:
        say(f"no sweep of killed runs' files: {exc}")
        return
    report.swept += swept.files
    if swept.files:
        say(f"swept {swept.files} file(s) of killed run(s) {', '.join(swept.runs)}")


def _probe(paths: list[Path], player: str) -> tuple[list[Path], list[Path]]:
    """(the files of `paths` holding the player, those that cannot be read); a file gone
    meanwhile is neither."""
    held, unreadable = [], []
    for path in paths:
        try:
            if holds_player(path, player):
                held.append(path)
        except FileNotFoundError:
            continue
        except _UNREADABLE:
            unreadable.append(path)
    return held, unreadable


def _holding(lake: Path, player: str, report: LakeErasure,
             say: Say) -> tuple[list[Path], list[Path]]:
    """The rollup and standings files holding the player. A file that cannot be read is a
    killed run's the tombstone sweep did not know (a lake from before the tombstones): the
    whole walk (`sweep_orphans`), paid only then, deletes those no manifest names, and what
    is still unreadable after it (a file a version names, damaged) goes to `unreadable`."""
    found: list[list[Path]] = []
    cut: list[Path] = []
    for kind in ("rollups", "standings"):
        held, unreadable = _probe(sorted((lake / kind).rglob("*.parquet")), player)
        found.append(held)
        cut.extend(unreadable)
    if cut:
        _swept(report, say, sweep_orphans, lake)
        held, unreadable = _probe([p for p in cut if p.exists()], player)
        for path in held:
            found[path.relative_to(lake).parts[0] == "standings"].append(path)
        report.unreadable.extend(str(p.relative_to(lake)) for p in unreadable)
    return sorted(found[0]), sorted(found[1])


def _read_marker(marker: Path) -> dict[str, Any]:
    """An erasure's marker as written (`_write_journal`); {} when unreadable (then it lists
    no file and is not repaired: it still says an erasure is to be run again)."""
    try:
        found = json.loads(marker.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _journal(marker: Path) -> set[str]:
    """The files (below the lake) an erasure's marker says it set out to rewrite."""
    files = _read_marker(marker).get("files", [])
    return {f for f in files if isinstance(f, str)} if isinstance(files, list) else set()


def _write_journal(marker: Path, files: set[str], *, repaired: bool = False) -> None:
    """The marker: the files, and whether the versions naming them are in line with them
    already (`repaired`: only the steps needing the id are left)."""
    with rewriting(marker):
        atomic_write_bytes(marker, json.dumps({"files": sorted(files), "repaired": repaired},
                                              indent=1).encode())


def _markers(lake: Path, *, unrepaired: bool = False) -> dict[Path, set[str]]:
    """The markers of erasures under way or stopped (`unrepaired`: those whose versions
    are not in line yet) and their files."""
    folder = erasure_dir(lake)
    found = {}
    for marker in sorted(folder.glob("pending-*")) if folder.is_dir() else []:
        repaired = bool(_read_marker(marker).get("repaired"))
        if not (unrepaired and repaired):
            found[marker] = _journal(marker)
    return found


def stopped_erasures(lake: Path, *, unrepaired: bool = False) -> int:
    """How many erasures were stopped part-way and not run again (their markers; with
    `unrepaired`, those whose versions are not brought in line yet). Asked under the
    erasure barrier, none is running."""
    return len(_markers(lake, unrepaired=unrepaired))


def repair_stopped(lake: Path) -> int:
    """Bring the versions naming files stopped erasures rewrote in line with those files
    (what the nightly batch does first, under the erasure barrier held exclusively: a
    version whose indexes disagree with its files fails the batch's checks). The rest of
    each stopped erasure (Redis, the re-publish) waits for its own run. Returns the
    versions rewritten."""
    report = LakeErasure()
    _in_line(lake, None, _markers(lake, unrepaired=True), set(), set(), {}, {}, report)
    return report.versions


def _in_line(lake: Path, player: str | None, markers: dict[Path, set[str]], files: set[str],
             rollups: set[str], standings: dict[tuple[str, str], tuple[int, int]],
             histograms: dict[tuple[str, str], int], report: LakeErasure) -> None:
    """Bring the versions in line with the pass's changes and with the files `files` and
    those the `markers` list (read whole from the files), then mark those markers repaired:
    once, later runs need not read their files again."""
    read = _entries_from_files(lake, files.union(*markers.values()), rollups, standings,
                               histograms)
    _versions(lake, player, rollups, standings, histograms, report, frozenset(read))
    for marker, listed in markers.items():
        _write_journal(marker, listed, repaired=True)
