"""The Spark engine's ranking: never one partition per board-window, exact across edges.

The ranking range-partitions rows by (board, window_id, sort_key desc, player_id), numbers
them inside each partition, and adds prefix offsets computed on the driver
(docs/design.md section 4). These tests pin the plan shape and the offset arithmetic where
tie groups straddle partition edges; test_engine_parity.py holds whole batch runs to the
DuckDB engine.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from jobs.batch import plan_windows
from jobs.duckdb_engine import DuckDBEngine
from jobs.rank_stream import CODED_SCHEMA, RANKED_SCHEMA
from jobs.spark_engine import (
    SparkEngine,
    _number_runs,
    apply_offsets,
    local_defaults,
    number_within_partitions,
    partition_offsets,
    partition_stats,
    sort_for_ranking,
)
from jobs.spec import board_window_spec, calendar_table, lateness_bits
from leaderboard.lake import LandingWriter
from leaderboard.manifest import watermark_for
from leaderboard.registry import Registry, parse_registry
from leaderboard.schema import LANDED_SCHEMA, TIMESTAMP
from speed_layer.ingest import Ingestor


def _plain(rows: pa.Table) -> pa.Table:
    """DuckDB's ranked stream with its coded columns as strings: the writer takes either
    form (DuckDB's codes board and player_id, Spark's stream is plain) and writes the same
    bytes, so the engines agree when the rows do."""
    assert rows.schema == CODED_SCHEMA
    return rows.cast(RANKED_SCHEMA)


RANK_INPUT = pa.schema([
    ("board", pa.string()), ("window_id", pa.string()), ("player_id", pa.string()),
    ("earliest", pa.bool_()), ("score", pa.int64()), ("sort_key", pa.int64()),
    ("matches", pa.int64()), ("reached_us", pa.int64()), ("first_us", pa.int64()),
    ("last_us", pa.int64()), ("last_match_id", pa.string()),
])


# -- the physical plan ---------------------------------------------------------------------

def _plan_nodes(plan: Any) -> Iterator[Any]:
    """Every node of a physical plan (py4j SparkPlan), through adaptive wrappers, query
    stages and cached relations."""
    stack = [plan]
    while stack:
        node = stack.pop()
        kind = node.getClass().getSimpleName()
        if kind == "AdaptiveSparkPlanExec":
            stack.append(node.executedPlan())
            continue
        if kind.endswith("QueryStageExec"):
            stack.append(node.plan())
        if kind == "InMemoryTableScanExec":
            stack.append(node.relation().cachedPlan())
        yield node
        children = node.children()
        stack.extend(children.apply(i) for i in range(children.size()))


def _names(expressions: Any) -> list[str]:
    return [re.sub(r"#\d+L?$", "", expressions.apply(i).toString())
            for i in range(expressions.size())]


def gathering_operators(frame: Any) -> list[str]:
    """Operators of `frame`'s physical plan that put a whole board-window (or everything) in
    one partition: a Window partitioned by nothing or by (board, window_id) alone, or an
    exchange to a single partition."""
    found = []
    for node in _plan_nodes(frame._jdf.queryExecution().executedPlan()):
        kind = node.getClass().getSimpleName()
        if kind == "WindowExec":
            spec = _names(node.partitionSpec())
            if set(spec) <= {"board", "window_id"}:
                found.append(f"Window partitioned by {spec or 'nothing'}")
        if kind == "ShuffleExchangeExec":
            partitioning = node.outputPartitioning().toString()
            if partitioning.startswith("SinglePartition"):
                found.append("Exchange SinglePartition")
    return found


def _rank_input(spark: Any, rows: list[dict[str, Any]]) -> Any:
    return spark.createDataFrame(pa.Table.from_pylist(rows, schema=RANK_INPUT))


@pytest.mark.spark
def test_the_gathering_check_catches_a_board_wide_window(spark):
    """The check itself: DuckDB's formulation, planned on Spark, is what it must reject."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    frame = _rank_input(spark, [{"board": "global", "window_id": "all-time",
                                 "player_id": "p1", "earliest": False, "score": 1,
                                 "sort_key": 1, "matches": 1, "reached_us": 0, "first_us": 0,
                                 "last_us": 0}])
    board_wide = Window.partitionBy("board", "window_id").orderBy(F.col("sort_key").desc(),
                                                                   "player_id")
    naive = frame.withColumn("rn", F.row_number().over(board_wide))
    assert gathering_operators(naive) == ["Window partitioned by ['board', 'window_id']"]
    global_rank = frame.withColumn("rn", F.row_number().over(Window.orderBy("sort_key")))
    assert "Exchange SinglePartition" in gathering_operators(global_rank)


