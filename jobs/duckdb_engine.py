"""The DuckDB engine (the default): rollups and ranked standings as SQL over Parquet.

Pure transforms: each function takes a connection with its inputs registered as relations
and returns an Arrow result; reading the lake and writing the version live in jobs.batch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import duckdb
import pyarrow as pa

from jobs.spec import DEPTH_BUCKETS, ROLLUP_SCHEMA, WIDTH_BUCKETS, LatenessBit

__all__ = ["DuckDBEngine"]

_LIMIT_SHARED = 2**53 - 1


def _us(instant: datetime) -> int:
    return (instant - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def _sql_list(paths: Sequence[str]) -> str:
    """A SQL list literal of file paths (views cannot take prepared parameters)."""
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"


def _mask_sql(bits: Sequence[LatenessBit]) -> str:
    """The lateness mask of one event: bit j set iff it counts for bits[j]'s windows."""
    if not bits:
        return "0"
    parts = [
        f"(CASE WHEN w_{b.kind.replace('-', '_')} IS NOT NULL AND epoch_us(e.ingested_at) <= "
        f"w_{b.kind.replace('-', '_')} + {b.grace_us} THEN {1 << b.bit} ELSE 0 END)"
        for b in bits
    ]
    return " + ".join(parts)


_ROLLUP_AGGREGATES = """
    count(*)::BIGINT AS matches,
    sum(points)::BIGINT AS points_sum,
    max({'p': points, 't': -epoch_us(event_time)}) AS mx,
    min({'p': points, 't': epoch_us(event_time)}) AS mn,
    max({'t': epoch_us(event_time), 'm': match_id, 'p': points}) AS lst,
    min(event_time) AS first_event_at,
    max(event_time) AS last_event_at
"""

_MERGE_AGGREGATES = """
    sum(matches)::BIGINT AS matches,
    sum(points_sum)::BIGINT AS points_sum,
    max({'p': max_points, 't': -epoch_us(max_at)}) AS mx,
    min({'p': min_points, 't': epoch_us(min_at)}) AS mn,
    max({'t': epoch_us(last_event_at), 'm': last_match, 'p': last_points}) AS lst,
    min(first_event_at) AS first_event_at,
    max(last_event_at) AS last_event_at
"""

_ROLLUP_COLUMNS = """
    player_id, event_date, region, mode, mask, matches, points_sum,
    mx.p AS max_points, make_timestamp(-mx.t)::TIMESTAMPTZ AS max_at,
    mn.p AS min_points, make_timestamp(mn.t)::TIMESTAMPTZ AS min_at,
    lst.p AS last_points, lst.m AS last_match, first_event_at, last_event_at
"""


