"""Settings: the environment first, flags override, bad values name their variable."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from leaderboard.settings import ENGINES, Settings, SettingsError


def test_defaults():
    settings = Settings.from_env({})
    assert settings.data_dir == Path("data")
    assert settings.lake_dir == Path("data") / "lake"
    assert settings.config is None
    assert settings.redis_url is None
    assert settings.engine == "duckdb"
    assert settings.now_override is None
    assert ENGINES == ("duckdb", "spark")


def test_every_variable_is_read():
    settings = Settings.from_env({
        "LEADERBOARD_DATA": "/srv/lb",
        "LEADERBOARD_CONFIG": "football",
        "REDIS_URL": "redis://cache:6380/2",
        "LEADERBOARD_ENGINE": "Spark",
        "LEADERBOARD_NOW": "2026-12-01T12:00:00+02:00",
    })
    assert settings.data_dir == Path("/srv/lb")
    assert settings.lake_dir == Path("/srv/lb/lake")
    assert settings.config == "football"
    assert settings.registry.regions == ("world",)
    assert settings.redis_url == "redis://cache:6380/2"
    assert settings.engine == "spark", "engine names are case-insensitive"
    assert settings.now_override == datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def test_empty_variables_mean_unset():
    settings = Settings.from_env({name: "" for name in (
        "LEADERBOARD_DATA", "LEADERBOARD_CONFIG", "REDIS_URL", "LEADERBOARD_ENGINE",
        "LEADERBOARD_NOW")})
    assert settings == Settings.from_env({})


def test_the_process_environment_is_the_default(clean_env):
    clean_env.setenv("LEADERBOARD_DATA", "/from/env")
    clean_env.setenv("LEADERBOARD_ENGINE", "spark")
    settings = Settings.from_env()
    assert (settings.data_dir, settings.engine) == (Path("/from/env"), "spark")


def test_overrides_win_and_none_means_not_given():
    env = {"LEADERBOARD_DATA": "/from/env", "LEADERBOARD_ENGINE": "spark",
           "LEADERBOARD_NOW": "2026-01-01T00:00:00Z", "REDIS_URL": "redis://env"}
    settings = Settings.from_env(env, data_dir="/from/flag", engine="duckdb",
                                 now_override="2026-12-24T18:00:00Z", redis_url=None,
                                 config="football")
    assert settings.data_dir == Path("/from/flag")
    assert settings.engine == "duckdb"
    assert settings.now_override == datetime(2026, 12, 24, 18, tzinfo=UTC)
    assert settings.redis_url == "redis://env", "a None flag leaves the environment's value"
    assert settings.config == "football"
    flag_time = datetime(2027, 1, 1, tzinfo=UTC)
    assert Settings.from_env(env, now_override=flag_time).now() == flag_time


@pytest.mark.parametrize("value", ["postgres", "duck db", "sparkle"])
def test_a_bad_engine_names_the_variable(value):
    with pytest.raises(SettingsError) as info:
        Settings.from_env({"LEADERBOARD_ENGINE": value})
    message = str(info.value)
    assert "LEADERBOARD_ENGINE" in message
    assert repr(value) in message
    assert "duckdb" in message, "says what to use"
    assert "spark" in message


def test_a_bad_engine_flag_is_refused():
    with pytest.raises(SettingsError, match="'oracle'"):
        Settings.from_env({}, engine="oracle")


@pytest.mark.parametrize("value", ["yesterday", "2026-13-01", "12/01/2026", "2026-12-01T25:00"])
def test_a_bad_now_names_the_variable(value):
    with pytest.raises(SettingsError) as info:
        Settings.from_env({"LEADERBOARD_NOW": value})
    message = str(info.value)
    assert "LEADERBOARD_NOW" in message
    assert repr(value) in message
    assert "2026-12-01T12:00:00Z" in message, "shows an example"


def test_a_bad_now_flag_raises_settings_error():
    with pytest.raises(SettingsError, match="--now"):
        Settings.from_env({}, now_override="yesterday")


@pytest.mark.parametrize(("value", "expected"), [
    ("2026-12-01T12:00:00Z", datetime(2026, 12, 1, 12, tzinfo=UTC)),
    ("2026-12-01T12:00:00", datetime(2026, 12, 1, 12, tzinfo=UTC)),     # naive = UTC
    ("2026-12-01", datetime(2026, 12, 1, tzinfo=UTC)),                  # a date is midnight
    ("2026-12-01T12:00:00-05:00", datetime(2026, 12, 1, 17, tzinfo=UTC)),
    (" 2026-12-01T12:00:00.5Z ", datetime(2026, 12, 1, 12, 0, 0, 500000, tzinfo=UTC)),
])
def test_now_honours_leaderboard_now(value, expected):
    settings = Settings.from_env({"LEADERBOARD_NOW": value})
    assert settings.now() == expected
    assert settings.now().utcoffset().total_seconds() == 0
    assert settings.now() == settings.now(), "a frozen clock does not move"


def test_without_leaderboard_now_the_clock_is_the_wall_clock():
    before = datetime.now(UTC)
    now = Settings.from_env({}).now()
    after = datetime.now(UTC)
    assert before <= now <= after
    assert now.tzinfo is not None


def test_settings_are_immutable():
    settings = Settings.from_env({})
    with pytest.raises(AttributeError):
        settings.engine = "spark"  # type: ignore[misc]


@pytest.mark.parametrize(("text", "expected"), [
    ("", 512 * 1024**2), ("1048576", 1024**2), ("64KiB", 64 * 1024), ("1.5 GiB", 3 * 1024**3 // 2),
    ("0", 0), ("300b", 300)])
def test_the_base_cache_bound_reads_bytes_and_binary_units(text, expected):
    settings = Settings.from_env({"LEADERBOARD_BASE_CACHE_BYTES": text})
    assert settings.base_cache_bytes == expected


@pytest.mark.parametrize("text", ["-1", "5MB", "lots", "inf", "nan", "1e400"])
def test_a_bad_base_cache_bound_names_the_variable(text):
    with pytest.raises(SettingsError, match=r"LEADERBOARD_BASE_CACHE_BYTES=.*e\.g\. 512MiB"):
        Settings.from_env({"LEADERBOARD_BASE_CACHE_BYTES": text})