@pytest.mark.spark
def test_ranking_plan_never_gathers_a_board_window(spark):
    rows = [{"board": "global", "window_id": "all-time", "player_id": f"p{i}",
             "earliest": False, "score": i % 3, "sort_key": i % 3, "matches": 1,
             "reached_us": 0, "first_us": 0, "last_us": 0} for i in range(50)]
    ordered = sort_for_ranking(_rank_input(spark, rows), 8)
    numbered = number_within_partitions(ordered)
    plan = numbered._jdf.queryExecution().executedPlan().toString()
    assert "rangepartitioning(board" in plan
    assert "MapInArrow" in plan
    # Planning only: offsets of the right shape, no job run.
    offsets = spark.createDataFrame(partition_offsets(pa.table({
        "pid": pa.array([0], pa.int32()), "board": ["global"], "window_id": ["all-time"],
        **{name: pa.array([1], pa.int64())
           for name in ("rows", "first_key", "last_key", "last_tie", "lo", "hi")}})))
    ranked = apply_offsets(numbered, offsets)
    for frame in (numbered, ranked):
        assert gathering_operators(frame) == []
        nodes = [n.getClass().getSimpleName()
                 for n in _plan_nodes(frame._jdf.queryExecution().executedPlan())]
        assert "WindowExec" not in nodes
        # exactly one shuffle: the range partitioning (the offsets are broadcast)
        assert nodes.count("ShuffleExchangeExec") == 1


# -- ranks across partition edges -----------------------------------------------------------

def _reference(rows: list[dict[str, Any]]) -> list[tuple[str, str, str, int, int, int, float]]:
    """(board, window_id, player_id, rn, rank, total, percentile) in stream order."""
    out = []
    by_window: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        by_window.setdefault((row["board"], row["window_id"]), []).append(row)
    for key in sorted(by_window):
        members = sorted(by_window[key], key=lambda r: (-r["sort_key"], r["player_id"]))
        total = len(members)
        rank = 0
        for position, row in enumerate(members, start=1):
            if row["earliest"] or position == 1 or row["sort_key"] != members[position - 2][
                    "sort_key"]:
                rank = position
            out.append((*key, row["player_id"], position, rank, total,
                        100.0 * (total - rank + 1) / total))
    return out


def _board_windows(rng: random.Random) -> list[dict[str, Any]]:
    rows = []

    def add(board: str, window_id: str, earliest: bool, keys: list[int]) -> None:
        for i, key in enumerate(keys):
            rows.append({"board": board, "window_id": window_id,
                         "player_id": f"p{rng.randrange(10**6):06d}-{i}", "earliest": earliest,
                         "score": key, "sort_key": key, "matches": 1, "reached_us": i,
                         "first_us": i, "last_us": i})

    # huge tie groups: each of the 3 keys spans several of the 16 partitions
    add("global", "all-time", False, [rng.choice([0, 5, 10]) for _ in range(2400)])
    # ordinal ranks among equal keys
    add("best", "all-time", True, [rng.randrange(8) for _ in range(400)])
    # asc boards hold negated keys
    add("low:na", "daily:2026-12-01", False, [-rng.randrange(40) for _ in range(600)])
    add("solo", "weekly:2026-W49", False, [7])
    add("distinct", "monthly:2026-12", False, rng.sample(range(-500, 500), 300))
    return rows


