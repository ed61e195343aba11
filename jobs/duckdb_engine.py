"""The DuckDB engine (the default): rollups and ranked standings as SQL over Parquet.

Pure transforms: each function takes a connection with its inputs registered as relations
and returns an Arrow result; reading the lake and writing the version live in jobs.batch.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from datetime import datetime

import duckdb
import pyarrow as pa

from jobs.rank_stream import prefetched, rank_stream
from jobs.spec import (
    CARRY_SCHEMA,
    DEPTH_BUCKETS,
    ROLLUP_CAP,
    ROLLUP_SCHEMA,
    WIDTH_BUCKETS,
    LatenessBit,
    StandingsResult,
)
from leaderboard.schema import TIMESTAMP
from leaderboard.timeutil import epoch_us

__all__ = ["DuckDBEngine", "histogram_sql"]


def _sql_list(paths: Sequence[str]) -> str:
    """A SQL list literal of file paths (views cannot take prepared parameters)."""
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"


def _mask_sql(bits: Sequence[LatenessBit]) -> str:
    """The lateness mask of one event: bit j set iff it counts for bits[j]'s windows (a
    backfill counts in every window its event_time falls in)."""
    if not bits:
        return "0"
    parts = [
        f"(CASE WHEN w_{b.kind.replace('-', '_')} IS NOT NULL AND (e.backfill OR "
        f"epoch_us(e.ingested_at) <= w_{b.kind.replace('-', '_')} + {b.grace_us}) "
        f"THEN {1 << b.bit} ELSE 0 END)"
        for b in bits
    ]
    return " + ".join(parts)


def _saturated(total: str, limit: str) -> str:
    """A HUGEINT sum clamped to [-limit, limit] (see leaderboard.sortkey.saturate)."""
    return f"greatest(least({total}, {limit}), -({limit}))::BIGINT"


#: Landed files of any age: files from before the `backfill` or `board` column read it as null
#: (and the empty branch gives the columns when no file has them yet).
_LANDED_SQL = ("SELECT * FROM read_parquet($files, filename = true, hive_partitioning = false, "
               "union_by_name = true) UNION ALL BY NAME SELECT NULL::BOOLEAN AS backfill, "
               "NULL::VARCHAR AS board WHERE false")


_MERGE_AGGREGATES = f"""
    sum(matches)::BIGINT AS matches,
    {_saturated("sum(points_sum::HUGEINT)", str(ROLLUP_CAP))} AS points_sum,
    max({{'p': max_points, 't': -epoch_us(max_at)}}) AS mx,
    min({{'p': min_points, 't': epoch_us(min_at)}}) AS mn,
    max({{'t': epoch_us(last_event_at), 'm': last_match, 'p': last_points}}) AS lst,
    min(first_event_at) AS first_event_at,
    max(last_event_at) AS last_event_at
"""

_ROLLUP_COLUMNS = """
    player_id, event_date, region, mode, mask, matches, points_sum,
    mx.p AS max_points, make_timestamp(-mx.t)::TIMESTAMPTZ AS max_at,
    mn.p AS min_points, make_timestamp(mn.t)::TIMESTAMPTZ AS min_at,
    lst.p AS last_points, lst.m AS last_match, first_event_at, last_event_at