class DuckDBEngine:
    """Batch transforms on an embedded DuckDB (threads = cores unless told otherwise)."""

    name = "duckdb"

    def __init__(self, *, threads: int | None = None, memory_limit: str | None = None,
                 temp_dir: str | None = None) -> None:
        self.con = duckdb.connect(config={"preserve_insertion_order": False})
        self.con.execute("SET TimeZone = 'UTC'")
        self.con.execute(f"SET threads = {int(threads or os.cpu_count() or 2)}")
        if memory_limit:
            self.con.execute(f"SET memory_limit = '{memory_limit}'")
        if temp_dir:
            self.con.execute(f"SET temp_directory = '{temp_dir}'")

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> DuckDBEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- rollups ----------------------------------------------------------------------------

    def rollup_events(
        self,
        files: Sequence[str],
        *,
        watermark: datetime,
        since: datetime | None,
        absorbed: Sequence[str],
        calendar: pa.Table,
        bits: Sequence[LatenessBit],
    ) -> tuple[pa.Table, int]:
        """Deduped events with since <= ingested_at < watermark, rolled up per player-day.

        First ingested wins inside the new rows; a new row whose identity is among the
        `absorbed` files' rows (ingested before `since`) is a late duplicate and is dropped.
        Returns the rollup rows and the number of events they count.
        """
        con = self.con
        if not files:
            return ROLLUP_SCHEMA.empty_table(), 0
        kinds = sorted({b.kind for b in bits})
        wide = ", ".join(
            f"max(CASE WHEN kind = '{k}' THEN window_end_us END) AS w_{k.replace('-', '_')}"
            for k in kinds) or "NULL AS w_none"
        con.register("calendar_t", calendar)
        con.sql(f"""
            CREATE OR REPLACE TEMP TABLE calendar_wide AS
            SELECT event_date, {wide} FROM calendar_t GROUP BY event_date
        """)
        window = f"ingested_at < make_timestamp({_us(watermark)})::TIMESTAMPTZ"
        if since is not None:
            window += f" AND ingested_at >= make_timestamp({_us(since)})::TIMESTAMPTZ"
        con.execute(f"""
            CREATE OR REPLACE TEMP TABLE new_events AS
            SELECT match_id, player_id, points, event_time, region, mode, ingested_at
            FROM read_parquet($files, filename = true, hive_partitioning = false)
            WHERE {window}
            QUALIFY row_number() OVER (PARTITION BY match_id, player_id
                                       ORDER BY ingested_at, filename) = 1
        """, {"files": list(files)})
        if absorbed and since is not None:
            con.execute(f"""
                DELETE FROM new_events n WHERE EXISTS (
                    SELECT 1 FROM read_parquet($absorbed, hive_partitioning = false) a
                    WHERE a.ingested_at < make_timestamp({_us(since)})::TIMESTAMPTZ
                      AND a.match_id = n.match_id AND a.player_id = n.player_id)
            """, {"absorbed": list(absorbed)})
        counted = con.execute("SELECT count(*) FROM new_events").fetchall()[0][0]
        table = con.execute(f"""
            WITH e AS (
                SELECT e.*, e.event_time::DATE AS event_date, {_mask_sql(bits)} AS mask
                FROM new_events e JOIN calendar_wide c ON c.event_date = e.event_time::DATE
            ), g AS (
                SELECT player_id, event_date, region, mode, mask, {_ROLLUP_AGGREGATES}
                FROM e GROUP BY player_id, event_date, region, mode, mask
            )
            SELECT {_ROLLUP_COLUMNS} FROM g
        """).to_arrow_table()
        con.execute("DROP TABLE new_events")
        con.unregister("calendar_t")
        return table, int(counted)

    def merge_rollups(self, old: pa.Table, delta: pa.Table) -> pa.Table:
        """Merge a delta into the old rollup rows of the same dates.

        `old` lists (path, event_date) of the rows to merge with; rows with the same key merge.
        """
        con = self.con
        names = ["rollup_old", "rollup_delta"]
        con.register("rollup_index", old)
        paths = sorted(set(old.column("path").to_pylist()))
        if paths:
            con.sql(f"""
                CREATE OR REPLACE TEMP TABLE rollup_old AS
                SELECT r.* EXCLUDE (filename) FROM read_parquet({_sql_list(paths)},
                                                                filename = true, hive_partitioning = false) r
                SEMI JOIN rollup_index i ON i.path = r.filename AND i.event_date = r.event_date
            """)
        else:
            con.register("rollup_old_empty", ROLLUP_SCHEMA.empty_table())
            con.execute("CREATE OR REPLACE TEMP TABLE rollup_old AS "
                        "SELECT * FROM rollup_old_empty")
            con.unregister("rollup_old_empty")
        con.register("rollup_delta", delta)
        union = " UNION ALL ".join(f"SELECT * FROM {n}" for n in names)
        table = con.sql(f"""
            WITH r AS ({union}), g AS (
                SELECT player_id, event_date, region, mode, mask, {_MERGE_AGGREGATES}
                FROM r GROUP BY player_id, event_date, region, mode, mask
            )
            SELECT {_ROLLUP_COLUMNS} FROM g
        """).to_arrow_table()
        con.execute("DROP TABLE IF EXISTS rollup_old")
        for name in ["rollup_delta", "rollup_index"]:
            try:
                con.unregister(name)
            except duckdb.Error:
                pass
        return table

    # -- standings --------------------------------------------------------------------------

    def standings(
        self,
        rollups: pa.Table,
        *,
        spec: pa.Table,
        calendar: pa.Table,
        needed: pa.Table,
        banned: Sequence[str],
    ) -> tuple[pa.RecordBatchReader, pa.Table, pa.Table, pa.Table]:
        """Ranked standings for every (board, window_id) in `needed`.

        `rollups` lists (path, event_date): the file holding each date's authoritative rows.
        Returns (standings ordered by board, window_id, rank, player_id; histograms;
        overflow rows whose score does not fit an exact sort key; the (board, window_id)
        pairs among `needed` that received counted events, banned players included).
        """
        con = self.con
        con.register("spec_t", spec)
        con.register("calendar_t", calendar)
        con.register("needed_t", needed)
        con.register("banned_t", pa.table({"player_id": pa.array(list(banned), pa.string())}))
        con.register("rollup_index", rollups)
        paths = sorted(set(rollups.column("path").to_pylist()))
        if paths:
            con.sql(f"""
                CREATE OR REPLACE TEMP VIEW rollups_v AS
                SELECT r.* EXCLUDE (filename) FROM read_parquet({_sql_list(paths)},
                                                                filename = true, hive_partitioning = false) r
                SEMI JOIN rollup_index i ON i.path = r.filename AND i.event_date = r.event_date
            """)
        else:
            con.register("rollups_v", ROLLUP_SCHEMA.empty_table())
        con.execute("""
            CREATE OR REPLACE TEMP TABLE counted AS
            WITH x AS (
                SELECT r.*, unnest(['global', 'region:' || r.region, 'mode:' || r.mode])
                       AS scope_key
                FROM rollups_v r
            )
            SELECT s.board, c.window_id, c.window_start_us, s.aggregation, s.sign,
                   s.earliest, s.time_bits, x.*
            FROM x
            JOIN spec_t s ON s.scope_key = x.scope_key
            JOIN calendar_t c ON c.event_date = x.event_date AND c.kind = s.kind
            SEMI JOIN needed_t n ON n.board = s.board AND n.window_id = c.window_id
            WHERE s.bit < 0 OR ((x.mask >> s.bit) & 1) = 1
        """)
        # Windows that received data exist in the version even if bans empty them.
        windows = con.sql(
            "SELECT DISTINCT board, window_id FROM counted ORDER BY ALL").to_arrow_table()
        con.execute(f"""
            CREATE OR REPLACE TEMP TABLE scored AS
            WITH g AS (
                SELECT board, window_id, player_id,
                       any_value(aggregation) AS aggregation, any_value(sign) AS sign,
                       any_value(earliest) AS earliest, any_value(time_bits) AS time_bits,
                       any_value(window_start_us) AS window_start_us, {_MERGE_AGGREGATES}
                FROM counted ANTI JOIN banned_t USING (player_id)
                GROUP BY board, window_id, player_id
            )
            SELECT board, window_id, player_id, sign, earliest, time_bits, matches,
                   first_event_at, last_event_at, lst.m AS last_match_id, window_start_us,
                   CASE aggregation WHEN 'sum' THEN points_sum WHEN 'max' THEN mx.p
                                    WHEN 'min' THEN mn.p ELSE lst.p END AS score,
                   CASE aggregation WHEN 'sum' THEN epoch_us(last_event_at)
                                    WHEN 'max' THEN -mx.t WHEN 'min' THEN mn.t
                                    ELSE lst.t END AS reached_us
            FROM g
        """)
        con.execute("DROP TABLE counted")
        overflow = con.execute(f"""
            SELECT board, window_id, player_id, score, time_bits FROM scored
            WHERE abs(score) > CASE WHEN earliest THEN (1::BIGINT << (53 - time_bits)) - 1
                                    ELSE {_LIMIT_SHARED} END
            LIMIT 10
        """).to_arrow_table()
        if overflow.num_rows:
            return (pa.RecordBatchReader.from_batches(pa.schema([]), []), pa.table({}), overflow,
                    windows)
        con.sql("""
            CREATE OR REPLACE TEMP TABLE ranked AS
            WITH k AS (
                SELECT *, CASE WHEN earliest THEN
                    (sign * score) * (1::BIGINT << time_bits)
                    + ((1::BIGINT << time_bits) - 1 - (reached_us - window_start_us) // 1000000)
                    ELSE sign * score END AS sort_key
                FROM scored
            ), n AS (
                SELECT *, row_number() OVER (PARTITION BY board, window_id
                                             ORDER BY sort_key DESC, player_id) AS rn,
                       count(*) OVER (PARTITION BY board, window_id) AS total
                FROM k
            ), r AS (
                SELECT *, CASE WHEN earliest THEN rn
                          ELSE min(rn) OVER (PARTITION BY board, window_id, sort_key) END AS rank
                FROM n
            )
            SELECT board, window_id, player_id, score, sort_key, rank::BIGINT AS rank,
                   100.0 * (total - rank + 1) / total AS percentile, matches,
                   make_timestamp(reached_us)::TIMESTAMPTZ AS reached_at,
                   first_event_at, last_event_at, last_match_id, rn, total
            FROM r
        """)
        con.execute("DROP TABLE scored")
        histograms = con.execute(f"""
            WITH b AS (
                SELECT board, window_id, score, rank, rn, total,
                       min(score) OVER (PARTITION BY board, window_id) AS lo,
                       max(score) OVER (PARTITION BY board, window_id) AS hi
                FROM ranked
            ), width AS (
                SELECT board, window_id, 'width' AS kind,
                       CASE WHEN hi = lo THEN 0
                            ELSE least((score - lo) * {WIDTH_BUCKETS} // (hi - lo),
                                       {WIDTH_BUCKETS - 1}) END AS bucket,
                       any_value(lo) AS lo, any_value(hi) AS hi,
                       count(*) AS players, min(rank) AS rank_from, max(rank) AS rank_to
                FROM b GROUP BY ALL
            ), depth AS (
                SELECT board, window_id, 'depth' AS kind,
                       (rn - 1) * {DEPTH_BUCKETS} // total AS bucket,
                       min(score)::DOUBLE AS lower, max(score)::DOUBLE AS upper,
                       count(*) AS players, min(rank) AS rank_from, max(rank) AS rank_to
                FROM b GROUP BY ALL
            )
            SELECT board, window_id, kind, bucket::BIGINT AS bucket,
                   lo + bucket * (hi - lo) / {WIDTH_BUCKETS}.0 AS lower,
                   lo + (bucket + 1) * (hi - lo) / {WIDTH_BUCKETS}.0 AS upper,
                   players::BIGINT AS players, rank_from::BIGINT AS rank_from,
                   rank_to::BIGINT AS rank_to
            FROM width
            UNION ALL
            SELECT board, window_id, kind, bucket::BIGINT, lower, upper, players::BIGINT,
                   rank_from::BIGINT, rank_to::BIGINT
            FROM depth
            ORDER BY board, window_id, kind, bucket
        """).to_arrow_table()
        # The stream must arrive in ORDER BY order, which DuckDB only promises with
        # preserve_insertion_order on (off elsewhere for speed).
        con.execute("SET preserve_insertion_order = true")
        reader = con.sql("""
            SELECT board, window_id, player_id, score, sort_key, rank, percentile, matches,
                   reached_at, first_event_at, last_event_at, last_match_id
            FROM ranked ORDER BY board, window_id, rank, player_id
        """).to_arrow_reader(batch_size=256 * 1024)
        return reader, histograms, pa.table({}), windows

    def finish(self) -> None:
        """Drop the per-run temp tables (after the standings reader is drained)."""
        self.con.execute("SET preserve_insertion_order = false")
        self.con.execute("DROP TABLE IF EXISTS ranked")
        self.con.execute("DROP VIEW IF EXISTS rollups_v")
        for name in ("spec_t", "calendar_t", "needed_t", "banned_t", "rollup_index"):
            try:
                self.con.unregister(name)
            except duckdb.Error:
                pass