@pytest.mark.spark
def test_ranks_are_exact_when_ties_straddle_partitions(spark):
    rng = random.Random(11)
    rows = _board_windows(rng)
    rng.shuffle(rows)
    numbered = number_within_partitions(sort_for_ranking(_rank_input(spark, rows), 16)).cache()
    try:
        stats = partition_stats(numbered)
        # The test only means something if tie groups really cross edges: the key-5 group of
        # global/all-time covers three or more partitions.
        glob = stats.filter(pc.equal(stats.column("board"), "global")).to_pylist()
        assert sum(1 for s in glob if s["last_key"] <= 5 <= s["first_key"]) >= 3
        assert len(glob) >= 8
        offsets = partition_offsets(stats)
        ranked = apply_offsets(numbered, spark.createDataFrame(offsets))
        got = ranked.select("board", "window_id", "player_id", "rn", "rank", "total",
                            "percentile").toArrow()
    finally:
        numbered.unpersist()
    assert [tuple(r.values()) for r in got.to_pylist()] == _reference(rows)


def test_partition_offsets_carry_a_tie_group_over_three_partitions():
    """Pure driver arithmetic: one board-window over partitions 0-3 with key 5 spanning
    1-3 (rows: 0 -> [9, 9, 5], 1 -> [5, 5], 2 -> [5, 5, 5], 3 -> [5, 2, 2])."""
    stats = pa.table({
        "pid": pa.array([3, 1, 0, 2, 0], pa.int32()),
        "board": ["g", "g", "g", "g", "h"],
        "window_id": ["all-time"] * 5,
        "rows": pa.array([3, 2, 3, 3, 1], pa.int64()),
        "first_key": pa.array([5, 5, 9, 5, 4], pa.int64()),
        "last_key": pa.array([2, 5, 5, 5, 4], pa.int64()),
        "last_tie": pa.array([2, 1, 3, 1, 1], pa.int64()),
        "lo": pa.array([2, 5, 5, 5, 4], pa.int64()),
        "hi": pa.array([5, 5, 9, 5, 4], pa.int64()),
    })
    got = partition_offsets(stats).to_pylist()
    assert [(r["board"], r["pid"], r["offset"], r["first_rank"], r["total"], r["lo"], r["hi"])
            for r in got] == [
        ("g", 0, 0, 1, 11, 2, 9),
        ("g", 1, 3, 3, 11, 2, 9),   # continues the key-5 group that started at rank 3
        ("g", 2, 5, 3, 11, 2, 9),
        ("g", 3, 8, 3, 11, 2, 9),   # its first group (key 5) still ranks 3; then 2 -> 10
        ("h", 0, 0, 1, 1, 4, 4),
    ]


def test_number_runs_carries_state_across_batches():
    """Pure per-partition numbering: runs and tie groups continue into the next batch."""
    def batch(boards: list[str], keys: list[int]) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict({"board": boards, "window_id": ["w"] * len(keys),
                                           "sort_key": pa.array(keys, pa.int64())})

    out = list(_number_runs(iter([batch(["a", "a", "a"], [9, 7, 7]),
                                  batch(["a", "a", "b"], [7, 3, 3]),
                                  batch(["b"], [3])])))
    rn = [v for b in out for v in b.column("local_rn").to_pylist()]
    tie = [v for b in out for v in b.column("local_tie").to_pylist()]
    assert rn == [1, 2, 3, 4, 5, 1, 2]
    assert tie == [1, 2, 2, 2, 5, 1, 1]


# -- the engine against DuckDB, with many small partitions -----------------------------------

TIES = {
    "regions": ["na", "eu"],
    "modes": ["ranked", "casual"],
    "limits": {"grace": "1d"},
    "board_defaults": {"min_points": -5, "max_points": 5},
    "boards": [
        {"scope": "global"},
        {"scope": "global", "name": "best", "aggregation": "max", "ties": "earliest"},
        {"scope": "region:*", "name": "low:*", "aggregation": "min", "order": "asc"},
        {"scope": "mode:*", "name": "latest:*", "aggregation": "last"},
    ],
}
START = datetime(2026, 11, 29, tzinfo=UTC)


