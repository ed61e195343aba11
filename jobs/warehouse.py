"""The analysts' warehouse: `$LEADERBOARD_DATA/warehouse.duckdb`, views over the lake.

Views: `events` (the landing zone), `rollups` (the live version's rollups), `standings` (every
as_of's latest version: as_of, version, board, window_id, then the standings columns),
`standings_current` (the published version's), `histograms` (these three read the lake's
files by glob through `<data>/warehouse.files/`, `jobs.warehouse_links`, so their SQL does
not grow with the history), `boards`, `players` (each player's latest profile: display
name, country and its name, avatar), `profile_history` (every profile write) and
`quarantine` (every rejected or held row with its reason, landing day, writer, file seq and
row in its file; read by glob, so rows quarantined after the refresh show too). The file
is rebuilt beside the old one and swapped in by rename, so an analyst holding the old file
open is never blocked and never sees a half-built warehouse. Query it read-only with
`leaderboard sql`.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jobs.warehouse_links import LinkTree, generation, missing_columns
from leaderboard.countries import COUNTRIES
from leaderboard.lake import quarantine_dir
from leaderboard.manifest import Manifest, read_current, version_files, version_order
from leaderboard.profiles import PROFILE_SCHEMA, profiles_dir
from leaderboard.registry import Registry
from leaderboard.schema import QUARANTINE_SCHEMA

__all__ = ["refresh_warehouse", "warehouse_path"]

_STANDINGS_COLUMNS = ("player_id, score, sort_key, rank, percentile, matches, reached_at, "
                      "first_event_at, last_event_at, last_match_id")
_HISTOGRAM_COLUMNS = "kind, bucket, lower, upper, players, rank_from, rank_to"
#: Columns that files published by older releases lack: (name, SQL type). Such files read
#: as null there; a view over a mix of old and new files matches columns by name.
_ADDED_COLUMNS = {"standings": (("last_match_id", "VARCHAR"),), "histograms": ()}


def warehouse_path(data_dir: Path) -> Path:
    return data_dir / "warehouse.duckdb"


#: What the warehouse keeps about the lake it was built from, so that the next refresh reads
#: only what is new (versions and files change only when an erasure rewrites them, keeping
#: their columns): the lake's path, each manifest read (file stem, version, as_of,
#: created_at, standings index, the file's signature: a manifest rewritten in place is read
#: again; the version it was built from; whether its files are linked, `jobs.warehouse_links`)
#: and the newest version of each day with its index's link.
_META_LAKE = "meta_lake"
_META_VERSIONS = "meta_versions"
_META_LATEST = "meta_latest_versions"
_KINDS = (("standings", "path", _STANDINGS_COLUMNS), ("histograms", "histogram",
                                                      _HISTOGRAM_COLUMNS))


@dataclass(frozen=True)
class _Version:
    stem: str
    version: str
    as_of: str
    created_at: str
    index: str  # the standings index, lake-relative
    signature: str  # the manifest file's inode, mtime and size (a rewrite changes it)
    previous: str | None  # the version it was built from (its carried files are that one's)
    linked: bool = False  # its index and every file it names are linked, as of `signature`


def _signature(path: Path) -> str:
    stat = path.stat()
    return f"{stat.st_ino}:{stat.st_mtime_ns}:{stat.st_size}"


def _attach_previous(con: duckdb.DuckDBPyConnection, target: Path, lake: Path) -> bool:
    """Attach the warehouse being replaced as `old` (read-only) when it was built from this
    lake by a build that keeps these meta tables; else the refresh reads everything."""
    if not target.exists():
        return False
    try:
        con.execute("ATTACH ? AS old (READ_ONLY)", [str(target)])
    except duckdb.Error:
        return False
    try:
        built = con.execute(f"SELECT lake FROM old.{_META_LAKE}").fetchall()
        con.execute(f"SELECT stem, version, as_of, created_at, index_path, signature, "
                    f"previous, linked FROM old.{_META_VERSIONS} LIMIT 0")
    except duckdb.Error:
        built = []
    if built != [(str(lake),)]:
        con.execute("DETACH old")
        return False
    return True


def _versions(lake: Path, con: duckdb.DuckDBPyConnection, previous: bool
              ) -> tuple[list[_Version], list[_Version], bool]:
    """(every version, the newest of each as_of as `list_versions` orders them: as_of, then
    created_at, whether files the previous build knew are gone), reading only the
    manifests the previous build had not read. Files are gone when a version it knew is
    no more and its index neither (the lake deleted under the warehouse, as `demo --fresh`
    does); a version set aside keeps its files."""
    known: dict[str, _Version] = {}
    if previous:
        known = {row[0]: _Version(row[0], row[1], row[2], row[3],
                                  str(Path(row[4]).relative_to(lake)), row[5], row[6], row[7])
                 for row in con.execute(
                     f"SELECT stem, version, as_of, created_at, index_path, signature, "
                     f"previous, linked FROM old.{_META_VERSIONS}").fetchall()}
    found = []
    for path in version_files(lake):
        stem = path.name.removesuffix(".json")
        try:
            signature = _signature(path)
            if stem in known and known[stem].signature == signature:
                found.append(known[stem])  # unchanged since the previous build
                continue
            manifest = Manifest.from_json(path.read_text())
            index = str(manifest.index["standings"]["path"])
        except (OSError, ValueError, TypeError, KeyError):
            continue  # as list_versions: an unreadable manifest is no version
        found.append(_Version(stem, manifest.version, manifest.as_of, manifest.created_at,
                              index, signature, manifest.previous))
    latest: dict[str, _Version] = {}
    for entry in sorted(found, key=lambda v: version_order(v.as_of, v.created_at)):
        latest[entry.as_of] = entry
    stems = {v.stem for v in found}
    gone = any(not (lake / v.index).exists() for stem, v in known.items() if stem not in stems)
    return found, [latest[d] for d in sorted(latest)], gone


def _link_shown(con: duckdb.DuckDBPyConnection, tree: LinkTree, lake: Path,
                found: list[_Version], shown: list[_Version], full: bool) -> set[str]:
    """Link the index and every standings and histogram file of the `shown` versions not
    linked yet; returns the versions whose files are all linked. A version built from a
    linked one links only the files its base does not name (the night's own files); a
    refresh from nothing or after files went (`full`) prunes dead links and re-reads every
    shown file's footer, placing it under the generation of its columns."""
    by_version = {v.version: v for v in found}
    done = set() if full else {v.version for v in found if v.linked}
    if not full and tree.damaged(v.version for v in shown if v.version in done):
        full, done = True, set()  # the tree was removed, damaged or copied: rebuild it
    if full:
        tree.prune()
    placed: set[str] = set()
    for entry in sorted(shown, key=lambda v: version_order(v.as_of, v.created_at)):
        if entry.version in done:
            continue
        columns = ["path", "histogram"]
        index = pq.read_table(lake / entry.index, columns=columns)
        base = by_version.get(entry.previous) if entry.previous else None
        carried = (pq.read_table(lake / base.index, columns=columns)
                   if not full and base is not None and base.version in done else None)
        for kind, column, _columns in _KINDS:
            paths = pc.unique(index.column(column))
            if carried is not None:  # its base's files are linked
                paths = paths.filter(pc.invert(pc.is_in(
                    paths, value_set=pc.unique(carried.column(column)))))
            names = tree.generation_names()
            new = [p for p in paths.to_pylist() if p not in placed
                   and (full or not tree.linked(p, names))]
            added = tuple(name for name, _sql_type in _ADDED_COLUMNS[kind])
            lacking = missing_columns(con, [str(lake / p) for p in new], added)
            for path in new:
                tree.link_data(generation(lacking[str(lake / path)]), path,
                               others=names if full else ())
            placed.update(new)
        tree.link_index(entry.version, entry.index)
        done.add(entry.version)
    return done


def _note_versions(con: duckdb.DuckDBPyConnection, tree: LinkTree, lake: Path,
                   found: list[_Version], chosen: list[_Version], linked: set[str]) -> None:
    """Fill `meta_versions` and `meta_latest_versions`."""
    for table, rows in ((_META_VERSIONS, found), (_META_LATEST, chosen)):
        columns = {
            "stem": [v.stem for v in rows], "version": [v.version for v in rows],
            "as_of": pa.array([v.as_of for v in rows], pa.string()),
            "created_at": [v.created_at for v in rows],
            "index_path": pa.array([str(lake / v.index) for v in rows], pa.string()),
            "signature": pa.array([v.signature for v in rows], pa.string())}
        if table == _META_VERSIONS:
            columns["previous"] = pa.array([v.previous for v in rows], pa.string())
            columns["linked"] = pa.array([v.version in linked for v in rows], pa.bool_())
        else:
            columns["link"] = pa.array([str(tree.index_link(v.version)) for v in rows],
                                       pa.string())
        con.register("versions_arrow", pa.table(columns))
        con.execute(f"CREATE TABLE {table} AS SELECT * FROM versions_arrow")
        con.unregister("versions_arrow")


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _paths_sql(paths: list[str]) -> str:
    return "[" + ", ".join(_quoted(p) for p in paths) + "]"


def _files_view(con: duckdb.DuckDBPyConnection, tree: LinkTree, lake: Path, name: str,
                column: str, chosen: list[_Version]) -> None:
    """`<name>_files`: every row of the day's newest versions' standings indexes (as_of,
    version, board, window_id, the data file's path), read through the index links by
    glob when queried: the SQL is the same whatever the history."""
    if not chosen:
        con.execute(f"CREATE VIEW {name}_files AS SELECT NULL::DATE AS as_of, NULL::VARCHAR "
                    "AS version, NULL::VARCHAR AS board, NULL::VARCHAR AS window_id, "
                    "NULL::VARCHAR AS path WHERE false")
        return
    con.execute(f"""
        CREATE VIEW {name}_files AS
        SELECT v.as_of::DATE AS as_of, v.version, i.board, i.window_id,
               {_quoted(str(lake) + "/")} || i.{column} AS path
        FROM read_parquet({_quoted(tree.index_glob())}, filename = true,
                          hive_partitioning = false) i
        JOIN {_META_LATEST} v ON v.link = i.filename""")


def _scan(tree: LinkTree, lake: Path, kind: str, columns: str) -> str | None:
    """A query of every linked file of `kind`: `columns` (an added column a generation's
    files lack reads as null), window_id and the lake path; None when none is linked."""
    branches = []
    for gen, missing in tree.generations(kind):
        selected = columns
        for name, sql_type in _ADDED_COLUMNS[kind]:
            if name in missing:
                selected = re.sub(rf"\b{name}\b", f"NULL::{sql_type} AS {name}", selected)
        folder = str(tree.generation_dir(gen))
        branches.append(
            f"SELECT {selected}, window_id, {_quoted(str(lake) + '/')} || "
            f"substr(filename, {len(folder) + 2}) AS path FROM read_parquet("
            f"{_quoted(folder + '/' + kind + '/**/*.parquet')}, filename = true, "
            "hive_partitioning = false)")
    return " UNION ALL ".join(branches) if branches else None


def _boards_table(registry: Registry) -> pa.Table:
    return pa.table({
        "board": [b.name for b in registry.boards],
        "source": [b.source for b in registry.boards],  # events | direct
        "scope": [b.scope for b in registry.boards],
        "scope_value": [b.scope_value for b in registry.boards],
        "windows": [list(b.windows) for b in registry.boards],
        "aggregation": [b.aggregation for b in registry.boards],
        "sort_order": [b.order for b in registry.boards],
        "ties": [b.ties for b in registry.boards],
        "min_points": [b.min_points for b in registry.boards],
        "max_points": [b.max_points for b in registry.boards],
        "grace_seconds": [int(b.grace.total_seconds()) for b in registry.boards],
    })


def _current_view(con: duckdb.DuckDBPyConnection, tree: LinkTree, lake: Path,
                  current: Manifest, scan: str | None) -> None:
    """`standings_current`: the rows of the version `current.json` publishes, which serving
    answers from: usually its day's newest, but a newer version of the day may be written
    and not published (a failed check, a rerun with publish=False), or the pointer moved
    back to an older version of the day. Read through its own index's link."""
    if scan is None:
        con.execute("CREATE VIEW standings_current AS SELECT * FROM standings WHERE false")
        return
    con.execute(f"""
        CREATE VIEW standings_current AS
        SELECT DATE {_quoted(current.as_of)} AS as_of, {_quoted(current.version)} AS version,
               i.board, i.window_id, {_STANDINGS_COLUMNS}
        FROM ({scan}) s
        JOIN read_parquet({_quoted(str(tree.index_link(current.version)))}) i
          ON {_quoted(str(lake) + "/")} || i.path = s.path AND i.window_id = s.window_id""")


def _profile_views(con: duckdb.DuckDBPyConnection, lake: Path) -> None:
    """`profile_history` (every write of the profile log, each once) and `players` (each
    player's latest profile, with the country's name). They read the log's files by glob
    when queried, so a profile written (or a log compacted) after this refresh is seen."""
    folder = profiles_dir(lake)
    con.register("countries_arrow", pa.table({"country": list(COUNTRIES),
                                              "country_name": list(COUNTRIES.values())}))
    con.execute("CREATE TABLE countries AS SELECT * FROM countries_arrow")
    con.unregister("countries_arrow")
    columns = ", ".join(f'"{name}"' for name in PROFILE_SCHEMA.names)
    if any(folder.glob("*.parquet")):
        glob = str(folder / "*.parquet").replace("'", "''")
        con.execute(f"CREATE VIEW profile_history AS SELECT {columns} FROM read_parquet("
                    f"'{glob}') QUALIFY row_number() OVER (PARTITION BY write_id) = 1")
    else:
        con.execute("CREATE VIEW profile_history AS SELECT NULL::VARCHAR AS player_id, "
                    "NULL::VARCHAR AS display_name, NULL::VARCHAR AS country, NULL::VARCHAR AS "
                    "avatar_url, NULL::TIMESTAMPTZ AS updated_at, NULL::VARCHAR AS source, "
                    'NULL::VARCHAR AS "order", NULL::VARCHAR AS write_id WHERE false')
    con.execute("""
        CREATE VIEW players AS
        SELECT p.player_id, p.display_name, p.country, c.country_name, p.avatar_url,
               p.updated_at
        FROM profile_history p LEFT JOIN countries c USING (country)
        QUALIFY row_number() OVER (PARTITION BY p.player_id ORDER BY p."order" DESC) = 1
    """)


def _quarantine_view(con: duckdb.DuckDBPyConnection, lake: Path) -> None:
    """`quarantine`: every quarantined row (values as sent, reason, detail, source,
    ingested_at, a direct score's `board`), with `ingest_date`, `writer`, `seq` and
    `file_row`, the place `leaderboard quarantine list` names it by."""
    columns = ", ".join(f'"{name}"' for name in QUARANTINE_SCHEMA.names)
    if any(quarantine_dir(lake).glob("ingest_date=*/part-*.parquet")):
        glob = str(quarantine_dir(lake) / "ingest_date=*" / "part-*.parquet").replace("'", "''")
        # A direct score's board (SCORE_QUARANTINE_SCHEMA): a column only of the files of
        # scores; null for match events, and for all rows while no such file exists.
        found = {row[0] for row in con.execute(
            f"DESCRIBE SELECT * FROM read_parquet('{glob}', union_by_name = true)").fetchall()}
        board = '"board"' if "board" in found else "NULL::VARCHAR AS board"
        con.execute(f"""
            CREATE VIEW quarantine AS
            SELECT {columns}, {board}, ingest_date,
                   regexp_extract(filename, 'part-([a-z0-9_]+)-([0-9]+)[.]parquet$', 1) AS writer,
                   regexp_extract(filename, 'part-([a-z0-9_]+)-([0-9]+)[.]parquet$', 2)::BIGINT
                       AS seq,
                   file_row_number AS file_row
            FROM read_parquet('{glob}', hive_partitioning = true, union_by_name = true,
                              filename = true, file_row_number = true)
        """)
    else:
        typed = ", ".join(f'NULL::{"TIMESTAMPTZ" if name == "ingested_at" else "VARCHAR"} '
                          f'AS "{name}"' for name in QUARANTINE_SCHEMA.names)
        con.execute(f"CREATE VIEW quarantine AS SELECT {typed}, NULL::VARCHAR AS board, "
                    "NULL::DATE AS ingest_date, "
                    "NULL::VARCHAR AS writer, NULL::BIGINT AS seq, NULL::BIGINT AS file_row "
                    "WHERE false")


@contextmanager
def _one_refresh(data_dir: Path) -> Iterator[None]:
    """Hold `<data>/.warehouse.lock` for a refresh: one refresh of a data dir's warehouse
    at a time (an erasure's in the API process, the DAG's task, `leaderboard warehouse
    refresh`). Two at once failed: a full one prunes the link tree, and removed the other's
    temp link before its rename into place. Beside the tree, not in it: a prune or an
    operator removing the tree leaves it; not in the lake, which erasure and retention
    rewrite. Blocks until free."""
    with open(data_dir / ".warehouse.lock", "ab") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def _remove_killed_refreshes(data_dir: Path, target: Path) -> None:
    """Remove what killed refreshes left: their temp database and DuckDB's files beside it
    (`<temp>.wal` holds what it wrote since its last checkpoint; `<temp>.tmp/` is its spill
    directory). Called under the refresh lock, so none of them is a running refresh's."""
    for stale in data_dir.glob(f".{target.name}.*.tmp*"):
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


def refresh_warehouse(data_dir: Path, registry: Registry, *, relink: bool = False) -> Path:
    """Rebuild the warehouse views for the lake's current state; returns its path.
    `relink`: rebuild the link tree whole (prune, then link every shown file again), as a
    refresh from nothing does: an erasure asks for it, so no copy of a lake file it
    rewrote can stay in the tree (`LinkTree.damaged` samples the tree only)."""
    with _one_refresh(data_dir):
        return _refresh(data_dir, registry, relink=relink)


def _refresh(data_dir: Path, registry: Registry, *, relink: bool) -> Path:
    lake = (data_dir / "lake").resolve()
    target = warehouse_path(data_dir)
    _remove_killed_refreshes(data_dir, target)
    temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    current = read_current(lake)
    tree = LinkTree(data_dir.absolute())
    con = duckdb.connect(str(temp))
    try:
        con.execute("SET TimeZone = 'UTC'")
        previous = _attach_previous(con, target, lake)
        found, chosen, gone = _versions(lake, con, previous)
        shown = list(chosen)
        live = next((v for v in found if current is not None
                     and v.version == current.version), None)
        if live is not None and live not in shown:
            shown.append(live)
        linked = _link_shown(con, tree, lake, found, shown,
                             full=gone or not previous or relink)
        _note_versions(con, tree, lake, found, chosen, linked)
        con.execute(f"CREATE TABLE {_META_LAKE} AS SELECT ? AS lake", [str(lake)])
        events = sorted(str(p) for p in lake.glob("events/ingest_date=*/part-*.parquet"))
        if events:
            # Files from before the backfill column read it as false; before the board
            # column (direct scores' board; null for match events), as null.
            con.execute("CREATE VIEW events AS SELECT * REPLACE (coalesce(backfill, false) AS "
                        f"backfill) FROM (SELECT * FROM read_parquet({_paths_sql(events)}, "
                        "hive_partitioning = true, union_by_name = true) UNION ALL BY NAME "
                        "SELECT NULL::BOOLEAN AS backfill, NULL::VARCHAR AS board WHERE false)")
        else:
            con.execute("CREATE VIEW events AS SELECT NULL::VARCHAR AS match_id, NULL::VARCHAR "
                        "AS player_id, NULL::BIGINT AS points, NULL::TIMESTAMPTZ AS event_time, "
                        "NULL::VARCHAR AS region, NULL::VARCHAR AS mode, NULL::VARCHAR AS "
                        "server_id, NULL::TIMESTAMPTZ AS ingested_at, NULL::BOOLEAN AS backfill, "
                        "NULL::VARCHAR AS board, NULL::DATE AS ingest_date "
                        "WHERE false")
        scans = {}
        for name, column, columns in _KINDS:
            _files_view(con, tree, lake, name, column, chosen)
            scans[name] = _scan(tree, lake, name, columns) if chosen or live else None
            if chosen and scans[name] is not None:
                con.execute(f"""
                    CREATE VIEW {name} AS
                    SELECT f.as_of, f.version, f.board, f.window_id, {columns}
                    FROM ({scans[name]}) s
                    JOIN {name}_files f ON f.path = s.path AND f.window_id = s.window_id""")
            else:
                con.execute(f"CREATE VIEW {name} AS SELECT * FROM {name}_files WHERE false")
        if current is not None:
            _current_view(con, tree, lake, current, scans["standings"] if live else None)
            rollups = current.rollups(lake)
            index = pa.table({
                "path": [str(lake / e["path"]) for e in rollups.values()],
                "event_date": pa.array([e for e in rollups], pa.string()).cast(pa.date32()),
            })
            con.register("rollup_arrow", index)
            con.execute("CREATE TABLE rollup_files AS SELECT * FROM rollup_arrow")
            con.unregister("rollup_arrow")
            paths = sorted(set(index.column("path").to_pylist()))
            con.execute(f"""
                CREATE VIEW rollups AS
                SELECT r.* EXCLUDE (filename) FROM read_parquet({_paths_sql(paths)},
                    filename = true, hive_partitioning = false) r
                SEMI JOIN rollup_files i ON i.path = r.filename AND i.event_date = r.event_date
            """ if paths else "CREATE VIEW rollups AS SELECT * FROM rollup_files WHERE false")
        else:
            con.execute("CREATE VIEW standings_current AS SELECT * FROM standings WHERE false")
            con.execute("CREATE VIEW rollups AS SELECT NULL::VARCHAR AS player_id WHERE false")
        _profile_views(con, lake)
        _quarantine_view(con, lake)
        con.register("boards_arrow", _boards_table(registry))
        con.execute("CREATE TABLE boards AS SELECT * FROM boards_arrow")
        con.unregister("boards_arrow")
        if previous:
            con.execute("DETACH old")
        con.execute("CHECKPOINT")
    finally:
        con.close()
    os.replace(temp, target)
    return target
