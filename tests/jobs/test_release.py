"""Check-then-publish of a written version: what the DAG's validate and publish tasks do."""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from lakes import day, land, random_stream

from jobs.batch import run_batch
from jobs.compact import SpeedWatermark
from jobs.publish import PublishError
from jobs.release import publish_version, set_aside, validate_version
from jobs.retention import apply_retention
from leaderboard.manifest import list_versions, read_current
from leaderboard.registry import load_registry
from leaderboard.settings import Settings

START = day("2026-11-20")
D = date(2026, 11, 20)


def settings_for(data: Path) -> Settings:
    return Settings.from_env({"LEADERBOARD_DATA": str(data)})


@pytest.fixture
def data(tmp_path):
    data = tmp_path / "data"
    land(data / "lake", load_registry(), random_stream(4, start=START, days=4, matches=60,
                                                       duplicate_share=0.0))
    return data


def test_an_unpublished_version_is_checked_then_published(data):
    lake = data / "lake"
    first = run_batch(settings_for(data), D)
    second = run_batch(settings_for(data), D + timedelta(days=1), publish=False)
    assert read_current(lake).version == first.manifest.version  # written, not live
    checked = validate_version(lake, second.manifest.version, registry=load_registry(),
                               as_of=D + timedelta(days=1))
    assert checked["windows_checked"] > 0
    assert checked["events"] == second.manifest.inputs["events"]
    published, live = publish_version(lake, second.manifest.version)
    assert published
    assert read_current(lake).version == live.version == second.manifest.version


def test_a_tampered_standings_file_fails_and_is_set_aside(data):
    lake = data / "lake"
    result = run_batch(settings_for(data), D, publish=False)
    index = result.manifest.standings(lake)
    path = lake / index.filter(pc.equal(index.column("board"), "global")).column("path")[0].as_py()
    table = pq.read_table(path)
    ranks = table.column("rank").to_pylist()
    ranks[0] += 1
    pq.write_table(table.set_column(table.schema.get_field_index("rank"), "rank",
                                    [ranks]), path)
    with pytest.raises(PublishError, match="rank"):
        validate_version(lake, result.manifest.version, registry=load_registry())
    set_aside(lake, result.manifest.version)
    assert list_versions(lake) == []
    assert read_current(lake) is None


def test_the_wrong_night_or_registry_is_refused(data, make_registry):
    lake = data / "lake"
    result = run_batch(settings_for(data), D, publish=False)
    with pytest.raises(PublishError, match="as of"):
        validate_version(lake, result.manifest.version, registry=load_registry(),
                         as_of=D + timedelta(days=1))
    other = make_registry(mutate=lambda raw: raw["limits"].update(grace="2d"))
    with pytest.raises(PublishError, match="registry"):
        validate_version(lake, result.manifest.version, registry=other)


def test_the_live_pointer_never_moves_back_in_time(data):
    lake = data / "lake"
    run_batch(settings_for(data), D)
    later = run_batch(settings_for(data), D + timedelta(days=2))
    rerun = run_batch(settings_for(data), D, publish=False)
    published, live = publish_version(lake, rerun.manifest.version)
    assert not published
    assert live.version == later.manifest.version == read_current(lake).version
    same_night = run_batch(settings_for(data), D + timedelta(days=2), publish=False)
    assert publish_version(lake, same_night.manifest.version)[0]


def test_a_full_recompute_after_retention_is_refused(data):
    lake = data / "lake"
    for offset in range(4):
        run_batch(settings_for(data), D + timedelta(days=offset))
    report = apply_retention(lake, D + timedelta(days=3), 1,
                             speed=SpeedWatermark(present=False), registry=load_registry())
    assert report.deleted
    incremental = run_batch(settings_for(data), D + timedelta(days=4), publish=False)
    validate_version(lake, incremental.manifest.version, registry=load_registry())
    full = run_batch(settings_for(data), D + timedelta(days=4), full=True, publish=False)
    with pytest.raises(PublishError, match="retention"):
        validate_version(lake, full.manifest.version, registry=load_registry())


def test_main_checks_and_publishes_from_the_command_line(data, clean_env, capsys):
    import json

    from jobs.release import main

    result = run_batch(settings_for(data), D, publish=False)
    version = result.manifest.version
    assert main(["--version", version, "--data", str(data), "--check-only"]) == 0
    assert read_current(data / "lake") is None
    assert main(["--version", version, "--data", str(data)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["published"] is True
    assert read_current(data / "lake").version == version
    assert main(["--version", "no-such-version", "--data", str(data)]) != 0