def _tied_events(seed: int, players: int = 120, matches: int = 400) -> pa.Table:
    """Few distinct points, so every board-window has large tie groups; whole hours, so
    players also play several matches at the same instant (`last` boards and last_match_id
    break those ties by the larger match_id)."""
    rng = random.Random(seed)
    rows: dict[str, list[Any]] = {name: [] for name in
                                  ("match_id", "player_id", "points", "event_time", "region",
                                   "mode", "server_id")}
    for number in range(matches):
        at = START + timedelta(hours=rng.randrange(48))
        region, mode = rng.choice(["na", "eu"]), rng.choice(["ranked", "casual"])
        for player in rng.sample(range(players), 2):
            rows["match_id"].append(f"m{number}")
            rows["player_id"].append(f"p{player:03d}")
            rows["points"].append(rng.choice([-1, 0, 1]))
            rows["event_time"].append(at)
            rows["region"].append(region)
            rows["mode"].append(mode)
            rows["server_id"].append("s1")
    return pa.table({**rows, "points": pa.array(rows["points"], pa.int64()),
                      "event_time": pa.array(rows["event_time"], TIMESTAMP)})


def _standings_inputs(registry: Registry, rollup_path: Path, rollups: pa.Table, as_of: date
                      ) -> dict[str, Any]:
    dates = sorted(set(rollups.column("event_date").to_pylist()))
    needed = sorted(plan_windows(registry, dates, as_of))
    return {
        "rollups": pa.table({"path": [str(rollup_path)] * len(dates),
                             "event_date": pa.array(dates, pa.date32())}),
        "spec": board_window_spec(registry),
        "calendar": calendar_table(registry, dates[0] - timedelta(days=1),
                                   as_of + timedelta(days=1)),
        "needed": pa.table({"board": [b for b, _ in needed],
                            "window_id": [w for _, w in needed]}),
    }


@pytest.mark.spark
def test_engine_standings_match_duckdb_over_more_partitions(spark, tmp_path):
    registry = parse_registry(TIES, source="test")
    lake = tmp_path / "lake"
    with LandingWriter(lake, "t") as writer:
        report = Ingestor(registry, writer).ingest(_tied_events(3),
                                                   now=START + timedelta(days=2), source="test")
    assert report.accepted == 800
    files = sorted(str(p) for p in lake.glob("events/*/*.parquet"))
    landed = pq.read_table(files, columns=["player_id", "event_time"])
    assert landed.group_by(["player_id", "event_time"]).aggregate([]).num_rows < 790
    as_of = date(2026, 12, 1)
    calendar = calendar_table(registry, date(2026, 11, 28), date(2026, 12, 2))
    args = {"watermark": watermark_for(as_of), "since": None, "absorbed": [],
            "calendar": calendar, "bits": lateness_bits(registry)}
    staging = tmp_path / "staging"
    duck = DuckDBEngine()
    spark_engine = SparkEngine(spark, rank_partitions=8, staging_dir=str(staging))
    try:
        rollups, counted = duck.rollup_events(files, **args)
        assert counted == 800
        path = tmp_path / "rollups.parquet"
        pq.write_table(rollups, path)
        inputs = _standings_inputs(registry, path, rollups, as_of)
        want = duck.standings(**inputs, banned=["p007"])
        got = spark_engine.standings(**inputs, banned=["p007"])
        assert want.overflow is None
        assert got.overflow is None
        want_rows, got_rows = _plain(want.rows.read_all()), got.rows.read_all()
        assert got_rows.schema == want_rows.schema == RANKED_SCHEMA
        assert got_rows.num_rows > 0
        assert got_rows.equals(want_rows)
        assert got.histograms.schema == want.histograms.schema
        # DuckDB's histogram table is not in its ORDER BY order past one vector (2048 rows:
        # preserve_insertion_order is off there); the publisher sorts it, so compare sorted.
        order = [(c, "ascending") for c in ("board", "window_id", "kind", "bucket")]
        assert got.histograms.equals(got.histograms.sort_by(order))
        assert got.histograms.equals(want.histograms.sort_by(order))
        assert got.windows.equals(want.windows)
        assert len(list(staging.iterdir())) == 1  # the ordered rows, staged
    finally:
        duck.finish()
        spark_engine.finish()
        duck.close()
        spark_engine.close()
    assert list(staging.iterdir()) == []  # finish() removes what it staged
    assert spark.sparkContext._jsc is not None  # close() leaves a session it did not build


