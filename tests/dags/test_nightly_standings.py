"""The nightly_standings DAG: it parses thin and fast, and `dag.test()` runs the real nights
against a generated lake and a real Redis, publishing what `run_batch` publishes."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from lakes import day, land, random_stream
from views import published_standings, version_standings

from jobs.batch import run_batch
from leaderboard.lake import landed_files
from leaderboard.manifest import list_versions, read_current, version_as_of
from leaderboard.registry import load_registry
from leaderboard.settings import Settings

pytestmark = pytest.mark.airflow

REPO_ROOT = Path(__file__).resolve().parents[2]
DAGS_FOLDER = REPO_ROOT / "dags"
DAG_ID = "nightly_standings"

START = day("2026-11-28")
NIGHTS = [date(2026, 11, 28), date(2026, 11, 29), date(2026, 11, 30)]
TASKS = {"wait_for_landing", "recompute", "validate", "publish", "rebase_speed", "compact",
         "apply_retention", "refresh_warehouse"}


def logical_date(as_of: date) -> datetime:
    """The logical date whose run, under dag.test(), covers [as_of, as_of + 1 day): a
    manual run's data interval is the whole day before its logical date."""
    return datetime.combine(as_of + timedelta(days=1), datetime.min.time(), UTC)


def settings_for(data: Path) -> Settings:
    return Settings.from_env({"LEADERBOARD_DATA": str(data)})