"""


#: A packed (time, match code) pair: time * 2^_PACK_BITS + code, with 0 <= code < 2^32.
_PACK_BITS = 32
_PACK = 2**_PACK_BITS

#: The bits a narrow (BIGINT) last key may use (`_LastKey`): below 2^62, so no sum or
#: shift of it comes near the sign bit.
_NARROW_BITS = 62


class _LastKey:
    """How the latest (event time, match code) pair of a row is packed into one key whose
    max is the latest pair: narrow, a BIGINT (time - first time) * 2^bits + code, when the
    run's time span and match codes fit `_NARROW_BITS` (a max over BIGINT is about a third
    cheaper than over HUGEINT in the standings aggregation, ~3-5 s of 50M fanned-out rows
    at 300k players); else wide, a HUGEINT time * 2^32 + code."""

    def __init__(self, first_us: int | None, last_us: int | None, codes: int) -> None:
        budget = _NARROW_BITS
        self.bits = max(codes, 1).bit_length()
        span = (last_us - first_us) if first_us is not None and last_us is not None else None
        self.narrow = span is not None and span.bit_length() + self.bits <= budget
        self.origin = first_us if self.narrow and first_us is not None else 0
        if not self.narrow:
            self.bits = _PACK_BITS

    def pack(self, at: str, code: str) -> str:
        """The key of timestamp expression `at` and match code `code`."""
        if self.narrow:
            return f"((epoch_us({at}) - {self.origin})::BIGINT * {1 << self.bits} + {code})"
        return f"(epoch_us({at})::HUGEINT * {_PACK} + {code})"

    def time_us(self, key: str) -> str:
        """The event time (epoch microseconds) of a key."""
        return f"({_high(key, self.bits)}::BIGINT + {self.origin})"

    def code(self, key: str) -> str:
        """The match code of a key."""
        return f"{_low(key, self.bits)}::BIGINT" if not self.narrow else (
            f"(({key}) & {(1 << self.bits) - 1})::BIGINT")

#: A packed (score, time mark) pair: score * 2^64 + mark, 0 <= mark < 2^64, as one HUGEINT:
#: min/max over it is a native numeric aggregate, where a {score, time} struct compares
#: field by field (several times slower over the fanned-out rows).
_WIDE_BITS = 64
_WIDE = f"(1::HUGEINT << {_WIDE_BITS})"


def _best_key(points: str, at: str, *, largest: bool) -> str:
    """The packed key of a max (largest=True: the higher score, then the earlier time wins
    under max) or min (the lower score, then the earlier time wins under min) aggregation;
    null when either part is."""
    mark = (f"(9223372036854775807::HUGEINT - epoch_us({at}))" if largest
            else f"(epoch_us({at})::HUGEINT + 9223372036854775808)")
    return f"({points}::HUGEINT * {_WIDE} + {mark})"


def _low(key: str, bits: int) -> str:
    """key floor-mod 2^bits: its low bits, as a mask (HUGEINT % and // are software 128-bit
    divisions, ~70x slower than a shift or a mask over the aggregated rows)."""
    return f"(({key}) & {(1 << bits) - 1}::HUGEINT)"


def _high(key: str, bits: int) -> str:
    """floor(key / 2^bits): an arithmetic shift (two's complement: floor for negatives too)."""
    return f"(({key}) >> {bits})"


#: A rollup row from events: a max or min board's best (score, earliest time) is a packed
#: HUGEINT key (`_best_key`), a native numeric min/max, where a {score, time} struct compares
#: field by field (1.7 s of the 10 s aggregate at 300k players / 6M events); the latest
#: (time, match, points) stays a struct (a match id is a string).
_ROLLUP_AGGREGATES = f"""
    count(*)::BIGINT AS matches,
    {_saturated("sum(points::HUGEINT)", str(ROLLUP_CAP))} AS points_sum,
    max({_best_key("points", "event_time", largest=True)}) AS mx,
    min({_best_key("points", "event_time", largest=False)}) AS mn,
    max({{'t': epoch_us(event_time), 'm': match_id, 'p': points}}) AS lst,
    min(event_time) AS first_event_at,
    max(event_time) AS last_event_at
"""

#: `_ROLLUP_COLUMNS` of `_ROLLUP_AGGREGATES`' packed keys.
_ROLLUP_EVENT_COLUMNS = f"""
    player_id, event_date, region, mode, mask, matches, points_sum,
    {_high("mx", _WIDE_BITS)}::BIGINT AS max_points,
    make_timestamp((9223372036854775807 - {_low("mx", _WIDE_BITS)})::BIGINT)::TIMESTAMPTZ
        AS max_at,
    {_high("mn", _WIDE_BITS)}::BIGINT AS min_points,
    make_timestamp(({_low("mn", _WIDE_BITS)} - 9223372036854775808)::BIGINT)::TIMESTAMPTZ
        AS min_at,
    lst.p AS last_points, lst.m AS last_match, first_event_at, last_event_at
"""

#: A carried window's previous standings row as a partial aggregate of the same shape as an
#: exploded rollup row: each aggregation's state is its score with its time mark (a sum's
#: total, a max/min's best with the earliest time reaching it, a last's points with its
#: event time and match), and every board keeps matches, first/last event and last match.
_STATE_ROWS = """
                SELECT b.bw, p.pc, st.matches,
                       CASE WHEN b.aggregation = 'sum' THEN st.score END AS points_sum,
                       CASE WHEN b.aggregation = 'max' THEN st.score END AS max_points,
                       CASE WHEN b.aggregation = 'max' THEN st.reached_at END AS max_at,
                       CASE WHEN b.aggregation = 'min' THEN st.score END AS min_points,
                       CASE WHEN b.aggregation = 'min' THEN st.reached_at END AS min_at,
                       CASE WHEN b.aggregation = 'last' THEN st.score END AS last_points,
                       st.last_match_id AS last_match, st.first_event_at, st.last_event_at
                FROM state_v st
                JOIN bw_t b ON b.board = st.board AND b.window_id = st.window_id
                JOIN players_i p ON p.player_id = st.player_id
"""

_STATE_EMPTY = pa.table({
    "board": pa.array([], pa.string()), "window_id": pa.array([], pa.string()),
    "player_id": pa.array([], pa.string()), "score": pa.array([], pa.int64()),
    "matches": pa.array([], pa.int64()), "reached_at": pa.array([], TIMESTAMP),
    "first_event_at": pa.array([], TIMESTAMP), "last_event_at": pa.array([], TIMESTAMP),
    "last_match_id": pa.array([], pa.string()),
})


#: DuckDB memory one fanned-out (board-window, player) row costs the standings aggregation
#: (measured: 16.7M rows into 5.7M groups peaked at 1.29 GB), and the share of the memory
#: limit one part of it may take (the rest holds the aggregated rows, the sort, Arrow).
_FANNED_ROW_BYTES = 80
_PART_SHARE = 0.25

_UNITS = {"": 1, "B": 1, "BYTES": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def _memory_limit(con: duckdb.DuckDBPyConnection) -> int:
    """DuckDB's memory limit in bytes (its setting reads back as e.g. '7.4 GiB')."""
    text = str(con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0])
    number, _, unit = text.strip().partition(" ")
    return int(float(number) * _UNITS.get(unit.strip().upper(), 1))


def _part_rows(con: duckdb.DuckDBPyConnection) -> int:
    """How many fanned-out rows one part of the standings aggregation may take."""
    return max(1, int(_memory_limit(con) * _PART_SHARE) // _FANNED_ROW_BYTES)


def histogram_sql(source: str) -> str:
    """The histogram rows (bw, kind, bucket, lower, upper, players, rank_from, rank_to) of
    the ranked rows in relation `source` (bw, score, rank, rn, total): equal-width score
    buckets and equal-depth rank buckets per bw. For an erasure, which re-ranks the windows a
    player leaves; the batch computes the same rows from its (bw, sort key) groups without
    ranking every row (DuckDBEngine._histograms)."""
    return f"""
            WITH b AS (
                SELECT bw, score, rank, rn, total,
                       min(score) OVER (PARTITION BY bw) AS lo,
                       max(score) OVER (PARTITION BY bw) AS hi
                FROM {source}
            ), width AS (
                SELECT bw, 'width' AS kind,
                       CASE WHEN hi = lo THEN 0
                            ELSE least((score - lo) * {WIDTH_BUCKETS} // (hi - lo),
                                       {WIDTH_BUCKETS - 1}) END AS bucket,
                       any_value(lo) AS lo, any_value(hi) AS hi,
                       count(*) AS players, min(rank) AS rank_from, max(rank) AS rank_to
                FROM b GROUP BY ALL
            ), depth AS (
                SELECT bw, 'depth' AS kind,
                       (rn - 1) * {DEPTH_BUCKETS} // total AS bucket,
                       min(score)::DOUBLE AS lower, max(score)::DOUBLE AS upper,
                       count(*) AS players, min(rank) AS rank_from, max(rank) AS rank_to
                FROM b GROUP BY ALL
            )
            SELECT bw, kind, bucket::BIGINT AS bucket,
                   lo + bucket * (hi - lo) / {WIDTH_BUCKETS}.0 AS lower,
                   lo + (bucket + 1) * (hi - lo) / {WIDTH_BUCKETS}.0 AS upper,
                   players::BIGINT AS players, rank_from::BIGINT AS rank_from,
                   rank_to::BIGINT AS rank_to
            FROM width
            UNION ALL
            SELECT bw, kind, bucket::BIGINT, lower, upper, players::BIGINT,
                   rank_from::BIGINT, rank_to::BIGINT
            FROM depth
    """


class DuckDBEngine:
    """Batch transforms on an embedded DuckDB (threads = cores unless told otherwise)."""

    name = "duckdb"

    def __init__(self, *, threads: int | None = None, memory_limit: str | None = None,
                 temp_dir: str | None = None) -> None:
        self.con = duckdb.connect(config={"preserve_insertion_order": False})
        self.con.execute("SET TimeZone = 'UTC'")
        self.con.execute(f"SET threads = {int(threads or os.cpu_count() or 2)}")
        # The histograms' ASOF joins (`_histograms`) must stay sort-merge joins: DuckDB
        # plans an ASOF join whose left side it estimates small (the depth buckets, from an
        # unnest it cannot size) as a nested loop over every right row before it, which is
        # buckets x distinct scores per board-window (5M rows on 20k players, a third of a
        # night's CPU, and growing with every player a long window gains).
        self.con.execute("SET asof_loop_join_threshold = 0")
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
        voids: pa.Table | None = None,
    ) -> tuple[pa.Table, int]:
        """Deduped events with since <= ingested_at < watermark, rolled up per player-day.

        First ingested wins inside the new rows; a new row whose identity is among the
        `absorbed` files' rows (ingested before `since`) is a late duplicate and is dropped;
        so is a row `voids` (match_id, player_id or null: the whole match) covers.
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
        window = f"ingested_at < make_timestamp({epoch_us(watermark)})::TIMESTAMPTZ"
        if since is not None:
            window += f" AND ingested_at >= make_timestamp({epoch_us(since)})::TIMESTAMPTZ"
        if voids is not None and voids.num_rows:
            con.register("voids_t", voids)
            window += (" AND match_id NOT IN (SELECT match_id FROM voids_t WHERE player_id IS"
                       " NULL) AND (match_id, player_id) NOT IN (SELECT (match_id, player_id)"
                       " FROM voids_t WHERE player_id IS NOT NULL)")
        con.execute(f"""
            CREATE OR REPLACE TEMP TABLE new_events AS
            SELECT match_id, player_id, points, event_time, region,
                   coalesce(board, mode) AS mode, ingested_at,
                   coalesce(backfill, false) AS backfill, board
            FROM ({_LANDED_SQL})
            WHERE {window}
            QUALIFY row_number() OVER (PARTITION BY match_id, player_id, board
                                       ORDER BY ingested_at, filename) = 1
        """, {"files": list(files)})
        if absorbed and since is not None:
            con.execute(f"""
                DELETE FROM new_events n WHERE EXISTS (
                    SELECT 1 FROM (SELECT * FROM read_parquet($absorbed, hive_partitioning = false,
                                                              union_by_name = true)
                                   UNION ALL BY NAME SELECT NULL::VARCHAR AS board WHERE false) a
                    WHERE a.ingested_at < make_timestamp({epoch_us(since)})::TIMESTAMPTZ
                      AND a.match_id = n.match_id AND a.player_id = n.player_id
                      AND a.board IS NOT DISTINCT FROM n.board)
            """, {"absorbed": list(absorbed)})
        counted = con.execute("SELECT count(*) FROM new_events").fetchall()[0][0]
        # In the order the rollup files keep (jobs.batch then writes them as they come).
        table = con.sql(f"""
            WITH e AS (
                SELECT e.*, e.event_time::DATE AS event_date, {_mask_sql(bits)} AS mask
                FROM new_events e JOIN calendar_wide c ON c.event_date = e.event_time::DATE
            ), g AS (
                SELECT player_id, event_date, region, mode, mask, {_ROLLUP_AGGREGATES}
                FROM e GROUP BY player_id, event_date, region, mode, mask
            )
            SELECT {_ROLLUP_EVENT_COLUMNS} FROM g ORDER BY event_date, player_id, region, mode, mask
        """).to_arrow_table()
        con.execute("DROP TABLE new_events")
        con.unregister("calendar_t")
        if voids is not None and voids.num_rows:
            con.unregister("voids_t")
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
                SELECT r.* EXCLUDE (filename)
                FROM read_parquet({_sql_list(paths)}, filename = true,
                                  hive_partitioning = false) r
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
            with contextlib.suppress(duckdb.Error):
                con.unregister(name)
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
        delta: pa.Table | None = None,
        carry: pa.Table | None = None,
    ) -> StandingsResult:
        """Ranked standings for every (board, window_id) in `needed`.

        `rollups` lists (path, event_date): the file holding each date's authoritative rows.
        `carry` (CARRY_SCHEMA) names the board-windows carried forward: built from the
        previous version's standings rows of that window (`path`; none: no rows yet) plus
        the `delta` rollup rows (this run's new events), never from `rollups` (see
        jobs.spec.CARRY_SCHEMA). Returns a `StandingsResult` (the ordered rows, histograms,
        the windows that received events; or, when some score does not fit an exact sort
        key, only the overflow).

        Integer codes end to end: a board-window is `bw`, a player `pc` (numbered in
        player_id order), a rollup row's last match `mc` (numbered in match_id order); strings
        come back only on the way out (`jobs.rank_stream`). Ranks come from one sort of the
        final stream; the histograms from the (board-window, sort key) groups, which are far
        fewer than the rows.
        """
        con = self.con
        con.register("spec_t", spec)
        con.register("calendar_t", calendar)
        con.register("needed_t", needed)
        con.register("banned_t", pa.table({"player_id": pa.array(list(banned), pa.string())}))
        con.register("rollup_index", rollups)
        paths = sorted(set(rollups.column("path").to_pylist()))
        aggregations = set(spec.column("aggregation").to_pylist())
        self._register_carry(delta, carry)
        # Read once: the rows of the dates each file is authoritative for, and this run's new
        # rollup rows (`from_delta`: they feed the carried windows only).
        columns = ", ".join(n for n in ROLLUP_SCHEMA.names)
        stored = (f"""
            SELECT {", ".join("r." + n for n in ROLLUP_SCHEMA.names)}, false AS from_delta
            FROM read_parquet({_sql_list(paths)}, filename = true, hive_partitioning = false) r
            SEMI JOIN rollup_index i ON i.path = r.filename AND i.event_date = r.event_date
        """ if paths else f"SELECT {columns}, false AS from_delta FROM delta_t WHERE false")
        con.execute(f"""
            CREATE OR REPLACE TEMP TABLE rollup_rows AS
            {stored}
            UNION ALL SELECT {columns}, true AS from_delta FROM delta_t
        """)
        con.execute("""
            CREATE OR REPLACE TEMP TABLE spec_i AS
            SELECT *, (row_number() OVER (ORDER BY board, kind))::INTEGER AS bno FROM spec_t
        """)
        con.execute("""
            CREATE OR REPLACE TEMP TABLE cal_i AS
            SELECT event_date, kind, window_id, window_start_us,
                   (dense_rank() OVER (ORDER BY window_id))::INTEGER AS wno
            FROM calendar_t
        """)
        con.execute("""
            CREATE OR REPLACE TEMP TABLE bw_t AS
            SELECT (row_number() OVER (ORDER BY s.board, w.window_id))::INTEGER AS bw,
                   s.bno, w.wno, s.board, w.window_id, w.window_start_us, s.aggregation,
                   s.sign, s.earliest, s.time_bits, s.time_unit_us, s.score_limit,
                   c.board IS NOT NULL AS carried
            FROM (SELECT DISTINCT kind, window_id, window_start_us, wno FROM cal_i) w
            JOIN spec_i s ON s.kind = w.kind
            LEFT JOIN (SELECT DISTINCT board, window_id FROM carry_t) c
                ON c.board = s.board AND c.window_id = w.window_id
            SEMI JOIN needed_t n ON n.board = s.board AND n.window_id = w.window_id
        """)
        con.execute("""
            CREATE OR REPLACE TEMP TABLE players_i AS
            SELECT player_id, (row_number() OVER (ORDER BY player_id))::INTEGER AS pc
            FROM (SELECT player_id FROM rollup_rows UNION SELECT player_id FROM state_v)
        """)
        con.execute("""
            CREATE OR REPLACE TEMP TABLE matches_i AS
            SELECT last_match, (row_number() OVER (ORDER BY last_match))::INTEGER AS mc
            FROM (SELECT last_match FROM rollup_rows
                  UNION SELECT last_match_id FROM state_v WHERE last_match_id IS NOT NULL)
        """)
        # Each (region, mode) pair a code `rmc`, and the board-windows each (date, rmc) feeds
        # with the lateness bit that gates them: a few thousand rows, so each rollup row fans
        # out by one small join on integers. Direct scores (region "", their board in `mode`,
        # see jobs.spec.ROLLUP_SCHEMA) feed their board only.
        con.execute("""
            CREATE OR REPLACE TEMP TABLE rm_i AS
            SELECT region, mode, (row_number() OVER (ORDER BY region, mode))::INTEGER AS rmc
            FROM (SELECT DISTINCT region, mode FROM rollup_rows)
        """)
        con.execute("""
            CREATE OR REPLACE TEMP TABLE fan AS
            SELECT c.event_date, rm.rmc, b.bw, s.bit, b.carried,
                   (CASE s.aggregation WHEN 'max' THEN 1 WHEN 'min' THEN 2 WHEN 'last' THEN 3
                                       ELSE 0 END)::UTINYINT AS agg
            FROM rm_i rm
            JOIN spec_i s ON CASE WHEN rm.region = '' THEN s.scope_key = 'board:' || rm.mode
                                  ELSE s.scope_key IN ('global', 'region:' || rm.region,
                                                       'mode:' || rm.mode) END
            JOIN cal_i c ON c.kind = s.kind
            JOIN bw_t b ON b.bno = s.bno AND b.wno = c.wno
        """)
        # The latest counted event of a (board-window, player) is the largest (event time,
        # match code) pair, packed in one key (`_LastKey`: a BIGINT when the run's time span
        # and match codes fit, else a HUGEINT; times may be negative, so it is a product,
        # not a shift): max gives its time and match, and arg_max a `last` board's points.
        # A max or min board's best (score, earliest time) is one packed key too. Codes and
        # keys are computed once per rollup row, before the fan-out multiplies the rows by
        # the board-windows they feed; each fanned-out row keeps only the key its board
        # aggregates (the others null, skipped for free).
        first_us, last_us = con.execute("""
            SELECT min(t), max(t) FROM (SELECT epoch_us(last_event_at) AS t FROM rollup_rows
                                        UNION ALL
                                        SELECT epoch_us(last_event_at) FROM state_v)
        """).fetchall()[0]
        codes = con.execute("SELECT count(*) FROM matches_i").fetchall()[0][0]
        last = _LastKey(first_us, last_us, codes)
        con.execute(f"""
            CREATE OR REPLACE TEMP TABLE coded AS
            SELECT p.pc, rm.rmc, r.event_date, r.mask, r.from_delta, r.matches,
                   r.points_sum, {_best_key("r.max_points", "r.max_at", largest=True)} AS max_key,
                   {_best_key("r.min_points", "r.min_at", largest=False)} AS min_key,
                   r.last_points, r.first_event_at,
                   {last.pack("r.last_event_at", "m.mc")} AS last_key
            FROM rollup_rows r
            JOIN players_i p ON p.player_id = r.player_id
            JOIN matches_i m ON m.last_match = r.last_match
            JOIN rm_i rm ON rm.region IS NOT DISTINCT FROM r.region
                        AND rm.mode IS NOT DISTINCT FROM r.mode
        """)
        con.execute("DROP TABLE rollup_rows")
        extra = []
        if "max" in aggregations:
            extra.append("max(x.max_key) AS mx")
        if "min" in aggregations:
            extra.append("min(x.min_key) AS mn")
        if "last" in aggregations:
            extra.append("arg_max(x.last_points, x.last_key) AS last_points")
        extra_sql = "".join(f", {e}" for e in extra)
        mx_p, mx_t = ((f"{_high('u.mx', _WIDE_BITS)}::BIGINT",
                       f"(9223372036854775807 - {_low('u.mx', _WIDE_BITS)})::BIGINT")
                      if "max" in aggregations else ("NULL", "NULL"))
        mn_p, mn_t = ((f"{_high('u.mn', _WIDE_BITS)}::BIGINT",
                       f"({_low('u.mn', _WIDE_BITS)} - 9223372036854775808)::BIGINT")
                      if "min" in aggregations else ("NULL", "NULL"))
        last_p = "u.last_points" if "last" in aggregations else "NULL"
        # Banned players are kept here (a window that received only their events still
        # exists) and dropped once the windows are known. One statement per part (a run of
        # board-windows, `_parts`), so that no part's aggregation outgrows the memory limit.
        parts = self._parts()
        statement = f"""
            WITH x AS (
                SELECT f.bw, r.pc, r.matches, r.points_sum,
                       CASE WHEN f.agg = 1 THEN r.max_key END AS max_key,
                       CASE WHEN f.agg = 2 THEN r.min_key END AS min_key,
                       CASE WHEN f.agg = 3 THEN r.last_points END AS last_points,
                       r.first_event_at, r.last_key
                FROM coded r
                JOIN (SELECT * FROM fan WHERE bw BETWEEN {{lo}} AND {{hi}}) f
                    ON f.event_date = r.event_date AND f.rmc = r.rmc
                   AND f.carried = r.from_delta
                WHERE f.bit < 0 OR ((r.mask >> f.bit) & 1) = 1
                UNION ALL
                SELECT st.bw, st.pc, st.matches, st.points_sum,
                       {_best_key("st.max_points", "st.max_at", largest=True)},
                       {_best_key("st.min_points", "st.min_at", largest=False)},
                       st.last_points, st.first_event_at,
                       {last.pack("st.last_event_at", "coalesce(m.mc, 0)")}
                FROM ({_STATE_ROWS}) st LEFT JOIN matches_i m ON m.last_match = st.last_match
                WHERE st.bw BETWEEN {{lo}} AND {{hi}}
            ), u AS (
                SELECT bw, pc,
                       sum(matches)::BIGINT AS matches,
                       sum(points_sum) AS points_sum,
                       max(last_key) AS last_key,
                       min(first_event_at) AS first_event_at{extra_sql}
                FROM x
                GROUP BY bw, pc
            ), s AS (
                SELECT u.bw, u.pc, b.sign, b.earliest, b.time_bits, b.time_unit_us,
                       b.window_start_us, u.matches, u.first_event_at,
                       {last.time_us("u.last_key")} AS last_us,
                       {last.code("u.last_key")} AS mc,
                       CASE b.aggregation
                           WHEN 'sum' THEN {_saturated("u.points_sum", "b.score_limit")}
                           WHEN 'max' THEN {mx_p}
                           WHEN 'min' THEN {mn_p}
                           ELSE {last_p} END AS score,
                       CASE b.aggregation WHEN 'max' THEN {mx_t}
                                          WHEN 'min' THEN {mn_t}
                                          ELSE last_us END AS reached_us
                FROM u JOIN bw_t b USING (bw)
            )
            SELECT bw, pc, score, matches, first_event_at, last_us, mc, reached_us, time_bits,
                   CASE WHEN earliest THEN
                       (sign * score) * (1::BIGINT << time_bits)
                       + ((1::BIGINT << time_bits) - 1
                          - (reached_us - window_start_us) // time_unit_us)
                       ELSE sign * score END AS sort_key
            FROM s
        """
        for n, (lo, hi) in enumerate(parts):
            part = statement.replace("{lo}", str(lo)).replace("{hi}", str(hi))
            con.execute(("INSERT INTO scored " if n else
                         "CREATE OR REPLACE TEMP TABLE scored AS ") + part)
        con.execute("DROP TABLE coded")
        # Windows that received data exist in the version even if bans empty them.
        windows = con.sql("""
            SELECT board, window_id FROM bw_t SEMI JOIN (SELECT DISTINCT bw FROM scored)
                USING (bw)
            ORDER BY ALL""").to_arrow_table()
        con.execute("""
            CREATE OR REPLACE TEMP TABLE banned_i AS
            SELECT pc FROM players_i SEMI JOIN banned_t USING (player_id)
        """)
        if con.execute("SELECT count(*) FROM banned_i").fetchall()[0][0]:
            con.execute("DELETE FROM scored WHERE pc IN (SELECT pc FROM banned_i)")
        # Registry load and saturation keep every score in range, so this finds nothing; it
        # stays as the last guard against publishing an inexact key.
        overflow = con.sql("""
            SELECT b.board, b.window_id, p.player_id, s.score, s.time_bits
            FROM scored s JOIN bw_t b USING (bw) JOIN players_i p USING (pc)
            WHERE abs(s.score) > b.score_limit
            LIMIT 10
        """).to_arrow_table()
        if overflow.num_rows:
            return StandingsResult.overflowed(overflow, windows)
        histograms, totals = self._histograms()
        names = con.sql("SELECT board, window_id, earliest FROM bw_t ORDER BY bw"
                        ).to_arrow_table()
        players = con.sql("SELECT player_id FROM players_i ORDER BY pc").to_arrow_table()
        matches = con.sql("SELECT last_match FROM matches_i ORDER BY mc").to_arrow_table()
        # The stream must arrive in ORDER BY order, which DuckDB only promises with
        # preserve_insertion_order on (off elsewhere for speed).
        con.execute("SET preserve_insertion_order = true")
        ordered = self._ordered(parts)
        reader = rank_stream(
            ordered, boards=names.column("board"), window_ids=names.column("window_id"),
            earliest=names.column("earliest"), totals=totals, players=players.column(0),
            matches=matches.column(0))
        ahead = prefetched(reader)
        return StandingsResult(ahead.reader, histograms, windows, stop=ahead.stop)

    def _parts(self) -> list[tuple[int, int]]:
        """Runs of board-windows (first bw, last bw) that `scored` is aggregated and sorted
        by, one at a time: each run's fanned-out rows (estimated from the rollup rows each
        (date, region-mode) pair holds and the board-windows it feeds, at
        `_FANNED_ROW_BYTES` each) stay within `_PART_SHARE` of the memory limit
        (`_part_rows`), so its hash table and sort fit in memory instead of spilling
        (issue 13 goal 5). A carried window's previous rows are not counted.
        One run covers every board-window when they all fit, as on any nightly run."""
        con = self.con
        last = con.execute("SELECT coalesce(max(bw), 0) FROM bw_t").fetchall()[0][0]
        budget = _part_rows(con)
        counts = dict(con.execute("""
            SELECT f.bw, sum(c.n)::BIGINT
            FROM (SELECT event_date, rmc, from_delta, count(*) AS n FROM coded GROUP BY ALL) c
            JOIN fan f ON f.event_date = c.event_date AND f.rmc = c.rmc
                      AND f.carried = c.from_delta
            GROUP BY f.bw
        """).fetchall())
        parts: list[tuple[int, int]] = []
        first, size = 1, 0
        for bw in range(1, last + 1):
            rows = int(counts.get(bw, 0))
            if size and size + rows > budget:
                parts.append((first, bw - 1))
                first, size = bw, 0
            size += rows
        parts.append((first, max(last, first)))
        return parts

    def _ordered(self, parts: list[tuple[int, int]]) -> pa.RecordBatchReader:
        """The rows of `scored` ordered by (bw, sort_key desc, pc): each part sorted on its
        own (parts are runs of bw, so their concatenation is the whole order), one at a
        time as the reader is drained."""
        con = self.con

        def part(lo: int, hi: int) -> pa.RecordBatchReader:
            return con.sql(f"""
                SELECT bw, pc, score, sort_key, matches, reached_us, first_event_at, last_us,
                       mc
                FROM scored WHERE bw BETWEEN {lo} AND {hi} ORDER BY bw, sort_key DESC, pc
            """).to_arrow_reader(batch_size=256 * 1024)

        head = part(*parts[0])

        def batches() -> Iterator[pa.RecordBatch]:
            yield from head
            for lo, hi in parts[1:]:
                yield from part(lo, hi)

        return pa.RecordBatchReader.from_batches(head.schema, batches())

    def _histograms(self) -> tuple[pa.Table, pa.Array]:
        """Both histogram kinds of every ranked board-window, and each one's player count
        (indexed by bw - 1), from `scored` without ranking its rows.

        Rows sort by sort key, and a score is a function of the key, so a (board-window,
        sort key) group is a run of rows: `before` rows precede it. A width bucket is a run
        of such groups; a depth bucket is the run of positions rn with
        (rn - 1) * DEPTH_BUCKETS // total = bucket, whose first and last rows are found in
        the groups by an as-of join. Ranks: shared, a group's `before` + 1; earliest, the
        position.
        """
        con = self.con
        con.execute("""
            CREATE OR REPLACE TEMP TABLE key_groups AS
            SELECT bw, sort_key, score, c, cum - c AS before, cum
            FROM (SELECT *, sum(c) OVER (PARTITION BY bw ORDER BY sort_key DESC
                                         ROWS UNBOUNDED PRECEDING) AS cum
                  FROM (SELECT bw, sort_key, any_value(score) AS score, count(*) AS c
                        FROM scored GROUP BY bw, sort_key))
        """)
        con.execute("""
            CREATE OR REPLACE TEMP TABLE bw_stats AS
            SELECT k.bw, b.earliest, sum(k.c)::BIGINT AS total, min(k.score) AS lo,
                   max(k.score) AS hi
            FROM key_groups k JOIN bw_t b USING (bw) GROUP BY k.bw, b.earliest
        """)
        histograms = con.sql(f"""
            WITH width AS (
                SELECT k.bw, 'width' AS kind,
                       CASE WHEN s.hi = s.lo THEN 0
                            ELSE least((k.score - s.lo) * {WIDTH_BUCKETS} // (s.hi - s.lo),
                                       {WIDTH_BUCKETS - 1}) END AS bucket,
                       any_value(s.lo) AS lo, any_value(s.hi) AS hi,
                       sum(k.c) AS players, min(k.before + 1) AS rank_from,
                       max(CASE WHEN s.earliest THEN k.cum ELSE k.before + 1 END) AS rank_to
                FROM key_groups k JOIN bw_stats s USING (bw) GROUP BY ALL
            ), spans AS (
                SELECT bw, earliest, bucket,
                       (bucket * total + {DEPTH_BUCKETS - 1}) // {DEPTH_BUCKETS} + 1 AS first_rn,
                       ((bucket + 1) * total + {DEPTH_BUCKETS - 1}) // {DEPTH_BUCKETS}
                           AS last_rn
                FROM (SELECT *, unnest(range({DEPTH_BUCKETS})) AS bucket FROM bw_stats)
            ), ends AS (
                SELECT s.bw, s.earliest, s.bucket, s.first_rn, s.last_rn,
                       f.score AS first_score, f.before AS first_before
                FROM spans s ASOF JOIN key_groups f ON f.bw = s.bw AND s.first_rn > f.before
                WHERE s.first_rn <= s.last_rn
            ), depth AS (
                SELECT e.bw, 'depth' AS kind, e.bucket,
                       least(e.first_score, l.score)::DOUBLE AS lower,
                       greatest(e.first_score, l.score)::DOUBLE AS upper,
                       e.last_rn - e.first_rn + 1 AS players,
                       CASE WHEN e.earliest THEN e.first_rn ELSE e.first_before + 1 END
                           AS rank_from,
                       CASE WHEN e.earliest THEN e.last_rn ELSE l.before + 1 END AS rank_to
                FROM ends e ASOF JOIN key_groups l ON l.bw = e.bw AND e.last_rn > l.before
            ), h AS (
                SELECT bw, kind, bucket::BIGINT AS bucket,
                       lo + bucket * (hi - lo) / {WIDTH_BUCKETS}.0 AS lower,
                       lo + (bucket + 1) * (hi - lo) / {WIDTH_BUCKETS}.0 AS upper,
                       players::BIGINT AS players, rank_from::BIGINT AS rank_from,
                       rank_to::BIGINT AS rank_to
                FROM width
                UNION ALL
                SELECT bw, kind, bucket::BIGINT, lower, upper, players::BIGINT,
                       rank_from::BIGINT, rank_to::BIGINT
                FROM depth
            )
            SELECT w.board, w.window_id, h.kind, h.bucket, h.lower, h.upper, h.players,
                   h.rank_from, h.rank_to
            FROM h JOIN bw_t w USING (bw)
            ORDER BY w.board, w.window_id, h.kind, h.bucket
        """).to_arrow_table()
        totals = con.sql("""
            SELECT coalesce(s.total, 0)::BIGINT AS total
            FROM bw_t b LEFT JOIN bw_stats s USING (bw) ORDER BY b.bw
        """).to_arrow_table().column(0).combine_chunks()
        con.execute("DROP TABLE key_groups")
        return histograms, totals

    def _register_carry(self, delta: pa.Table | None, carry: pa.Table | None) -> None:
        """`carry_t`, `delta_t` and `state_v` (the carried windows' previous standings rows,
        with their board) for the standings pass; empty when nothing is carried."""
        con = self.con
        carry = CARRY_SCHEMA.empty_table() if carry is None else carry.cast(CARRY_SCHEMA)
        delta = ROLLUP_SCHEMA.empty_table() if delta is None else delta
        con.register("carry_t", carry)
        con.register("delta_t", delta.select(ROLLUP_SCHEMA.names).cast(ROLLUP_SCHEMA))
        paths = sorted({p for p in carry.column("path").to_pylist() if p})
        # A table, not a view: the state is read by the player and match codes and by the
        # aggregation, and a view would decode the carried files (the long windows, which
        # grow with the history) once for each.
        if paths:
            con.execute(f"""
                CREATE OR REPLACE TEMP TABLE state_v AS
                SELECT c.board, s.window_id, s.player_id, s.score, s.matches, s.reached_at,
                       s.first_event_at, s.last_event_at, s.last_match_id
                FROM read_parquet({_sql_list(paths)}, filename = true,
                                  hive_partitioning = false) s
                JOIN carry_t c ON c.path = s.filename AND c.window_id = s.window_id
            """)
        else:
            con.register("state_empty", _STATE_EMPTY)
            con.execute("CREATE OR REPLACE TEMP TABLE state_v AS SELECT * FROM state_empty")
            con.unregister("state_empty")

    def finish(self) -> None:
        """Drop the per-run temp tables (after the standings reader is drained)."""
        self.con.execute("SET preserve_insertion_order = false")
        for table in ("scored", "spec_i", "cal_i", "bw_t", "players_i", "matches_i", "rm_i",
                      "fan", "banned_i", "bw_stats", "rollup_rows", "coded", "key_groups",
                      "state_v"):
            self.con.execute(f"DROP TABLE IF EXISTS {table}")
        for name in ("spec_t", "calendar_t", "needed_t", "banned_t", "rollup_index", "carry_t",
                     "delta_t"):
            with contextlib.suppress(duckdb.Error):
                self.con.unregister(name)
