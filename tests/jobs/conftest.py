"""Fixtures for the batch-layer tests: one local SparkSession for the whole run.

Starting a JVM costs seconds, so every Spark test shares one session (local[2], UTC, few
shuffle partitions, no UI); it is stopped when the session ends. Tests that need it are
marked `spark` and are skipped, with the reason, where pyspark or Java is missing.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from typing import Any

import pytest

SPARK_SHUFFLE_PARTITIONS = 4


def _spark_missing() -> str | None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed (pip install -e '.[spark]')"
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        return "no Java runtime (set JAVA_HOME or put java on PATH)"
    return None


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local SparkSession shared by the whole test run, stopped at teardown."""
    missing = _spark_missing()
    if missing:
        pytest.skip(missing)
    # Bind to loopback (no hostname lookups) and run Python workers on this interpreter.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("leaderboard-tests")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.shuffle.partitions", str(SPARK_SHUFFLE_PARTITIONS))
               .config("spark.default.parallelism", "2")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               # A short-lived JVM: the quick JIT tier alone starts and warms up much faster.
               .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def partitions_listed(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The raw-event partitions (`ingest_date=...` values, `*` for all of them) inside
    which the code under test listed files (listing the partitions' names is not counted):
    a task about a few days lists only those, so its cost does not grow with the history
    (issue 13)."""
    from pathlib import Path

    listed: set[str] = set()
    glob = Path.glob

    def spied(self: Path, pattern: str, *args: Any, **kwargs: Any) -> Any:
        parts = (*self.parts, *pattern.split("/"))
        for part in parts[:-1]:
            if part.startswith("ingest_date="):
                listed.add(part.removeprefix("ingest_date="))
                break
        return glob(self, pattern, *args, **kwargs)

    monkeypatch.setattr(Path, "glob", spied)
    return listed