@pytest.mark.spark
def test_dedupe_and_rollup_shuffle_the_events_once(spark, tmp_path):
    """The events are hashed by player once; the dedupe (match, player) and the rollup
    (player, day, ...) group within those partitions (it used to shuffle twice)."""
    registry = parse_registry(TIES, source="test")
    lake = tmp_path / "lake"
    with LandingWriter(lake, "t") as writer:
        Ingestor(registry, writer).ingest(_tied_events(3), now=START + timedelta(days=2),
                                          source="test")
    files = sorted(str(p) for p in lake.glob("events/*/*.parquet"))
    frame = SparkEngine(spark, rank_partitions=4).rollup_frame(
        files, watermark=watermark_for(date(2026, 12, 1)), since=None, absorbed=[],
        calendar=calendar_table(registry, date(2026, 11, 28), date(2026, 12, 2)),
        bits=lateness_bits(registry))
    exchanges = [n.outputPartitioning().toString()
                 for n in _plan_nodes(frame._jdf.queryExecution().executedPlan())
                 if n.getClass().getSimpleName() == "ShuffleExchangeExec"]
    assert len(exchanges) == 1, exchanges
    assert exchanges[0].startswith("hashpartitioning(player_id")


@pytest.mark.spark
def test_dedupe_tie_break_compares_paths_as_given(spark, tmp_path, monkeypatch):
    """Equal ingested_at: the file whose path (as passed) sorts first wins, as in DuckDB.

    'a b' < 'a!b' as given, but Spark names them 'a%20b' > 'a!b': the order must come from
    the given paths, relative ones included."""
    registry = parse_registry(TIES, source="test")
    monkeypatch.chdir(tmp_path)
    at = START + timedelta(hours=1)
    paths = []
    for folder, points in (("a!b", 5), ("a b", 1)):
        table = pa.Table.from_pylist([{
            "match_id": "m1", "player_id": "p1", "points": points, "event_time": START,
            "region": "na", "mode": "ranked", "server_id": "s1", "ingested_at": at}],
            schema=LANDED_SCHEMA)
        Path(folder).mkdir()
        pq.write_table(table, f"{folder}/part.parquet")
        paths.append(f"{folder}/part.parquet")
    args = {"watermark": watermark_for(date(2026, 11, 30)), "since": None, "absorbed": [],
            "calendar": calendar_table(registry, date(2026, 11, 28), date(2026, 12, 1)),
            "bits": lateness_bits(registry)}
    duck = DuckDBEngine()
    try:
        want, _ = duck.rollup_events(paths, **args)
    finally:
        duck.close()
    got, counted = SparkEngine(spark).rollup_events(paths, **args)
    assert counted == 1
    assert want.column("points_sum").to_pylist() == [1]
    assert got.column("points_sum").to_pylist() == [1]
    assert np.array_equal(got.column("mask").to_numpy(), want.column("mask").to_numpy())


