"""The Spark engine: the DuckDB engine's semantics, row for row, on one machine or a cluster.

Usage: LEADERBOARD_ENGINE=spark python -m jobs.batch --as-of 2026-12-01
       SPARK_MASTER=spark://host:7077 python -m jobs.batch --as-of 2026-12-01 --engine spark
       spark-submit --master yarn jobs/batch.py --as-of 2026-12-01 --engine spark

`jobs.duckdb_engine` is the reference: its SQL defines what every column means, and the
engine-parity tests hold the two to identical rows. The Parquet inputs are read by Spark and
all the heavy work (dedupe, rollups, scoring, sorting, ranking, histograms) runs on the
executors; the driver only handles small tables (calendar, spec, per-partition counts) and
the final results.

Inside Spark, instants are microseconds since the epoch (`unix_micros`) and dates are days
since the epoch (`unix_date`), so nothing depends on the session time zone; Arrow types are
restored on the driver.

Ranking never gathers a board-window into one partition (docs/design.md section 4). Rows are
range-partitioned and sorted by (board, window_id, sort_key desc, player_id), so every
partition holds a contiguous slice of the global order and a board-window may span many
partitions. One pass over each partition numbers its rows within each board-window run
(`local_rn`) and notes where each row's tie group starts in that run (`local_tie`). A small
table of per (partition, board-window) counts and first/last keys goes to the driver, which
turns it into prefix offsets and, for `shared` ties, the rank a tie group carries across a
partition edge; broadcast back, they give every row its row number, competition rank and
the board-window's total.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator, MutableMapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

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

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = [
    "HISTOGRAM_COLUMNS",
    "STANDINGS_COLUMNS",
    "SparkEngine",
    "apply_offsets",
    "local_defaults",
    "number_within_partitions",
    "partition_offsets",
    "partition_stats",
    "sort_for_ranking",
]

_DAY_US = 86_400_000_000
_DEFAULT_MASTER = "local[2]"
_DEFAULT_SHUFFLE_PARTITIONS = 8

#: The standings stream, as the DuckDB engine returns it.
STANDINGS_COLUMNS = pa.schema([
    ("board", pa.string()), ("window_id", pa.string()), ("player_id", pa.string()),
    ("score", pa.int64()), ("sort_key", pa.int64()), ("rank", pa.int64()),
    ("percentile", pa.float64()), ("matches", pa.int64()), ("reached_at", TIMESTAMP),
    ("first_event_at", TIMESTAMP), ("last_event_at", TIMESTAMP), ("last_match_id", pa.string()),
])
#: Histogram rows, as the DuckDB engine returns them.
HISTOGRAM_COLUMNS = pa.schema([
    ("board", pa.string()), ("window_id", pa.string()), ("kind", pa.string()),
    ("bucket", pa.int64()), ("lower", pa.float64()), ("upper", pa.float64()),
    ("players", pa.int64()), ("rank_from", pa.int64()), ("rank_to", pa.int64()),
])
_OVERFLOW_COLUMNS = pa.schema([
    ("board", pa.string()), ("window_id", pa.string()), ("player_id", pa.string()),
    ("score", pa.int64()), ("time_bits", pa.int64()),
])
_WINDOW_COLUMNS = pa.schema([("board", pa.string()), ("window_id", pa.string())])

# Read schemas (DDL): no footer inference, and only the columns used are read.
_EVENTS_DDL = ("match_id string, player_id string, points bigint, event_time timestamp, "
               "region string, mode string, ingested_at timestamp, backfill boolean, "
               "board string")
_ROLLUP_DDL = ("player_id string, event_date date, region string, mode string, mask bigint, "
               "matches bigint, points_sum bigint, max_points bigint, max_at timestamp, "
               "min_points bigint, min_at timestamp, last_points bigint, last_match string, "
               "first_event_at timestamp, last_event_at timestamp")
#: A carried window's previous standings rows (jobs.spec.CARRY_SCHEMA).
_STATE_DDL = ("window_id string, player_id string, score bigint, matches bigint, "
              "reached_at timestamp, first_event_at timestamp, last_event_at timestamp, "
              "last_match_id string")
#: The rows grouped per (board-window, player): exploded rollup rows and carried state alike.
_COUNTED = ("player_id", "board", "window_id", "aggregation", "sign", "earliest", "time_bits",
            "time_unit_us", "score_limit", "window_start_us", "matches", "points_sum",
            "max_points", "max_at", "min_points", "min_at", "last_points", "last_match",
            "first_event_at", "last_event_at")
_COUNTED_TYPES = {"player_id": pa.string(), "board": pa.string(), "window_id": pa.string(),
                  "aggregation": pa.string(), "earliest": pa.bool_(),
                  "last_match": pa.string()}
_ROLLUP_INSTANTS = ("max_at", "min_at", "first_event_at", "last_event_at")

# The columns ranked (sort_for_ranking), and the rows numbered (number_within_partitions).
_RANK_INPUT = ("board", "window_id", "player_id", "earliest", "score", "sort_key", "matches",
               "reached_us", "first_us", "last_us", "last_match_id")
_NUMBERED_DDL = ("board string, window_id string, player_id string, earliest boolean, "
                 "score bigint, sort_key bigint, matches bigint, reached_us bigint, "
                 "first_us bigint, last_us bigint, last_match_id string, pid int, "
                 "local_rn bigint, local_tie bigint")




def _np(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    return np.asarray(array.to_numpy(zero_copy_only=False))


_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _for_spark(path: str) -> str:
    """A local path made absolute here: the JVM does not follow this process's chdir."""
    return path if _SCHEME.match(path) else os.path.abspath(path)


