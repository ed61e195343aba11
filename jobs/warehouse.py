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
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from leaderboard.countries import COUNTRIES
from leaderboard.lake import quarantine_dir
from leaderboard.manifest import Manifest, list_versions, read_current
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


def _latest_per_day(lake: Path) -> list[Manifest]:
    latest: dict[str, Manifest] = {}
    for manifest in list_versions(lake):
        latest[manifest.as_of] = manifest  # list_versions is oldest first
    return [latest[d] for d in sorted(latest)]


def _files_table(lake: Path, manifests: list[Manifest], column: str) -> pa.Table:
    parts = []
    for manifest in manifests:
        index = manifest.standings(lake)
        n = index.num_rows
        parts.append(pa.table({
            "as_of": pa.array([manifest.as_of] * n, pa.string()).cast(pa.date32()),
            "version": pa.array([manifest.version] * n, pa.string()),
            "board": index.column("board"), "window_id": index.column("window_id"),
            "path": pc.binary_join_element_wise(str(lake) + "/", index.column(column), ""),
        }))
    if not parts:
        return pa.table({"as_of": pa.array([], pa.date32()), "version": pa.array([], pa.string()),
                         "board": pa.array([], pa.string()),
                         "window_id": pa.array([], pa.string()),
                         "path": pa.array([], pa.string())})
    return pa.concat_tables(parts)


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


def _readable(con: duckdb.DuckDBPyConnection, paths: list[str], columns: str,
              added: tuple[tuple[str, str], ...]) -> tuple[str, str]:
    """(select list, union_by_name) reading `columns` from `paths`, some of which may
    predate the `added` columns: those read as null from such files, or are null
    constants when no file has them."""
    by_name = False
    for column, sql_type in added:
        holding = con.execute(
            f"SELECT count(DISTINCT file_name) FROM parquet_schema({_paths_sql(paths)}) "
            "WHERE name = ?", [column]).fetchall()[0][0]
        if holding == 0:
            columns = re.sub(rf"\b{column}\b", f"NULL::{sql_type} AS {column}", columns)
        elif holding < len(paths):
            by_name = True
    return columns, "true" if by_name else "false"


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
    manifests = _latest_per_day(lake)
    current = read_current(lake)
    con = duckdb.connect(str(temp))
    try:
        con.execute("SET TimeZone = 'UTC'")
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
            files = _files_table(lake, manifests, column)
            con.register("files_arrow", files)
            con.execute(f"CREATE TABLE {name}_files AS SELECT * FROM files_arrow")
            con.unregister("files_arrow")
            paths = sorted(set(files.column("path").to_pylist()))
            if paths:
                columns, by_name = _readable(con, paths, columns, _ADDED_COLUMNS[name])
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
            con.execute(f"CREATE VIEW standings_current AS SELECT * FROM standings "
                        f"WHERE version = '{current.version}'")
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
        con.execute("CHECKPOINT")
    finally:
        con.close()
    os.replace(temp, target)
    return target
