"""A published lake for the console's tests: a few days landed (with some rows quarantined),
the batch as of 2026-11-30 published, and the later events left for the speed layer."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from datetime import UTC, date, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from lakes import land, random_stream

from jobs.batch import run_batch
from leaderboard.settings import Settings

NOW = "2026-12-01T18:00:00Z"
KEY = "console-test-key-0123456789"
ADMIN = "console-admin-key-0123456789"


@pytest.fixture(scope="session")
def console_published(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("console") / "data"
    settings = Settings.from_env({"LEADERBOARD_DATA": str(data), "LEADERBOARD_NOW": NOW})
    events = random_stream(5, start=datetime(2026, 11, 27, tzinfo=UTC), days=5, matches=120,
                           players=40, late_share=0.0)
    cutoff = datetime(2026, 12, 1, 17, tzinfo=UTC)
    kept = [e for e in events if e["ingested_at"] < cutoff]
    # Rows the validation quarantines: an unknown region, and points beyond the bounds.
    bad = [dict(e, region="atlantis", match_id=f"bad-r{i}") for i, e in enumerate(kept[:7])]
    bad += [dict(e, points=10**9, match_id=f"bad-p{i}") for i, e in enumerate(kept[7:10])]
    land(settings.lake_dir, settings.registry, kept + bad)
    run_batch(settings, date(2026, 11, 30))
    return data


@pytest.fixture
def console_data(console_published: Path, tmp_path: Path) -> Settings:
    """A private copy of the published data dir (a test may ingest into it)."""
    data = tmp_path / "data"
    shutil.copytree(console_published, data)
    return Settings.from_env({"LEADERBOARD_DATA": str(data), "LEADERBOARD_NOW": NOW})


@pytest.fixture
def console_keys(tmp_path: Path) -> SimpleNamespace:
    """A keys file with one game server and the admin key."""
    path = tmp_path / "keys.toml"
    path.write_text(f'admin_key = "{ADMIN}"\n[servers]\n"eu-1" = "{KEY}"\n')
    return SimpleNamespace(path=path, key=KEY, admin=ADMIN, now=NOW)


@pytest.fixture
def console(console_data: Settings, console_keys: SimpleNamespace,
            redis_client: Any) -> Iterator[Any]:
    """The app (a TestClient) on the private data dir, its speed layer rebuilt in Redis,
    with the keys file: what the console's page and search tests read through."""
    import warnings

    from app.http import HttpConfig, create_app
    from speed_layer.service import SpeedLayer

    with warnings.catch_warnings():  # starlette suggests httpx2; httpx is what is installed
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

    SpeedLayer(redis_client, console_data.registry, console_data.lake_dir).rebuild(
        console_data.now())
    config = HttpConfig.from_env({"LEADERBOARD_API_KEYS": str(console_keys.path)})
    with TestClient(create_app(console_data, config, client=redis_client)) as client:
        yield client