@pytest.fixture
def lakes(tmp_path: Path, redis_server: Any, redis_client: Any,
          monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(data dir the DAG runs on, an untouched copy for run_batch): three days landed in
    hourly micro-batches with late events and re-deliveries; the DAG's settings in env."""
    data = tmp_path / "data"
    land(data / "lake", load_registry(), random_stream(11, start=START, matches=90))
    control = tmp_path / "control"
    shutil.copytree(data, control)
    for name in ("LEADERBOARD_CONFIG", "LEADERBOARD_ENGINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LEADERBOARD_DATA", str(data))
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    monkeypatch.setenv("LEADERBOARD_NOW", "2026-12-20T00:00:00Z")  # every night is closed
    return data, control


def run_night(dag: Any, as_of: date) -> dict[str, Any]:
    """dag.test() for one night; returns {task_id: task instance}."""
    run = dag.test(logical_date=logical_date(as_of))
    instances = {ti.task_id: ti for ti in run.get_task_instances()}
    states = {task_id: str(ti.state) for task_id, ti in instances.items()}
    assert set(states) == TASKS
    assert all(state == "success" for state in states.values()), states
    assert str(run.state) == "success"
    return instances


def fast_retries(dag: Any) -> None:
    """Retry after a second, not minutes: dag.test() waits out the real delay."""
    for task in dag.tasks:
        task.retry_delay = timedelta(seconds=1)
        task.retry_exponential_backoff = 0
        task.max_retry_delay = timedelta(seconds=1)


# -- parsing --------------------------------------------------------------------------------

def test_the_dag_parses_without_errors_with_tags_and_retries(airflow_home):
    from airflow.dag_processing.dagbag import DagBag

    started = time.perf_counter()
    bag = DagBag(str(DAGS_FOLDER))
    seconds = time.perf_counter() - started
    assert bag.import_errors == {}
    dag = bag.dags[DAG_ID]
    assert {"leaderboard", "batch"} <= set(dag.tags)
    assert dag.doc_md
    assert "Nightly standings" in dag.doc_md
    assert dag.catchup is True
    assert dag.max_active_runs == 1
    assert {t.task_id for t in dag.tasks} == TASKS
    for task in dag.tasks:
        assert task.retries >= 2, task.task_id
        assert task.retry_exponential_backoff > 0, task.task_id
        assert task.doc_md, task.task_id
    sensor = dag.task_dict["wait_for_landing"]
    assert sensor.mode == "reschedule"
    assert 0 < sensor.timeout <= 24 * 3600
    assert dag.params["engine"] == "duckdb"
    interval = dag.timetable  # a daily interval in UTC, the whole previous day
    assert "0 0 * * *" in str(interval)
    assert "UTC" in str(interval)
    print(f"DagBag parse: {seconds:.3f} s")
    assert seconds < 2.0  # the bound; a thin file parses in well under 0.1 s


def test_parsing_imports_nothing_heavy(airflow_home, python_subprocess_env):
    """No engine, Arrow, Redis or project code at parse time (only Airflow itself)."""
    code = ("import runpy, sys; runpy.run_path(sys.argv[1]); "
            "heavy = [m for m in ('duckdb', 'pyarrow', 'pyspark', 'redis', 'jobs', "
            "'leaderboard', 'speed_layer') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code, str(DAGS_FOLDER / f"{DAG_ID}.py")],
                         capture_output=True, text=True, env=python_subprocess_env,
                         cwd=REPO_ROOT, check=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_spark_master_urls_from_a_connection(airflow_home):
    from dags.nightly_standings import spark_master

    assert spark_master("spark://master.example", 7077) == "spark://master.example:7077"
    assert spark_master("master.example", 7077) == "spark://master.example:7077"
    assert spark_master("yarn", None) == "yarn"
    assert spark_master("local[4]", None) == "local[4]"
    assert spark_master("k8s://https://api.example", 443) == "k8s://https://api.example:443"
    assert spark_master(None, None) is None


# -- running --------------------------------------------------------------------------------

@pytest.mark.redis
def test_three_nights_publish_what_run_batch_publishes(lakes, nightly, redis_client):
    """A three-night backfill through the DAG equals the nights run in order with
    run_batch; every closed day ends compacted; a rerun of a middle night publishes the
    same standings for it and leaves the later live version in place."""
    from leaderboard.speed_keys import read_current_version, version_tag

    data, control = lakes
    lake = data / "lake"
    files_before = {d: sum(1 for f in landed_files(lake) if f.ingest_date == d) for d in NIGHTS}
    for as_of in NIGHTS:
        instances = run_night(nightly, as_of)
        run_batch(settings_for(control), as_of)
        ours = version_as_of(lake, as_of)
        assert ours is not None
        assert ours.version == read_current(lake).version
        assert version_standings(lake, ours) == version_standings(
            control / "lake", version_as_of(control / "lake", as_of))
        assert read_current_version(redis_client).version == ours.version
        report = instances["compact"].xcom_pull(task_ids="compact")
        assert report["skipped"] is None, report
        assert report["files_after"] == 1 < files_before[as_of] == report["files_before"]
    assert published_standings(lake) == published_standings(control / "lake")
    assert (data / "warehouse.duckdb").exists()
    retained = instances["apply_retention"].xcom_pull(task_ids="apply_retention")
    assert retained["cutoff"] == str(NIGHTS[-1] - timedelta(days=30))
    assert retained["deleted"] == []
    assert retained["speed_versions_expired"] == []  # the rebases already set them to expire
    first_tag = version_tag(version_as_of(lake, NIGHTS[0]).version)
    old_keys = list(redis_client.scan_iter(match=f"lb:*{first_tag}*"))
    assert old_keys
    assert all(redis_client.ttl(key) > 0 for key in old_keys)
    modes = [m.inputs["mode"] for m in list_versions(lake)]
    assert modes == ["full", "incremental", "incremental"]  # compaction forced no recompute

    live = read_current(lake).version
    first = version_standings(lake, version_as_of(lake, NIGHTS[1]))
    run_night(nightly, NIGHTS[1])
    rerun = version_as_of(lake, NIGHTS[1])
    assert rerun.version != live
    assert version_standings(lake, rerun) == first
    assert read_current(lake).version == live  # the live pointer never moves back


@pytest.mark.redis
def test_a_failed_recompute_leaves_the_old_version_live_and_the_retry_publishes(
        lakes, nightly, monkeypatch):
    data, control = lakes
    lake = data / "lake"
    old = run_batch(settings_for(data), NIGHTS[0]).manifest.version
    run_batch(settings_for(control), NIGHTS[0])
    run_batch(settings_for(control), NIGHTS[1])
    monkeypatch.setenv("LEADERBOARD_FAIL_FIRST_TRY_AT", "batch.checks")
    fast_retries(nightly)
    seen: list[tuple[str, list[str]]] = []

    def after_the_failure(context: Any) -> None:
        seen.append((read_current(lake).version,
                     [m.version for m in list_versions(lake) if m.as_of_date == NIGHTS[1]]))

    nightly.task_dict["recompute"].on_retry_callback = [after_the_failure]
    instances = run_night(nightly, NIGHTS[1])
    assert instances["recompute"].try_number == 2
    assert seen == [(old, [])]  # after the failure: the old version live, no new manifest
    live = read_current(lake)
    assert live.as_of_date == NIGHTS[1]
    assert [m.as_of_date for m in list_versions(lake)] == [NIGHTS[0], NIGHTS[1]]
    assert published_standings(lake) == published_standings(control / "lake")


@pytest.mark.redis
def test_a_night_whose_landing_is_still_open_publishes_nothing(lakes, nightly, monkeypatch):
    """The sensor reschedules until the interval's end plus the settle time has passed, and
    times out (no retry) when it never does: nothing downstream runs."""
    data, _control = lakes
    as_of = NIGHTS[0]
    closes = logical_date(as_of) + timedelta(minutes=15)
    monkeypatch.setenv("LEADERBOARD_NOW", (closes - timedelta(minutes=1)).isoformat())
    sensor = nightly.task_dict["wait_for_landing"]
    sensor.poke_interval = 1
    sensor.timeout = 3
    run = nightly.test(logical_date=logical_date(as_of))
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    assert str(run.state) == "failed"
    assert states["wait_for_landing"] == "failed"
    assert states["recompute"] == "upstream_failed"
    assert list_versions(data / "lake") == []
    assert read_current(data / "lake") is None


@pytest.mark.redis
@pytest.mark.spark
@pytest.mark.slow
def test_spark_runs_through_the_same_entry_point_on_the_connection_master(
        lakes, nightly, monkeypatch):
    """engine=spark: the master comes from the `spark_default` connection, and the night
    publishes what DuckDB publishes for the same lake."""
    if shutil.which("java") is None and "JAVA_HOME" not in os.environ:
        pytest.skip("no Java runtime (set JAVA_HOME or put java on PATH)")
    pytest.importorskip("pyspark")
    data, control = lakes
    monkeypatch.delenv("SPARK_MASTER", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT",
                       '{"conn_type": "spark", "host": "local[1]"}')
    monkeypatch.setenv("SPARK_SHUFFLE_PARTITIONS", "2")
    # a short-lived JVM: no UI, and the quick JIT tier alone starts and warms up faster
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--conf spark.ui.enabled=false --driver-java-options"
                       " -XX:TieredStopAtLevel=1 pyspark-shell")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # no INFO lines after pytest exits
    run = nightly.test(logical_date=logical_date(NIGHTS[0]), run_conf={"engine": "spark"})
    instances = {ti.task_id: ti for ti in run.get_task_instances()}
    assert all(str(ti.state) == "success" for ti in instances.values())
    batch = instances["recompute"].xcom_pull(task_ids="recompute")
    assert batch["engine"] == "spark"
    assert batch["spark_master"] == "local[1]"
    assert "SPARK_MASTER" not in os.environ  # restored after the run
    run_batch(settings_for(control), NIGHTS[0], engine="duckdb")
    assert published_standings(data / "lake") == published_standings(control / "lake")
