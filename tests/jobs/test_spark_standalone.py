"""The batch on a Spark standalone cluster: a master and a worker started here from the
pyspark install (`spark-class ...deploy.master.Master` / `...deploy.worker.Worker`), the job
submitted as an operator would (`python -m jobs.batch --engine spark` with SPARK_MASTER =
spark://...), its executors in the worker's JVM, its ordered standings staged in a directory
the driver and the executors share. The published standings must equal DuckDB's on the same
lake, row for row.

Opt-in (a JVM for the master, the worker, the executor and the driver: over a minute on a
busy two-core machine): LEADERBOARD_SPARK_STANDALONE=1. The README's "Spark on a cluster"
gives the same steps by hand.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, date, datetime
from pathlib import Path

import pytest
from lakes import land, random_stream
from views import published_standings

from jobs.batch import run_batch
from leaderboard.redis_server import free_port
from leaderboard.settings import Settings

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.skipif(not os.environ.get("LEADERBOARD_SPARK_STANDALONE"),
                       reason="starts a Spark standalone master and worker (over a minute): "
                              "set LEADERBOARD_SPARK_STANDALONE=1 to run it"),
]

REPO = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
AS_OF = date(2026, 11, 30)


def _spark_class() -> Path:
    try:
        import pyspark
    except ImportError:
        pytest.skip("pyspark is not installed (pip install -e '.[spark]')")
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        pytest.skip("no Java runtime (set JAVA_HOME or put java on PATH)")
    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def _spark_env(root: Path) -> dict[str, str]:
    """Loopback only, small daemons, logs under root, this interpreter for Python workers."""
    return {**os.environ, "SPARK_LOCAL_IP": HOST, "SPARK_LOG_DIR": str(root / "logs"),
            "SPARK_DAEMON_MEMORY": "256m", "SPARK_DAEMON_JAVA_OPTS": "-XX:TieredStopAtLevel=1",
            "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


def _alive_workers(ui_port: int) -> int:
    """Workers the master lists as ALIVE (its web UI's JSON)."""
    with urllib.request.urlopen(f"http://{HOST}:{ui_port}/json/", timeout=2) as answer:
        state = json.load(answer)
    return sum(1 for worker in state.get("workers", []) if worker.get("state") == "ALIVE")


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[str]:
    """A Spark standalone master and one worker (1 core, 1 GiB) on loopback; yields the
    master URL; both are stopped (their whole process groups) at teardown."""
    spark_class = _spark_class()
    root = tmp_path / "spark"
    (root / "work").mkdir(parents=True)
    env = _spark_env(root)
    port, ui_port = free_port(), free_port()
    master_url = f"spark://{HOST}:{port}"
    commands = [
        [str(spark_class), "org.apache.spark.deploy.master.Master", "--host", HOST,
         "--port", str(port), "--webui-port", str(ui_port)],
        [str(spark_class), "org.apache.spark.deploy.worker.Worker", "--host", HOST,
         "--port", str(free_port()), "--webui-port", str(free_port()), "--cores", "1",
         "--memory", "1g", "--work-dir", str(root / "work"), master_url],
    ]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for number, command in enumerate(commands):
            log = (root / f"daemon-{number}.log").open("wb")
            processes.append(subprocess.Popen(command, env=env, stdout=log,
                                              stderr=subprocess.STDOUT,
                                              start_new_session=True))
        deadline = time.monotonic() + 120
        while True:
            try:
                if _alive_workers(ui_port) >= 1:
                    break
            except OSError:
                pass
            for number, process in enumerate(processes):
                if process.poll() is not None:
                    log = (root / f"daemon-{number}.log").read_text()[-3000:]
                    raise RuntimeError(f"{commands[number][1]} exited: {log}")
            if time.monotonic() > deadline:
                raise TimeoutError("the Spark worker did not register with the master "
                                   "within 120 s")
            time.sleep(0.5)
        yield master_url
    finally:
        for process in reversed(processes):
            if process.poll() is None:
                os.killpg(process.pid, 15)
        for process in processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, 9)
                process.wait()


def test_the_batch_on_a_standalone_cluster_equals_duckdb(standalone, tmp_path):
    events = random_stream(61, start=datetime(2026, 11, 24, tzinfo=UTC), days=7, matches=120,
                           players=40)
    runs = {}
    for engine in ("duckdb", "spark"):
        data = tmp_path / engine
        settings = Settings.from_env({"LEADERBOARD_DATA": str(data),
                                      "LEADERBOARD_NOW": "2026-12-01T06:00:00Z"})
        land(settings.lake_dir, settings.registry, events)
        runs[engine] = settings
    run_batch(runs["duckdb"], AS_OF, full=True)
    staging = tmp_path / "staging"
    staging.mkdir()
    env = {**_spark_env(tmp_path / "spark"), "SPARK_MASTER": standalone,
           "LEADERBOARD_DATA": str(runs["spark"].data_dir),
           "LEADERBOARD_NOW": "2026-12-01T06:00:00Z",
           # A directory the driver and the executors share (one machine here; on a real
           # cluster, shared storage) for the ordered standings.
           "LEADERBOARD_SPARK_STAGING": str(staging),
           "PYSPARK_SUBMIT_ARGS": "--conf spark.executor.memory=512m "
                                  "--conf spark.ui.enabled=false "
                                  "--conf spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1 "
                                  "pyspark-shell",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                       os.environ.get("PYTHONPATH")]))}
    env.pop("LEADERBOARD_CONFIG", None)
    done = subprocess.run([sys.executable, "-m", "jobs.batch", "--as-of", AS_OF.isoformat(),
                           "--engine", "spark", "--full"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-5000:]
    spark = published_standings(runs["spark"].lake_dir)
    assert spark == published_standings(runs["duckdb"].lake_dir)
    assert sum(len(rows) for rows in spark.values()) > 100
    # The executors ran in the worker: it kept their application's directory.
    assert any((tmp_path / "spark" / "work").iterdir())