def _byte_order(paths: Sequence[str]) -> list[str]:
    """Paths sorted as DuckDB compares VARCHARs (bytewise), for the dedupe tie-break."""
    return sorted(set(paths), key=lambda p: p.encode("utf-8", "surrogateescape"))


# -- Arrow <-> Spark at the driver's edge -----------------------------------------------------

def _to_spark_types(table: pa.Table) -> pa.Table:
    """Dates as int32 days and instants as int64 microseconds (Spark-side conventions)."""
    columns = []
    for field, column in zip(table.schema, table.columns, strict=True):
        if pa.types.is_date32(field.type):
            column = pc.cast(column, pa.int32())
        elif pa.types.is_timestamp(field.type):
            column = pc.cast(pc.cast(column, pa.timestamp("us", tz="UTC")), pa.int64())
        columns.append(column)
    return pa.table(columns, names=table.column_names)


def _to_arrow(table: pa.Table, schema: pa.Schema, *, days: Sequence[str] = (),
              instants: Sequence[str] = ()) -> pa.Table:
    """Cast a collected table to `schema`, restoring dates and instants from their numbers."""
    columns = []
    for field in schema:
        column = table.column(field.name)
        if field.name in days:
            column = pc.cast(pc.cast(column, pa.int32()), pa.date32())
        elif field.name in instants:
            column = pc.cast(pc.cast(column, pa.int64()), field.type)
        columns.append(pc.cast(column, field.type))
    return pa.Table.from_arrays(columns, schema=schema)


# -- pure transforms -------------------------------------------------------------------------

def _day_of(micros: str) -> Column:
    """UTC day number of the instant in column `micros` (floor division, before 1970 too)."""
    from pyspark.sql import functions as F

    return F.expr(f"CAST(({micros} - pmod({micros}, {_DAY_US}L)) div {_DAY_US}L AS INT)")


def _mask(bits: Sequence[LatenessBit]) -> Column:
    """The lateness mask of one event: bit j set iff it counts for bits[j]'s windows (a
    backfill counts in every window its event_time falls in; a file without the column, or
    a null, is not a backfill)."""
    from pyspark.sql import functions as F

    if not bits:
        return F.lit(0).cast("bigint")
    mask = F.lit(0).cast("bigint")
    backfill = F.coalesce(F.col("backfill"), F.lit(False))
    for b in bits:
        end = F.col(f"w_{b.kind.replace('-', '_')}")
        counts = end.isNotNull() & (backfill | (F.col("ingested_us") <= end + F.lit(b.grace_us)))
        mask = mask + F.when(counts, F.lit(1 << b.bit).cast("bigint")).otherwise(
            F.lit(0).cast("bigint"))
    return mask


def _saturated_sum(column: str, limit: Column) -> Column:
    """sum(column), exact in decimal(38,0), clamped to [-limit, limit] as a bigint (the
    DuckDB engine's _saturated; leaderboard.sortkey.saturate)."""
    from pyspark.sql import functions as F

    total = F.sum(F.col(column).cast("decimal(38,0)"))
    bound = limit.cast("decimal(38,0)")
    return F.greatest(F.least(total, bound), -bound).cast("bigint")


def _merge_aggregates(limit: Column | None = None) -> list[Column]:
    """Mergeable aggregates over rollup rows (the DuckDB engine's _MERGE_AGGREGATES); the
    points sum saturates at `limit` (default ROLLUP_CAP)."""
    from pyspark.sql import functions as F

    return [
        F.sum("matches").alias("matches"),
        _saturated_sum("points_sum", F.lit(ROLLUP_CAP) if limit is None else limit)
        .alias("points_sum"),
        F.max(F.struct(F.col("max_points").alias("p"), (-F.col("max_at")).alias("t"))).alias("mx"),
        F.min(F.struct(F.col("min_points").alias("p"), F.col("min_at").alias("t"))).alias("mn"),
        F.max(F.struct(F.col("last_event_at").alias("t"), F.col("last_match").alias("m"),
                       F.col("last_points").alias("p"))).alias("lst"),
        F.min("first_event_at").alias("first_event_at"),
        F.max("last_event_at").alias("last_event_at"),
    ]


def _rollup_columns() -> list[Column]:
    from pyspark.sql import functions as F

    return [
        F.col("player_id"), F.col("event_date"), F.col("region"), F.col("mode"), F.col("mask"),
        F.col("matches"), F.col("points_sum"),
        F.col("mx.p").alias("max_points"), (-F.col("mx.t")).alias("max_at"),
        F.col("mn.p").alias("min_points"), F.col("mn.t").alias("min_at"),
        F.col("lst.p").alias("last_points"), F.col("lst.m").alias("last_match"),
        F.col("first_event_at"), F.col("last_event_at"),
    ]


def sort_for_ranking(scored: DataFrame, partitions: int) -> DataFrame:
    """Range-partition and sort rows by (board, window_id, sort_key desc, player_id).

    Each partition then holds a contiguous slice of the global order; the partition number
    is kept in `pid`. A board-window with many rows spans many partitions (never one).
    """
    from pyspark.sql import functions as F

    order = [F.col("board"), F.col("window_id"), F.col("sort_key").desc(), F.col("player_id")]
    return (scored.select(*_RANK_INPUT)
            .repartitionByRange(partitions, *order)
            .sortWithinPartitions(*order)
            .withColumn("pid", F.spark_partition_id()))


