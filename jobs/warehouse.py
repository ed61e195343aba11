"""The analysts' warehouse: `$LEADERBOARD_DATA/warehouse.duckdb`, views over the lake.

Views: `events` (the landing zone), `rollups` (the live version's rollups), `standings` (every
as_of's latest version: as_of, version, board, window_id, then the standings columns),
`standings_current`, `histograms`, `boards`, `players` (each player's latest profile: display
name, country and its name, avatar), `profile_history` (every profile write) and
`quarantine` (every rejected or held row with its reason, landing day, writer, file seq and
row in its file; read by glob, so rows quarantined after the refresh show too). The file
is rebuilt beside the old one and swapped in by rename, so an analyst holding the old file
open is never blocked and never sees a half-built warehouse. Query it read-only with
`leaderboard sql`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa

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
#: again), the newest version of each day, the standings and histogram files those name,
#: and which added columns each of those files holds (from its footer).
_META_LAKE = "meta_lake"
_META_VERSIONS = "meta_versions"
_META_LATEST = "meta_latest_versions"
_META_COLUMNS = "meta_file_columns"
_META_FILES = "meta_files"


@dataclass(frozen=True)
class _Version:
    stem: str
    version: str
    as_of: str
    created_at: str
    index: str  # the standings index, lake-relative
    signature: str  # the manifest file's inode, mtime and size (a rewrite changes it)
    fresh: bool = False  # read this refresh (not as the previous build knew it)


def _signature(path: Path) -> str:
    stat = path.stat()
    return f"{stat.st_ino}:{stat.st_mtime_ns}:{stat.st_size}"


def _attach_previous(con: duckdb.DuckDBPyConnection, target: Path, lake: Path) -> bool:
    """Attach the warehouse being replaced as `old` (read-only) when it was built from this
    lake by a build that keeps the meta tables; else the refresh reads everything."""
    if not target.exists():
        return False
    try:
        con.execute("ATTACH ? AS old (READ_ONLY)", [str(target)])
    except duckdb.Error:
        return False
    try:
        built = con.execute(f"SELECT lake FROM old.{_META_LAKE}").fetchall()
        con.execute(f"SELECT stem, version, as_of, created_at, index_path, signature "
                    f"FROM old.{_META_VERSIONS} LIMIT 0")
        con.execute(f"SELECT version FROM old.{_META_LATEST} LIMIT 0")
        con.execute(f"SELECT kind, path FROM old.{_META_FILES} LIMIT 0")
        con.execute(f"SELECT kind, path, column_name, present FROM old.{_META_COLUMNS} LIMIT 0")
    except duckdb.Error:
        built = []
    if built != [(str(lake),)]:
        con.execute("DETACH old")
        return False
    return True


def _latest_per_day(lake: Path, con: duckdb.DuckDBPyConnection, previous: bool
                    ) -> list[_Version]:
    """The newest version of each as_of (as `list_versions` orders them: as_of, then
    created_at), reading only the manifests the previous build had not read. Fills
    `meta_versions` and `meta_latest_versions`."""
    known: dict[str, _Version] = {}
    if previous:
        known = {row[0]: _Version(row[0], row[1], row[2], row[3],
                                  str(Path(row[4]).relative_to(lake)), row[5])
                 for row in con.execute(
                     f"SELECT stem, version, as_of, created_at, index_path, signature "
                     f"FROM old.{_META_VERSIONS}").fetchall()}
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
                              index, signature, fresh=True))
    latest: dict[str, _Version] = {}
    for entry in sorted(found, key=lambda v: version_order(v.as_of, v.created_at)):
        latest[entry.as_of] = entry
    chosen = [latest[d] for d in sorted(latest)]
    for table, rows in ((_META_VERSIONS, found), (_META_LATEST, chosen)):
        con.register("versions_arrow", pa.table({
            "stem": [v.stem for v in rows], "version": [v.version for v in rows],
            "as_of": pa.array([v.as_of for v in rows], pa.string()),
            "created_at": [v.created_at for v in rows],
            "index_path": pa.array([str(lake / v.index) for v in rows], pa.string()),
            "signature": pa.array([v.signature for v in rows], pa.string())}))
        con.execute(f"CREATE TABLE {table} AS SELECT * FROM versions_arrow")
        con.unregister("versions_arrow")
    return chosen


def _build_files(con: duckdb.DuckDBPyConnection, lake: Path, name: str, column: str,
                 versions: list[_Version], previous: bool) -> list[str]:
    """`<name>_files`: a view of every row of the day's newest versions' standings indexes
    (read by DuckDB when queried: nothing per version is copied into the warehouse, a size
    that grew with the square of the history). Returns the distinct data files: the
    previous build's plus those of the versions it did not have, when every version it had
    is still a day's newest and unchanged (an erasure rewrites manifests in place); else
    every index is read."""
    if not versions:
        con.execute(f"CREATE VIEW {name}_files AS SELECT NULL::DATE AS as_of, NULL::VARCHAR "
                    "AS version, NULL::VARCHAR AS board, NULL::VARCHAR AS window_id, "
                    "NULL::VARCHAR AS path WHERE false")
        return _noted(con, name, [])
    indexes = _paths_sql([str(lake / v.index) for v in versions])
    prefix = (str(lake) + "/").replace("'", "''")
    con.execute(f"""
        CREATE VIEW {name}_files AS
        SELECT v.as_of::DATE AS as_of, v.version, i.board, i.window_id,
               '{prefix}' || i.{column} AS path
        FROM read_parquet({indexes}, filename = true, hive_partitioning = false) i
        JOIN {_META_LATEST} v ON v.index_path = i.filename""")
    if previous:
        had = {row[0] for row in con.execute(
            f"SELECT version FROM old.{_META_LATEST}").fetchall()}
        if had <= {v.version for v in versions if not v.fresh}:
            fresh = [v for v in versions if v.version not in had]
            known = con.execute(f"SELECT path FROM old.{_META_FILES} WHERE kind = ?",
                                [name]).fetchall()
            paths = {row[0] for row in known}
            if fresh:
                paths.update(row[0] for row in con.execute(
                    f"SELECT DISTINCT '{prefix}' || {column} FROM read_parquet("
                    f"{_paths_sql([str(lake / v.index) for v in fresh])})").fetchall())
            return _noted(con, name, sorted(paths))
    return _noted(con, name, [row[0] for row in con.execute(
        f"SELECT DISTINCT path FROM {name}_files ORDER BY path").fetchall()])


def _noted(con: duckdb.DuckDBPyConnection, kind: str, paths: list[str]) -> list[str]:
    """`paths` noted in `meta_files` as the files of `kind` this build names."""
    con.register("noted_arrow", pa.table({"path": pa.array(paths, pa.string())}))
    con.execute(f"INSERT INTO {_META_FILES} SELECT ?, path FROM noted_arrow", [kind])
    con.unregister("noted_arrow")
    return paths


def _paths_sql(paths: list[str]) -> str:
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"


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


def _holding(con: duckdb.DuckDBPyConnection, kind: str, paths: list[str],
             added: tuple[tuple[str, str], ...], previous: bool) -> dict[str, int]:
    """How many of `paths` hold each added column, from the files' footers; a file the
    previous build looked at is not opened again. Fills `meta_file_columns`."""
    con.register("paths_arrow", pa.table({"path": paths}))
    for column, _sql_type in added:
        if previous:
            con.execute(f"""INSERT INTO {_META_COLUMNS} SELECT m.* FROM old.{_META_COLUMNS} m
                            SEMI JOIN paths_arrow p ON p.path = m.path
                            WHERE m.kind = ? AND m.column_name = ?""", [kind, column])
        new = [row[0] for row in con.execute(
            f"""SELECT path FROM paths_arrow ANTI JOIN (SELECT path FROM {_META_COLUMNS}
                WHERE kind = ? AND column_name = ?) USING (path) ORDER BY path""",
            [kind, column]).fetchall()]
        if new:
            con.execute(f"""
                INSERT INTO {_META_COLUMNS}
                SELECT ?, p.path, ?, h.file_name IS NOT NULL
                FROM (SELECT unnest(?::VARCHAR[]) AS path) p
                LEFT JOIN (SELECT DISTINCT file_name FROM parquet_schema({_paths_sql(new)})
                           WHERE name = ?) h ON h.file_name = p.path""",
                [kind, column, new, column])
    con.unregister("paths_arrow")
    return {column: con.execute(
        f"SELECT count(*) FROM {_META_COLUMNS} WHERE kind = ? AND column_name = ? AND present",
        [kind, column]).fetchall()[0][0] for column, _sql_type in added}


def _readable(holding: dict[str, int], paths: list[str], columns: str,
              added: tuple[tuple[str, str], ...]) -> tuple[str, str]:
    """(select list, union_by_name) reading `columns` from `paths`, some of which may
    predate the `added` columns (`holding`: how many files hold each): those read as null
    from such files, or are null constants when no file has them."""
    by_name = False
    for column, sql_type in added:
        if holding[column] == 0:
            columns = re.sub(rf"\b{column}\b", f"NULL::{sql_type} AS {column}", columns)
        elif holding[column] < len(paths):
            by_name = True
    return columns, "true" if by_name else "false"


def _current_view(con: duckdb.DuckDBPyConnection, lake: Path, current: Manifest,
                  shown: set[str]) -> None:
    """`standings_current`: the rows of the version `current.json` publishes, which serving
    answers from. Usually its day's newest, so the rows of `standings` for it; but a newer
    version of the day may be written and not published (a failed check, a rerun with
    publish=False) or the pointer moved back to an older version of the day, and then it
    is read from its own index."""
    version = current.version.replace("'", "''")
    if current.version in shown:
        con.execute(f"CREATE VIEW standings_current AS SELECT * FROM standings "
                    f"WHERE version = '{version}'")
        return
    index = str(lake / current.index["standings"]["path"])
    paths = sorted({str(lake / p) for p in current.standings(lake).column("path").to_pylist()})
    if not paths:
        con.execute("CREATE VIEW standings_current AS SELECT * FROM standings WHERE false")
        return
    added = _ADDED_COLUMNS["standings"]
    holding = {column: con.execute(
        f"SELECT count(DISTINCT file_name) FROM parquet_schema({_paths_sql(paths)}) "
        "WHERE name = ?", [column]).fetchall()[0][0] for column, _sql_type in added}
    columns, by_name = _readable(holding, paths, _STANDINGS_COLUMNS, added)
    prefix = (str(lake) + "/").replace("'", "''")
    con.execute(f"""
        CREATE VIEW standings_current AS
        SELECT DATE '{current.as_of}' AS as_of, '{version}' AS version, i.board, i.window_id,
               {columns}
        FROM read_parquet({_paths_sql(paths)}, filename = true, hive_partitioning = false,
                          union_by_name = {by_name}) s
        JOIN read_parquet({_paths_sql([index])}) i
          ON '{prefix}' || i.path = s.filename AND i.window_id = s.window_id""")


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


def refresh_warehouse(data_dir: Path, registry: Registry) -> Path:
    """Rebuild the warehouse views for the lake's current state; returns its path."""
    lake = (data_dir / "lake").resolve()
    target = warehouse_path(data_dir)
    temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    temp.unlink(missing_ok=True)
    current = read_current(lake)
    con = duckdb.connect(str(temp))
    try:
        con.execute("SET TimeZone = 'UTC'")
        previous = _attach_previous(con, target, lake)
        versions = _latest_per_day(lake, con, previous)
        con.execute(f"CREATE TABLE {_META_LAKE} AS SELECT ? AS lake", [str(lake)])
        con.execute(f"CREATE TABLE {_META_FILES} (kind VARCHAR, path VARCHAR)")
        con.execute(f"CREATE TABLE {_META_COLUMNS} (kind VARCHAR, path VARCHAR, "
                    "column_name VARCHAR, present BOOLEAN)")
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
        for name, column, columns in (("standings", "path", _STANDINGS_COLUMNS),
                                      ("histograms", "histogram", _HISTOGRAM_COLUMNS)):
            paths = _build_files(con, lake, name, column, versions, previous)
            if paths:
                holding = _holding(con, name, paths, _ADDED_COLUMNS[name], previous)
                columns, by_name = _readable(holding, paths, columns, _ADDED_COLUMNS[name])
                con.execute(f"""
                    CREATE VIEW {name} AS
                    SELECT f.as_of, f.version, f.board, f.window_id, {columns}
                    FROM read_parquet({_paths_sql(paths)}, filename = true,
                                      hive_partitioning = false, union_by_name = {by_name}) s
                    JOIN {name}_files f ON f.path = s.filename AND f.window_id = s.window_id
                """)
            else:
                con.execute(f"CREATE VIEW {name} AS SELECT * FROM {name}_files WHERE false")
        if current is not None:
            _current_view(con, lake, current, {v.version for v in versions})
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