@pytest.mark.spark
def test_a_sum_past_the_key_range_saturates_like_duckdb(spark, tmp_path):
    """A sum under `earliest` ties that outgrows the exact sort-key range saturates at the
    limit, in both engines alike (issue 11.1: it used to stop the batch)."""
    raw = {**TIES, "board_defaults": {"min_points": 0, "max_points": 1_000_000},
           "boards": [{"scope": "global"},
                      {"scope": "global", "name": "big", "ties": "earliest",
                       "windows": ["all-time"]}]}
    registry = parse_registry(raw, source="test")
    limit = registry.layout("big", "all-time").limit
    rows = [{"match_id": f"m{i}", "player_id": "p1" if i < 5 else f"p{i}", "points": 900_000,
             "event_time": START + timedelta(hours=i), "region": "na", "mode": "ranked",
             "server_id": "s1"} for i in range(8)]
    lake = tmp_path / "lake"
    with LandingWriter(lake, "t") as writer:
        Ingestor(registry, writer).ingest(
            pa.Table.from_pylist(rows, schema=LANDED_SCHEMA.remove(
                LANDED_SCHEMA.get_field_index("ingested_at"))),
            now=START + timedelta(days=1), source="test")
    files = sorted(str(p) for p in lake.glob("events/*/*.parquet"))
    as_of = date(2026, 11, 30)
    calendar = calendar_table(registry, date(2026, 11, 28), date(2026, 12, 1))
    duck, spark_engine = DuckDBEngine(), SparkEngine(spark)
    try:
        rollups, counted = duck.rollup_events(
            files, watermark=watermark_for(as_of), since=None, absorbed=[], calendar=calendar,
            bits=lateness_bits(registry))
        assert counted == 8
        path = tmp_path / "rollups.parquet"
        pq.write_table(rollups, path)
        inputs = _standings_inputs(registry, path, rollups, as_of)
        want = duck.standings(**inputs, banned=[])
        want_rows = want.rows.read_all()
        got = spark_engine.standings(**inputs, banned=[])
        got_rows = got.rows.read_all()
    finally:
        duck.finish()
        spark_engine.finish()
        duck.close()
    assert want.overflow is None, "no overflow: the sum saturates"
    assert got.overflow is None
    assert got_rows.to_pylist() == want_rows.to_pylist()
    big = [r for r in got_rows.to_pylist() if (r["board"], r["window_id"]) == ("big", "all-time")]
    assert (big[0]["player_id"], big[0]["score"]) == ("p1", limit)
    assert limit < 4_500_000
    assert got.windows.equals(want.windows)


@pytest.mark.spark
def test_no_rollups_give_empty_results_of_the_same_shape(spark):
    registry = parse_registry(TIES, source="test")
    as_of = date(2026, 12, 1)
    needed = sorted(plan_windows(registry, [], as_of))
    inputs = {"rollups": pa.table({"path": pa.array([], pa.string()),
                                   "event_date": pa.array([], pa.date32())}),
              "spec": board_window_spec(registry),
              "calendar": calendar_table(registry, as_of, as_of + timedelta(days=1)),
              "needed": pa.table({"board": [b for b, _ in needed],
                                  "window_id": [w for _, w in needed]})}
    duck, spark_engine = DuckDBEngine(), SparkEngine(spark)
    try:
        assert spark_engine.rollup_events([], watermark=watermark_for(as_of), since=None,
                                          absorbed=[], calendar=inputs["calendar"],
                                          bits=lateness_bits(registry))[1] == 0
        want = duck.standings(**inputs, banned=[])
        got = spark_engine.standings(**inputs, banned=[])
        want_rows, got_rows = _plain(want.rows.read_all()), got.rows.read_all()
        assert got_rows.num_rows == want_rows.num_rows == 0
        assert got_rows.schema == want_rows.schema == RANKED_SCHEMA
        assert got.histograms.num_rows == want.histograms.num_rows == 0
        assert got.histograms.schema == want.histograms.schema
        assert got.windows.num_rows == want.windows.num_rows == 0
    finally:
        duck.finish()
        spark_engine.finish()
        duck.close()


def test_a_local_spark_binds_to_loopback_and_draws_no_progress_bars():
    """Regression: outside `make` a local Spark warned about SPARK_LOCAL_IP (hostname lookup,
    a LAN interface picked) and flooded the CLI with stage progress bars."""
    environ: dict[str, str] = {}
    conf = local_defaults("local[2]", environ)
    assert conf == {"spark.ui.showConsoleProgress": "false"}
    assert environ["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert environ["PYSPARK_PYTHON"]
    chosen = {"SPARK_LOCAL_IP": "10.1.2.3"}
    local_defaults("local[*]", chosen)
    assert chosen["SPARK_LOCAL_IP"] == "10.1.2.3"
    cluster: dict[str, str] = {}
    assert local_defaults("spark://h:7077", cluster) == {}
    assert cluster == {}
