"""Fixtures for the DAG tests: Airflow on a temporary, migrated sqlite metadata DB.

Airflow reads its configuration when first imported, so the session fixture sets
AIRFLOW_HOME (a temp dir), the sqlite DB, the dags folder and no example DAGs before any
test imports it, and runs `airflow db migrate` once. Tests are skipped, with the reason,
where Airflow is not installed.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

DAGS_FOLDER = Path(__file__).resolve().parents[2] / "dags"


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A migrated Airflow home for the session (sqlite), set in this process's environment."""
    if importlib.util.find_spec("airflow") is None:
        pytest.skip("Apache Airflow is not installed (pip install -e '.[airflow]')")
    if "airflow" in sys.modules:
        pytest.fail("airflow was imported before its test home was set; import it in tests only")
    home = tmp_path_factory.mktemp("airflow_home")
    settings = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True,
                   capture_output=True, env=dict(os.environ), timeout=300)
    try:
        yield home
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
def dag_bag(airflow_home: Path) -> Any:
    """The dags folder parsed as the scheduler would."""
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(str(DAGS_FOLDER))


@pytest.fixture
def nightly(airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The nightly_standings DAG, freshly parsed (tests may tune its retry delays), with a
    start date before the test nights (a task gets no instance before its start date)."""
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("LEADERBOARD_DAG_START", "2026-11-01")
    bag = DagBag(str(DAGS_FOLDER))
    assert not bag.import_errors, bag.import_errors
    return bag.dags["nightly_standings"]