def _number_runs(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Number the rows of one sorted partition within each board-window run.

    local_rn: 1-based position in the run; local_tie: the local_rn where the row's tie group
    (equal sort_key) starts in this run. State carries across Arrow batches.
    """
    last_group: tuple[str, str] | None = None
    last_key: int | None = None
    last_rn = last_tie = 0
    for batch in batches:
        n = batch.num_rows
        if n == 0:
            continue
        board = batch.column(batch.schema.get_field_index("board"))
        window = batch.column(batch.schema.get_field_index("window_id"))
        keys = np.asarray(batch.column(batch.schema.get_field_index("sort_key"))
                          .to_numpy(zero_copy_only=False), dtype=np.int64)
        new_group = np.ones(n, dtype=bool)
        if n > 1:
            same = pc.and_(pc.equal(board.slice(1), board.slice(0, n - 1)),
                           pc.equal(window.slice(1), window.slice(0, n - 1)))
            new_group[1:] = ~np.asarray(same.to_numpy(zero_copy_only=False), dtype=bool)
        new_group[0] = (board[0].as_py(), window[0].as_py()) != last_group
        index = np.arange(n, dtype=np.int64)
        start = np.maximum.accumulate(np.where(new_group, index, -1))
        # start < 0: the run began in an earlier batch of this partition
        rn = np.where(start < 0, last_rn + index + 1, index - start + 1)
        new_tie = new_group.copy()
        new_tie[1:] |= keys[1:] != keys[:-1]
        new_tie[0] |= last_key is None or int(keys[0]) != last_key
        tie_start = np.maximum.accumulate(np.where(new_tie, index, -1))
        tie = np.where(tie_start < 0, last_tie, rn[np.maximum(tie_start, 0)])
        last_group = (board[n - 1].as_py(), window[n - 1].as_py())
        last_key, last_rn, last_tie = int(keys[-1]), int(rn[-1]), int(tie[-1])
        yield pa.RecordBatch.from_arrays(
            [*batch.columns, pa.array(rn, pa.int64()), pa.array(tie, pa.int64())],
            names=[*batch.schema.names, "local_rn", "local_tie"])


def number_within_partitions(sorted_rows: DataFrame) -> DataFrame:
    """Add local_rn and local_tie to the output of sort_for_ranking, partition by partition
    (no exchange: one Arrow pass over each partition in its sorted order)."""
    return sorted_rows.mapInArrow(_number_runs, _NUMBERED_DDL)


def partition_stats(numbered: DataFrame) -> pa.Table:
    """Per (partition, board-window): rows, first and last sort_key, where the last tie
    group starts, lowest and highest score. Small: partitions x board-windows rows."""
    from pyspark.sql import functions as F

    return (numbered.groupBy("pid", "board", "window_id")
            .agg(F.count(F.lit(1)).alias("rows"), F.max("sort_key").alias("first_key"),
                 F.min("sort_key").alias("last_key"), F.max("local_tie").alias("last_tie"),
                 F.min("score").alias("lo"), F.max("score").alias("hi"))
            .toArrow())


def partition_offsets(stats: pa.Table) -> pa.Table:
    """From partition_stats, per (partition, board-window): the rows of the board-window in
    earlier partitions (`offset`), the rank of the run's first tie group (`first_rank`,
    carried across partition edges when a tie group continues), the board-window's `total`
    rows and its lowest and highest score (`lo`, `hi`)."""
    stats = stats.sort_by([("board", "ascending"), ("window_id", "ascending"),
                           ("pid", "ascending")])
    n = stats.num_rows
    rows = _np(stats.column("rows")).astype(np.int64)
    first = _np(stats.column("first_key")).astype(np.int64)
    last = _np(stats.column("last_key")).astype(np.int64)
    last_tie = _np(stats.column("last_tie")).astype(np.int64)
    new_window = np.ones(n, dtype=bool)
    if n > 1:
        board, window = stats.column("board"), stats.column("window_id")
        same = pc.and_(pc.equal(board.slice(1), board.slice(0, n - 1)),
                       pc.equal(window.slice(1), window.slice(0, n - 1)))
        new_window[1:] = ~_np(same).astype(bool)
    window_of = np.cumsum(new_window) - 1
    window_first = np.flatnonzero(new_window)
    before = np.cumsum(rows) - rows  # rows of all earlier entries
    offset = before - before[window_first][window_of]
    total = np.add.reduceat(rows, window_first)[window_of] if n else rows
    # The first tie group of entry i continues one from entry i-1 (same board-window).
    continued = np.zeros(n, dtype=bool)
    continued[1:] = ~new_window[1:] & (first[1:] == last[:-1])
    # The last tie group of entry i starts inside i unless the whole run is one continued group;
    # its rank is then offset + last_tie there, else that of the entry where it started.
    starts_here = ~(continued & (first == last))
    index = np.arange(n)
    anchor = np.maximum.accumulate(np.where(starts_here, index, 0))
    tail_rank = (offset + last_tie)[anchor]
    first_rank = offset + 1
    first_rank[1:] = np.where(continued[1:], tail_rank[:-1], offset[1:] + 1)
    lo = _np(stats.column("lo")).astype(np.int64)
    hi = _np(stats.column("hi")).astype(np.int64)
    if n:
        lo = np.minimum.reduceat(lo, window_first)[window_of]
        hi = np.maximum.reduceat(hi, window_first)[window_of]
    return pa.table({
        "pid": pc.cast(stats.column("pid"), pa.int32()),
        "board": stats.column("board"), "window_id": stats.column("window_id"),
        "offset": pa.array(offset, pa.int64()), "first_rank": pa.array(first_rank, pa.int64()),
        "total": pa.array(total, pa.int64()), "lo": pa.array(lo, pa.int64()),
        "hi": pa.array(hi, pa.int64()),
    })


def apply_offsets(numbered: DataFrame, offsets: DataFrame) -> DataFrame:
    """Row number, competition rank (ordinal on `earliest` boards), total and percentile.

    A broadcast join: the rows stay in their partitions and in their sorted order.
    """
    from pyspark.sql import functions as F

    rn = F.col("offset") + F.col("local_rn")
    rank = (F.when(F.col("earliest"), rn)
            .when(F.col("local_tie") == 1, F.col("first_rank"))
            .otherwise(F.col("offset") + F.col("local_tie")))
    return (numbered.join(F.broadcast(offsets), ["pid", "board", "window_id"])
            .withColumn("rn", rn)
            .withColumn("rank", rank)
            .withColumn("percentile",
                        F.lit(100.0) * (F.col("total") - F.col("rank") + 1) / F.col("total")))


def _histograms(ranked: DataFrame) -> DataFrame:
    """Equal-width score buckets and equal-depth rank buckets (the DuckDB engine's math:
    integer bucket numbers, double bounds)."""
    from pyspark.sql import functions as F

    spread = F.col("hi") - F.col("lo")
    width_bucket = (F.when(F.col("hi") == F.col("lo"), F.lit(0).cast("bigint"))
                    .otherwise(F.least(
                        F.expr(f"(score - lo) * {WIDTH_BUCKETS} div greatest(hi - lo, 1)"),
                        F.lit(WIDTH_BUCKETS - 1).cast("bigint"))))
    width = (ranked.withColumn("bucket", width_bucket)
             .groupBy("board", "window_id", "bucket", "lo", "hi")
             .agg(F.count(F.lit(1)).alias("players"), F.min("rank").alias("rank_from"),
                  F.max("rank").alias("rank_to"))
             .select("board", "window_id", F.lit("width").alias("kind"), "bucket",
                     (F.col("lo") + (F.col("bucket") * spread) / F.lit(float(WIDTH_BUCKETS)))
                     .alias("lower"),
                     (F.col("lo") + ((F.col("bucket") + 1) * spread)
                      / F.lit(float(WIDTH_BUCKETS))).alias("upper"),
                     "players", "rank_from", "rank_to"))
    depth = (ranked.withColumn("bucket", F.expr(f"(rn - 1) * {DEPTH_BUCKETS} div total"))
             .groupBy("board", "window_id", "bucket")
             .agg(F.min("score").cast("double").alias("lower"),
                  F.max("score").cast("double").alias("upper"),
                  F.count(F.lit(1)).alias("players"), F.min("rank").alias("rank_from"),
                  F.max("rank").alias("rank_to"))
             .select("board", "window_id", F.lit("depth").alias("kind"), "bucket", "lower",
                     "upper", "players", "rank_from", "rank_to"))
    return width.unionByName(depth)


def local_defaults(master: str, environ: MutableMapping[str, str]) -> dict[str, str]:
    """Settings for a Spark this process starts on a local master; none for a cluster.

    Run from a shell rather than `make` (which exports SPARK_LOCAL_IP), a local Spark looked
    its hostname up, warned that it resolves to loopback and picked a LAN interface, and drew
    progress bars over the CLI's own progress lines. The driver binds to loopback, Python
    workers run on this interpreter (with its packages), and the console progress bar is
    off. Variables already set win: `environ` is only filled in; the Spark settings are
    returned for the session builder.
    """
    if not master.startswith("local"):
        return {}
    environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return {"spark.ui.showConsoleProgress": "false"}


# -- the engine ------------------------------------------------------------------------------

class SparkEngine:
    """Batch transforms on Spark; the same interface and results as DuckDBEngine.

    `spark`: a session to use (default: the active one, else one is built with master from
    `master`, env SPARK_MASTER, spark-submit's --master, or local[2]; UTC; shuffle partitions
    from env SPARK_SHUFFLE_PARTITIONS or 8). `rank_partitions`: range partitions for the
    ranking (default: spark.sql.shuffle.partitions). `staging_dir`: where the ordered
    standings are written for the driver to stream back (env LEADERBOARD_SPARK_STAGING; on a
    cluster it must be a path the executors and the driver share; default: a local temp dir
    for local masters, else the ordered rows are collected with toArrow).
    """

    name = "spark"

    def __init__(self, spark: SparkSession | None = None, master: str | None = None, *,
                 rank_partitions: int | None = None, staging_dir: str | None = None) -> None:
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        self._owns_session = False
        if spark is None and master is None:
            spark = SparkSession.getActiveSession()
        if spark is None:
            # getOrCreate() returns a session already running in this process (another
            # thread's); only a session this engine started is stopped by close().
            running = SparkContext._active_spark_context is not None
            spark = self._build_session(master)
            self._owns_session = not running
        self.spark: SparkSession = spark
        self.rank_partitions = rank_partitions
        self.staging_dir = staging_dir or os.environ.get("LEADERBOARD_SPARK_STAGING") or None
        self._staged: str | None = None
        self._cached: list[DataFrame] = []

    @staticmethod
    def _build_session(master: str | None) -> SparkSession:
        from pyspark import SparkConf
        from pyspark.sql import SparkSession

        conf = SparkConf()
        master = (master or os.environ.get("SPARK_MASTER") or conf.get("spark.master", None)
                  or _DEFAULT_MASTER)
        partitions = os.environ.get("SPARK_SHUFFLE_PARTITIONS") or str(_DEFAULT_SHUFFLE_PARTITIONS)
        if not partitions.isdigit() or int(partitions) < 1:
            raise ValueError(f"SPARK_SHUFFLE_PARTITIONS={partitions!r} must be a whole number "
                             ">= 1; unset it for the default of 8")
        builder = (SparkSession.builder.master(master).appName("leaderboard-batch")
                   .config("spark.sql.session.timeZone", "UTC")
                   .config("spark.sql.shuffle.partitions", partitions))
        for key, value in local_defaults(master, os.environ).items():
            builder = builder.config(key, value)
        return builder.getOrCreate()

    def close(self) -> None:
        """Drop what this engine holds; stop the session only if the engine built it."""
        self.finish()
        if self._owns_session:
            self.spark.stop()

    def __enter__(self) -> SparkEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading the lake -------------------------------------------------------------------

    def _frame(self, table: pa.Table) -> DataFrame:
        """A driver-side Arrow table as a DataFrame (dates as days, instants as micros)."""
        return self.spark.createDataFrame(_to_spark_types(table))

    def _spark_names(self, paths: Sequence[str]) -> dict[str, str]:
        """Spark's name of each path (what input_file_name() returns) -> the path as given."""
        jvm: Any = self.spark._jvm  # classic Spark (py4j): spark-submit, local or cluster
        hadoop = self.spark._jsc.hadoopConfiguration()
        names = {}
        for path in paths:
            hadoop_path = jvm.org.apache.hadoop.fs.Path(_for_spark(path))
            qualified = hadoop_path.getFileSystem(hadoop).makeQualified(hadoop_path)
            names[qualified.toUri().toString()] = path
        return names

    def _read_named(self, paths: Sequence[str], ddl: str) -> DataFrame:
        """Parquet files with their `file` (the path as given) and `file_order` (the path's
        place in DuckDB's bytewise order of the paths)."""
        from pyspark.sql import functions as F

        ordered = _byte_order(paths)
        names = self._spark_names(ordered)
        frame = self.spark.read.schema(ddl).parquet(*[_for_spark(p) for p in ordered])
        unknown = set(frame.inputFiles()) - set(names)
        if unknown:
            raise RuntimeError(f"Spark names input file(s) {sorted(unknown)[:3]} differently "
                               "from the paths given; cannot apply the dedupe tie-break")
        order = {path: i for i, path in enumerate(ordered)}
        table = pa.table({"spark_file": pa.array(list(names), pa.string()),
                          "file": pa.array(list(names.values()), pa.string()),
                          "file_order": pa.array([order[p] for p in names.values()], pa.int64())})
        lookup = F.broadcast(self.spark.createDataFrame(table))
        return (frame.withColumn("spark_file", F.input_file_name())
                .join(lookup, "spark_file").drop("spark_file"))

    def _read_rollups(self, index: pa.Table) -> DataFrame:
        """The authoritative rollup rows: those of each (path, event_date) in `index`.

        Columns as in ROLLUP_SCHEMA, with event_date as a day number and instants in micros.
        """
        from pyspark.sql import functions as F

        paths = sorted(set(index.column("path").to_pylist()))
        if not paths:
            return self._frame(ROLLUP_SCHEMA.empty_table())
        named = self._read_named(paths, _ROLLUP_DDL)
        wanted = F.broadcast(self._frame(index.select(["path", "event_date"]))
                             .withColumnRenamed("path", "file"))
        rows = named.withColumn("event_date", F.unix_date("event_date"))
        for column in _ROLLUP_INSTANTS:
            rows = rows.withColumn(column, F.unix_micros(column))
        return (rows.join(wanted, ["file", "event_date"], "left_semi")
                .select(*ROLLUP_SCHEMA.names))

    def _collect_rollups(self, rows: DataFrame) -> pa.Table:
        return _to_arrow(rows.toArrow(), ROLLUP_SCHEMA, days=("event_date",),
                         instants=_ROLLUP_INSTANTS)

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

        First ingested wins inside the new rows, ties broken by file path as given (bytewise);
        a new row whose identity is among the `absorbed` files' rows (ingested before `since`)
        is a late duplicate and is dropped, and so is a row `voids` (match_id, player_id or
        null: the whole match) covers. Returns the rollup rows and the number of events
        they count.
        """
        if not files:
            return ROLLUP_SCHEMA.empty_table(), 0
        rows = self.rollup_frame(files, watermark=watermark, since=since, absorbed=absorbed,
                                 calendar=calendar, bits=bits, voids=voids)
        # One pass: every deduped event is counted, but (as in DuckDB's inner join with the
        # calendar) only those on a calendar date are rolled up.
        collected = rows.toArrow()
        counted = int(pc.sum(collected.column("matches")).as_py() or 0)
        on_calendar = collected.filter(pc.fill_null(collected.column("in_calendar"), False))
        return _to_arrow(on_calendar, ROLLUP_SCHEMA, days=("event_date",),
                         instants=_ROLLUP_INSTANTS), counted

    def rollup_frame(
        self,
        files: Sequence[str],
        *,
        watermark: datetime,
        since: datetime | None,
        absorbed: Sequence[str],
        calendar: pa.Table,
        bits: Sequence[LatenessBit],
        voids: pa.Table | None = None,
    ) -> DataFrame:
        """rollup_events' rows before collecting (with `in_calendar`), for its plan.

        The events are shuffled once, hashed by player: the dedupe's groups (match, player)
        and the rollup's (player, day, region, mode, mask) both hold one player's rows, so
        neither grouping shuffles again (grouping by (match, player) first hashed the events
        by both and then shuffled the deduped rows a second time, by the rollup's key).
        """
        from pyspark.sql import functions as F

        partitions = self.rank_partitions or int(
            self.spark.conf.get("spark.sql.shuffle.partitions") or _DEFAULT_SHUFFLE_PARTITIONS)
        named = self._read_named(list(files), _EVENTS_DDL)
        events = (named.withColumn("ingested_us", F.unix_micros("ingested_at"))
                  .withColumn("t", F.unix_micros("event_time")))
        keep = F.col("ingested_us") < F.lit(epoch_us(watermark))
        if since is not None:
            keep = keep & (F.col("ingested_us") >= F.lit(epoch_us(since)))
        # A direct score (identity with its board) rolls up with its board as `mode`.
        first = (events.where(keep).withColumn("mode", F.coalesce("board", "mode"))
                 .repartition(partitions, "player_id")
                 .groupBy("match_id", "player_id", "board")
                 .agg(F.min(F.struct("ingested_us", "file_order", "t", "points", "region",
                                     "mode", "backfill")).alias("e"))
                 .select("match_id", "player_id", "board", "e.*"))
        if absorbed and since is not None:
            seen = (self.spark.read.schema(_EVENTS_DDL).parquet(*map(_for_spark, absorbed))
                    .where(F.unix_micros("ingested_at") < F.lit(epoch_us(since)))
                    .select(F.col("match_id").alias("seen_match"),
                            F.col("player_id").alias("seen_player"),
                            F.col("board").alias("seen_board")))
            first = first.join(seen, (first.match_id == seen.seen_match)
                               & (first.player_id == seen.seen_player)
                               & first.board.eqNullSafe(seen.seen_board), "left_anti")
        if voids is not None and voids.num_rows:
            whole = pc.is_null(voids.column("player_id"))
            matches = self._frame(pa.table({"match_id": pc.unique(
                voids.filter(whole).column("match_id"))}))
            pairs = self._frame(voids.filter(pc.invert(whole)).select(
                ["match_id", "player_id"]))
            first = (first.join(F.broadcast(matches), ["match_id"], "left_anti")
                     .join(F.broadcast(pairs), ["match_id", "player_id"], "left_anti"))
        kinds = sorted({b.kind for b in bits})
        wide = self._frame(_calendar_wide(calendar, kinds))
        rows = (first.withColumn("event_date", _day_of("t"))
                .join(F.broadcast(wide), "event_date", "left")
                .withColumn("mask", _mask(bits))
                .groupBy("player_id", "event_date", "region", "mode", "mask", "in_calendar")
                .agg(F.count(F.lit(1)).alias("matches"),
                     _saturated_sum("points", F.lit(ROLLUP_CAP)).alias("points_sum"),
                     F.max(F.struct(F.col("points").alias("p"), (-F.col("t")).alias("t")))
                     .alias("mx"),
                     F.min(F.struct(F.col("points").alias("p"), F.col("t").alias("t")))
                     .alias("mn"),
                     F.max(F.struct(F.col("t").alias("t"), F.col("match_id").alias("m"),
                                    F.col("points").alias("p"))).alias("lst"),
                     F.min("t").alias("first_event_at"), F.max("t").alias("last_event_at"))
                .select(*_rollup_columns(), "in_calendar"))
        return rows

    def merge_rollups(self, old: pa.Table, delta: pa.Table) -> pa.Table:
        """Merge a delta into the old rollup rows of the same dates.

        `old` lists (path, event_date) of the rows to merge with; rows with the same key merge.
        """
        rows = self._read_rollups(old).unionByName(
            self._frame(delta.select(ROLLUP_SCHEMA.names).cast(ROLLUP_SCHEMA)))
        merged = (rows.groupBy("player_id", "event_date", "region", "mode", "mask")
                  .agg(*_merge_aggregates())
                  .select(*_rollup_columns()))
        return self._collect_rollups(merged)

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
        `carry` (CARRY_SCHEMA): the board-windows built from the previous version's standings
        rows plus the `delta` rollup rows instead of from `rollups` (as the DuckDB engine).
        Returns a `StandingsResult` (the ordered rows, histograms, the windows that received
        events; or, when some score does not fit an exact sort key, only the overflow).
        """
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        self.finish()
        window_ids = pa.array(sorted(set(needed.column("window_id").to_pylist())), pa.string())
        calendar = calendar.filter(pc.is_in(calendar.column("window_id"), value_set=window_ids))
        spec_df = F.broadcast(self._frame(spec))
        calendar_df = F.broadcast(self._frame(
            calendar.select(["event_date", "kind", "window_id", "window_start_us"])))
        carry = CARRY_SCHEMA.empty_table() if carry is None else carry.cast(CARRY_SCHEMA)
        carried_keys = pc.binary_join_element_wise(carry.column("board"),
                                                   carry.column("window_id"), "\x00")
        needed = needed.select(["board", "window_id"])
        needed = needed.append_column("carried", pc.is_in(
            pc.binary_join_element_wise(needed.column("board"), needed.column("window_id"),
                                        "\x00"), value_set=carried_keys.combine_chunks()))
        needed_df = F.broadcast(self._frame(needed))
        banned_df = F.broadcast(self._frame(pa.table({
            "player_id": pa.array(sorted(set(banned)), pa.string()),
            "is_banned": pa.array([True] * len(set(banned)), pa.bool_())})))
        partitions = self.rank_partitions or int(
            self.spark.conf.get("spark.sql.shuffle.partitions") or _DEFAULT_SHUFFLE_PARTITIONS)
        # Rollup files are few and large: spread their rows by player before fanning each out
        # to its board-windows, so that the grouping below needs no further shuffle.
        rows = self._read_rollups(rollups).withColumn("from_delta", F.lit(False))
        if delta is not None and delta.num_rows:
            rows = rows.unionByName(self._frame(
                delta.select(ROLLUP_SCHEMA.names).cast(ROLLUP_SCHEMA))
                .withColumn("from_delta", F.lit(True)))
        rows = rows.repartition(partitions, "player_id")
        scopes = (F.when(F.col("region") == "",  # direct scores: their board only
                         F.array(F.concat(F.lit("board:"), F.col("mode"))))
                  .otherwise(F.array(F.lit("global"),
                                     F.concat(F.lit("region:"), F.col("region")),
                                     F.concat(F.lit("mode:"), F.col("mode")))))
        counted = (rows.withColumn("scope_key", F.explode(scopes))
                   .join(spec_df, "scope_key")
                   .join(calendar_df, ["event_date", "kind"])
                   .join(needed_df, ["board", "window_id"])
                   .where(F.col("carried") == F.col("from_delta"))
                   .where(F.expr("bit < 0 OR (shiftright(mask, CAST(bit AS INT)) & 1) = 1"))
                   .select(*_COUNTED))
        counted = counted.unionByName(self._state_rows(carry, spec_df, calendar_df))
        aggregation = F.col("aggregation")
        score = (F.when(aggregation == "sum", F.col("points_sum"))
                 .when(aggregation == "max", F.col("mx.p"))
                 .when(aggregation == "min", F.col("mn.p"))
                 .otherwise(F.col("lst.p")))
        reached = (F.when(aggregation == "sum", F.col("last_event_at"))
                   .when(aggregation == "max", -F.col("mx.t"))
                   .when(aggregation == "min", F.col("mn.t"))
                   .otherwise(F.col("lst.t")))
        # Banned players are dropped after grouping, so that a window they alone received
        # still counts as received.
        every = (counted.join(banned_df, "player_id", "left")
                  .groupBy("board", "window_id", "player_id", "is_banned", "aggregation",
                           "sign", "earliest", "time_bits", "time_unit_us", "score_limit",
                           "window_start_us")
                  .agg(*_merge_aggregates(F.col("score_limit")))
                  .select("board", "window_id", "player_id", "is_banned", "sign", "earliest",
                          "time_bits", "time_unit_us", "score_limit", "matches",
                          F.col("first_event_at").alias("first_us"),
                          F.col("last_event_at").alias("last_us"),
                          F.col("lst.m").alias("last_match_id"), "window_start_us",
                          score.alias("score"), reached.alias("reached_us"))
                  .persist(StorageLevel.MEMORY_AND_DISK))
        self._cached.append(every)
        # One pass for the windows that received events and for scores that do not fit an
        # exact sort key (an example player per board-window; registry load and saturation
        # keep every score in range, so this stays the last guard).
        too_big = F.col("is_banned").isNull() & (F.abs(F.col("score")) > F.col("score_limit"))
        summary = (every.groupBy("board", "window_id")
                   .agg(F.min(F.when(too_big, F.struct("player_id", "score", "time_bits")))
                        .alias("overflow"))
                   .toArrow())
        windows = _to_arrow(summary, _WINDOW_COLUMNS).sort_by([("board", "ascending"),
                                                               ("window_id", "ascending")])
        overflow = summary.filter(pc.is_valid(summary.column("overflow"))).slice(0, 10)
        if overflow.num_rows:
            self._release()
            found = overflow.column("overflow").combine_chunks()
            rows = pa.table({"board": overflow.column("board"),
                             "window_id": overflow.column("window_id"),
                             **{name: found.field(name)
                                for name in ("player_id", "score", "time_bits")}})
            return StandingsResult.overflowed(_to_arrow(rows, _OVERFLOW_COLUMNS), windows)
        scored = every.where(F.col("is_banned").isNull())
        unit = F.expr("shiftleft(1L, CAST(time_bits AS INT))")
        keyed = scored.withColumn("sort_key", F.when(
            F.col("earliest"),
            (F.col("sign") * F.col("score")) * unit
            + (unit - 1 - F.expr("(reached_us - window_start_us) div time_unit_us")))
            .otherwise(F.col("sign") * F.col("score")))
        numbered = (number_within_partitions(sort_for_ranking(keyed, partitions))
                    .persist(StorageLevel.MEMORY_AND_DISK))
        self._cached.append(numbered)
        stats = partition_stats(numbered)  # materialises `numbered`
        every.unpersist()
        if stats.num_rows == 0:
            self._release()
            empty = STANDINGS_COLUMNS.empty_table()
            return StandingsResult(
                pa.RecordBatchReader.from_batches(STANDINGS_COLUMNS, empty.to_batches()),
                HISTOGRAM_COLUMNS.empty_table(), windows)
        offsets = self.spark.createDataFrame(partition_offsets(stats))
        ranked = apply_offsets(numbered, offsets)
        histograms = _to_arrow(_histograms(ranked).toArrow(), HISTOGRAM_COLUMNS).sort_by([
            ("board", "ascending"), ("window_id", "ascending"), ("kind", "ascending"),
            ("bucket", "ascending")])
        out = ranked.select("board", "window_id", "player_id", "score", "sort_key", "rank",
                            "percentile", "matches", F.col("reached_us").alias("reached_at"),
                            F.col("first_us").alias("first_event_at"),
                            F.col("last_us").alias("last_event_at"), "last_match_id")
        reader = self._ordered_reader(out)
        self._release()
        return StandingsResult(reader, histograms, windows)

    def _state_rows(self, carry: pa.Table, spec_df: DataFrame, calendar_df: DataFrame
                    ) -> DataFrame:
        """The carried windows' previous standings rows as partial aggregates shaped like
        the exploded rollup rows (the DuckDB engine's _STATE_ROWS)."""
        from pyspark.sql import functions as F

        paths = sorted({p for p in carry.column("path").to_pylist() if p})
        if not paths:
            return self._frame(pa.table({
                name: pa.array([], _COUNTED_TYPES.get(name, pa.int64())) for name in _COUNTED}))
        index = F.broadcast(self._frame(carry.filter(pc.is_valid(carry.column("path"))))
                            .withColumnRenamed("path", "file"))
        windows = calendar_df.select("kind", "window_id", "window_start_us").distinct()
        state = (self._read_named(paths, _STATE_DDL).join(index, ["file", "window_id"])
                 .join(F.broadcast(windows), "window_id")
                 .join(spec_df, ["board", "kind"]))
        aggregation = F.col("aggregation")

        def only(name: str, column: str) -> Column:
            return F.when(aggregation == name, F.col(column))

        return state.withColumn("reached_us", F.unix_micros("reached_at")).select(
            "player_id", "board", "window_id", "aggregation", "sign", "earliest", "time_bits",
            "time_unit_us", "score_limit", "window_start_us", "matches",
            only("sum", "score").alias("points_sum"), only("max", "score").alias("max_points"),
            only("max", "reached_us").alias("max_at"), only("min", "score").alias("min_points"),
            only("min", "reached_us").alias("min_at"), only("last", "score").alias("last_points"),
            F.col("last_match_id").alias("last_match"),
            F.unix_micros("first_event_at").alias("first_event_at"),
            F.unix_micros("last_event_at").alias("last_event_at"))

    def _ordered_reader(self, out: DataFrame) -> pa.RecordBatchReader:
        """The ranked rows in partition order (= global order), streamed back to the driver.

        Written as Parquet to a staging dir (one file per partition, numbered by partition)
        and read back file by file; without a staging dir on a non-local master, collected.
        """
        instants = ("reached_at", "first_event_at", "last_event_at")
        master = self.spark.sparkContext.master or ""
        if self.staging_dir is None and not master.startswith("local"):
            table = _to_arrow(out.toArrow(), STANDINGS_COLUMNS, instants=instants)
            return pa.RecordBatchReader.from_batches(STANDINGS_COLUMNS, table.to_batches())
        if self.staging_dir is None:
            target = tempfile.mkdtemp(prefix="leaderboard-spark-standings-")
        else:
            name = f"standings-{os.getpid()}-{datetime.now(UTC):%Y%m%dT%H%M%S%f}"
            target = _for_spark(f"{self.staging_dir.rstrip('/')}/{name}")
        self._staged = target
        out.write.mode("overwrite").parquet(target)
        return pa.RecordBatchReader.from_batches(
            STANDINGS_COLUMNS, _stream_parts(target, instants))

    def _release(self) -> None:
        for frame in self._cached:
            frame.unpersist()
        self._cached = []

    def finish(self) -> None:
        """Drop the cached frames and the staged standings (after the reader is drained)."""
        self._release()
        if self._staged is not None:
            fs, path = _staging_fs(self._staged)
            with contextlib.suppress(OSError):
                fs.delete_dir(path)
            self._staged = None


_PART = re.compile(r"^part-(\d+)")


def _staging_fs(target: str) -> tuple[Any, str]:
    """The pyarrow filesystem and path of a staging dir (Hadoop's s3a:// is pyarrow's s3://)."""
    if not _SCHEME.match(target) or target.startswith("file:"):
        return pafs.LocalFileSystem(), re.sub(r"^file:(//)?", "", target)
    fs, path = pafs.FileSystem.from_uri(re.sub(r"^s3a://", "s3://", target))
    return fs, str(path)


def _stream_parts(folder: str, instants: Sequence[str]) -> Iterator[pa.RecordBatch]:
    """Record batches of a Spark-written Parquet folder in partition order."""
    fs, path = _staging_fs(folder)
    parts = []
    for info in fs.get_file_info(pafs.FileSelector(path)):
        match = _PART.match(info.base_name)
        if match and info.base_name.endswith(".parquet"):
            parts.append((int(match.group(1)), info.path))
    for _, part in sorted(parts):
        with fs.open_input_file(part) as handle:
            for batch in pq.ParquetFile(handle).iter_batches(batch_size=256 * 1024):
                table = _to_arrow(pa.Table.from_batches([batch]), STANDINGS_COLUMNS,
                                  instants=instants)
                yield from table.to_batches()


def _calendar_wide(calendar: pa.Table, kinds: Sequence[str]) -> pa.Table:
    """One row per calendar date: the end (us) of its window of each kind, null if none;
    `in_calendar` marks that the date is on the calendar at all."""
    dates = pc.unique(calendar.column("event_date"))
    wide = pa.table({"event_date": dates,
                     "in_calendar": pa.array(np.ones(len(dates), dtype=bool), pa.bool_())})
    for kind in kinds:
        rows = calendar.filter(pc.equal(calendar.column("kind"), kind))
        ends = (rows.group_by("event_date").aggregate([("window_end_us", "max")])
                .rename_columns({"window_end_us_max": f"w_{kind.replace('-', '_')}"}))
        wide = wide.join(ends, "event_date", join_type="left outer")
    return wide
