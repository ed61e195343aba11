"""The board registry: the shipped registries, loading by path, and every way to get it wrong."""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Callable
from datetime import date, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from strategies import base_registry_raw, registry_raws

from leaderboard.calendar import WINDOW_KINDS
from leaderboard.registry import (
    RegistryError,
    load_registry,
    parse_registry,
    shipped_registries,
)
from leaderboard.settings import Settings
from leaderboard.sortkey import max_abs_score

DEFAULT_BOARDS = ["global", "region:na", "region:eu", "region:sa", "region:asia",
                  "mode:ranked", "mode:casual", "mode:tournament"]


# -- the shipped registries ----------------------------------------------------------------


def test_default_registry_shape(registry):
    assert registry.regions == ("na", "eu", "sa", "asia")
    assert registry.modes == ("ranked", "casual", "tournament")
    assert [b.name for b in registry.boards] == [*DEFAULT_BOARDS, "best-lap"]
    lap = registry.board("best-lap")
    assert (lap.source, lap.scope, lap.scope_key, lap.windows) == (
        "direct", "board", "board:best-lap", ("weekly", "all-time"))
    assert (lap.aggregation, lap.order, lap.ties) == ("min", "asc", "earliest")
    assert not registry.boards_for("na", "ranked").count(lap), "never fed by match events"
    events = [b for b in registry.boards if not b.direct]
    for board in events:
        assert board.windows == WINDOW_KINDS == ("daily", "weekly", "monthly", "season",
                                                 "all-time")
        assert (board.aggregation, board.order, board.ties) == ("sum", "desc", "shared")
        assert (board.min_points, board.max_points) == (0, 1000)
        assert board.grace == timedelta(days=7)
    assert [(b.scope, b.scope_value) for b in events] == [
        ("global", None), ("region", "na"), ("region", "eu"), ("region", "sa"),
        ("region", "asia"), ("mode", "ranked"), ("mode", "casual"), ("mode", "tournament")]
    assert registry.future_skew == timedelta(minutes=5)
    assert registry.idempotency_horizon == timedelta(hours=24)
    assert registry.retention_days == 30
    assert registry.max_grace == timedelta(days=7)
    assert registry.calendar.seasons is None, "quarterly seasons"
    assert registry.calendar.all_time_start == date(1970, 1, 1)
    assert "default" in registry.source
    assert len(registry.fingerprint) == 16
    int(registry.fingerprint, 16)


def test_boards_for_an_event(registry):
    assert [b.name for b in registry.boards_for("eu", "casual")] == [
        "global", "region:eu", "mode:casual"]
    assert [b.name for b in registry.boards_for("mars", "solo")] == ["global"]


def test_board_lookup(registry):
    assert registry.board("region:asia").scope_value == "asia"
    with pytest.raises(RegistryError, match="'region:mars'") as info:
        registry.board("region:mars")
    assert "mode:tournament" in str(info.value), "lists the boards that exist"


def test_shipped_registries_and_the_football_registry(football_registry):
    assert {"default", "football"} <= set(shipped_registries())
    assert football_registry.regions == ("world",)
    assert football_registry.modes == ("friendly", "qualification", "finals")
    assert [b.name for b in football_registry.boards] == [
        "global", "mode:friendly", "mode:qualification", "mode:finals"]
    assert all(b.max_points == 3 and b.min_points == 0 for b in football_registry.boards)
    assert football_registry.calendar.all_time_start == date(1870, 1, 1)
    assert football_registry.retention_days == 36500
    assert "football" in football_registry.source


def test_the_test_base_registry_mirrors_the_shipped_default(registry):
    """strategies.base_registry_raw() is the default registry; the fingerprint proves it."""
    assert parse_registry(base_registry_raw()).fingerprint == registry.fingerprint


# -- loading by path -----------------------------------------------------------------------


@pytest.fixture
def custom_toml(tmp_path: Path) -> Path:
    text = (resources.files("leaderboard") / "registries" / "default.toml").read_text()
    path = tmp_path / "boards.toml"
    path.write_text(text.replace('grace = "7d"', 'grace = "2d"')
                    .replace('ties = "shared"', 'ties = "earliest"'))
    return path


def test_load_registry_from_a_path(custom_toml):
    for config in (custom_toml, str(custom_toml)):
        registry = load_registry(config)
        assert registry.source == str(custom_toml)
        assert all(b.grace == timedelta(days=2) for b in registry.boards)
        assert all(b.ties == "earliest" for b in registry.boards)


def test_leaderboard_config_names_the_registry(custom_toml, clean_env):
    clean_env.setenv("LEADERBOARD_CONFIG", str(custom_toml))
    settings = Settings.from_env()
    assert settings.registry.source == str(custom_toml)
    assert settings.registry.boards[0].ties == "earliest"
    assert Settings.from_env({"LEADERBOARD_CONFIG": "football"}).registry.regions == ("world",)
    assert Settings.from_env({}).registry.fingerprint == load_registry().fingerprint


def test_missing_registry_file(tmp_path):
    path = tmp_path / "nope.toml"
    with pytest.raises(RegistryError) as info:
        load_registry(path)
    message = str(info.value)
    assert str(path) in message
    assert "does not exist" in message
    assert "LEADERBOARD_CONFIG" in message, "says what to use"
    assert "football" in message


def test_invalid_toml(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text('regions = ["na"\nmodes = ["ranked"]\n')
    with pytest.raises(RegistryError, match="not valid TOML") as info:
        load_registry(path)
    assert str(path) in str(info.value)


def test_a_bad_file_is_named_in_the_error(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(tomllib_dump_minimal(aggregation="median"))
    with pytest.raises(RegistryError) as info:
        load_registry(path)
    assert str(path) in str(info.value)
    assert "'median'" in str(info.value)


def tomllib_dump_minimal(aggregation: str) -> str:
    text = ('regions = ["na"]\nmodes = ["ranked"]\n[[boards]]\nscope = "global"\n'
            f'aggregation = "{aggregation}"\n')
    tomllib.loads(text)  # the file itself is valid TOML; only the value is bad
    return text


# -- bad registries, one row per mistake -----------------------------------------------------


def _board(index: int, **values: Any) -> Callable[[dict[str, Any]], None]:
    return lambda raw: raw["boards"][index].update(values)


def _set(section: str, **values: Any) -> Callable[[dict[str, Any]], None]:
    return lambda raw: raw.setdefault(section, {}).update(values)


def _explicit(*seasons: tuple[str, str, str]) -> Callable[[dict[str, Any]], None]:
    def mutate(raw: dict[str, Any]) -> None:
        raw["calendar"] = {"season": "explicit", "seasons": [
            {"id": i, "start": s, "end": e} for i, s, e in seasons]}
    return mutate


BAD_REGISTRIES: list[tuple[str, Callable[[dict[str, Any]], None], list[str]]] = [
    ("unknown top key", lambda raw: raw.update(colour="red"), ["`colour`", "not a known key"]),
    ("unknown board key", _board(0, colour="red"), ["`boards[0].colour`"]),
    ("unknown limits key", _set("limits", graze="7d"), ["`limits.graze`"]),
    ("unknown calendar key", _set("calendar", timezone="CET"), ["`calendar.timezone`"]),
    ("scope in board_defaults", _set("board_defaults", scope="global"),
     ["`board_defaults.scope`"]),
    ("bad aggregation", _board(1, aggregation="avg"),
     ["`boards[1].aggregation`", "'avg'", "sum, max, min, last"]),
    ("bad order", _board(0, order="up"), ["`boards[0].order`", "'up'", "desc, asc"]),
    ("bad ties", _board(2, ties="first"), ["`boards[2].ties`", "'first'", "shared, earliest"]),
    ("unknown window", _board(0, windows=["daily", "yearly"]),
     ["`boards[0].windows`", "'yearly'", "all-time"]),
    ("window twice", _board(0, windows=["daily", "daily"]), ["`boards[0].windows`", "twice"]),
    ("no windows", _board(0, windows=[]), ["`boards[0].windows`", "non-empty"]),
    ("unknown region in scope", _board(1, scope="region:mars"),
     ["`boards[1].scope`", "'mars'", "na, eu, sa, asia"]),
    ("unknown mode in scope", _board(2, scope="mode:solo"),
     ["`boards[2].scope`", "'solo'", "ranked, casual, tournament"]),
    ("unknown scope kind", _board(0, scope="planet:x"), ["`boards[0].scope`", "'planet:x'"]),
    ("empty scope value", _board(0, scope="region:"), ["`boards[0].scope`", "'region:'"]),
    ("missing scope", lambda raw: raw["boards"][0].pop("scope"),
     ["`boards[0].scope`", "missing"]),
    ("duplicate board names", lambda raw: raw["boards"].append({"scope": "global"}),
     ["'global' twice"]),
    ("unknown source", _board(0, source="kafka"), ["`boards[0].source`", "events, direct"]),
    ("direct board with a scope", _board(0, source="direct", name="laps"),
     ["`boards[0].scope`", "not for a direct board"]),
    ("direct board without a name",
     lambda raw: raw["boards"].append({"source": "direct"}), [".name`", "required"]),
    ("direct board named like an event board",
     lambda raw: raw["boards"].append({"source": "direct", "name": "global"}),
     ["'global' twice"]),
    ("source in board_defaults", _set("board_defaults", source="direct"),
     ["`board_defaults.source`"]),
    ("duplicate by explicit name",
     lambda raw: raw["boards"].append({"scope": "region:eu", "name": "mode:ranked"}),
     ["'mode:ranked' twice"]),
    ("bad board name", _board(0, name="Global Board"), ["`boards[0].name`", "'Global Board'"]),
    ("wildcard name without *", _board(1, name="regional"), ["`boards[1].name`", "*"]),
    ("min > max", _set("board_defaults", min_points=10, max_points=5),
     ["min_points 10", "max_points 5"]),
    ("points bound not an integer", _board(0, max_points="1000"),
     ["`boards[0].max_points`", "'1000'"]),
    ("points bound a float", _board(0, min_points=0.5), ["`boards[0].min_points`", "0.5"]),
    ("earliest with bounds too large for all-time",
     _set("board_defaults", ties="earliest", max_points=2**21),
     ["`boards.global`", str(2**21), "all-time", str(2**20 - 1), "ties=earliest",
      "all_time_end"]),
    ("earliest with a negative bound too large",
     _set("board_defaults", ties="earliest", aggregation="max", min_points=-(2**21)),
     ["`boards.global`", str(2**21), "all-time"]),
    ("shared with a bound past 2^53",
     _set("board_defaults", max_points=10**17), ["`boards.global`", str(10**17), str(2**53 - 1)]),
    ("sum of both signs without headroom",
     _set("board_defaults", min_points=-(2**40), max_points=2**40),
     ["`boards.global`", "both signs", str(2**40), "65536"]),
    ("all_time_end before all_time_start", _set("calendar", all_time_end="1960-01-01"),
     ["`calendar.all_time_end`", "1960-01-01", "1970-01-01"]),
    ("bad all_time_end", _set("calendar", all_time_end="soon"),
     ["`calendar.all_time_end`", "YYYY-MM-DD"]),
    ("earliest too large for a monthly window",
     _set("board_defaults", ties="earliest", windows=["daily", "monthly"],
          max_points=2**31),
     ["`boards.global`", "monthly", str(2**31 - 1)]),
    ("bad grace", _set("limits", grace="7 days"), ["`limits.grace`", "'7 days'"]),
    ("negative future_skew", _set("limits", future_skew=-5), ["`limits.future_skew`", "-5"]),
    ("bad idempotency_horizon", _set("limits", idempotency_horizon="1y"),
     ["`limits.idempotency_horizon`", "'1y'"]),
    ("bad board grace", _board(0, grace="soon"), ["`boards[0].grace`", "'soon'"]),
    ("retention 0", _set("limits", retention_days=0), ["`limits.retention_days`", "0"]),
    ("no regions", lambda raw: raw.update(regions=[]), ["`regions`", "non-empty"]),
    ("bad region name", lambda raw: raw.update(regions=["na", "North America"]),
     ["`regions`", "'North America'"]),
    ("region twice", lambda raw: raw.update(regions=["na", "na"]), ["`regions`", "twice"]),
    ("no modes", lambda raw: raw.pop("modes"), ["`modes`"]),
    ("no boards", lambda raw: raw.update(boards=[]), ["`boards`", "at least one"]),
    ("unknown season kind", _set("calendar", season="monthly"),
     ["`calendar.season`", "'monthly'", "explicit"]),
    ("seasons without explicit", _set("calendar", seasons=[]),
     ["`calendar.seasons`", "explicit"]),
    ("bad all_time_start", _set("calendar", all_time_start="1970"),
     ["`calendar.all_time_start`", "YYYY-MM-DD"]),
    ("explicit seasons overlapping",
     _explicit(("s1", "2026-01-01", "2026-03-02"), ("s2", "2026-03-01", "2026-06-01")),
     ["`calendar.seasons`", "s1", "s2", "overlap"]),
    ("season ending before it starts", _explicit(("s1", "2026-03-01", "2026-01-01")),
     ["`calendar.seasons[0]`", "2026-01-01", "2026-03-01"]),
    ("season id twice",
     _explicit(("s1", "2026-01-01", "2026-02-01"), ("s1", "2026-02-01", "2026-03-01")),
     ["`calendar.seasons`", "twice"]),
    ("bad season id", _explicit(("spring 2026", "2026-01-01", "2026-02-01")),
     ["`calendar.seasons[0].id`"]),
    ("bad season date", _explicit(("s1", "2026-02-30", "2026-03-01")),
     ["`calendar.seasons[0]`", "YYYY-MM-DD"]),
    ("explicit without seasons", _set("calendar", season="explicit"), ["`calendar.seasons`"]),
]


@pytest.mark.parametrize(("mutate", "expected"), [pytest.param(m, e, id=i)
                                                  for i, m, e in BAD_REGISTRIES])
def test_bad_registry_names_the_bad_key(mutate, expected):
    raw = base_registry_raw()
    mutate(raw)
    with pytest.raises(RegistryError) as info:
        parse_registry(raw, source="bad.toml")
    message = str(info.value)
    assert message.startswith("board registry bad.toml: "), "names where it came from"
    for fragment in expected:
        assert fragment in message


@pytest.mark.parametrize(("key", "value"), [("aggregation", "avg"), ("grace", "soon")])
def test_bad_board_default_is_blamed_on_board_defaults(key, value):
    raw = base_registry_raw()
    raw["board_defaults"][key] = value
    with pytest.raises(RegistryError, match=f"`board_defaults.{key}`"):
        parse_registry(raw)


# -- what a registry may say ---------------------------------------------------------------


def test_wildcard_scopes_expand_with_named_patterns(make_registry):
    registry = make_registry(mutate=lambda raw: raw.update(boards=[
        {"scope": "region:*", "name": "top-*"},
        {"scope": "mode:*", "name": "m.*.board", "ties": "earliest", "windows": ["daily"]},
        {"scope": "region:eu", "name": "europe", "aggregation": "max"},
    ]))
    assert [b.name for b in registry.boards] == [
        "top-na", "top-eu", "top-sa", "top-asia",
        "m.ranked.board", "m.casual.board", "m.tournament.board", "europe"]
    assert registry.board("top-sa").applies_to("sa", "casual")
    assert not registry.board("top-sa").applies_to("na", "casual")
    assert registry.board("m.casual.board").ties == "earliest"
    assert registry.board("m.casual.board").windows == ("daily",)
    assert registry.board("europe").scope_value == "eu"
    assert registry.board("europe").aggregation == "max"
    assert registry.board("top-eu").aggregation == "sum", "defaults fill the rest"


def test_windows_are_kept_in_canonical_order(make_registry):
    registry = make_registry(mutate=_board(0, windows=["all-time", "daily", "season"]))
    assert registry.boards[0].windows == ("daily", "season", "all-time")


def test_board_grace_inherits_limits_and_can_be_overridden(make_registry):
    def mutate(raw: dict[str, Any]) -> None:
        raw["limits"]["grace"] = "2d"
        raw["boards"][0]["grace"] = "1h"
        raw["boards"][2]["grace"] = 0

    registry = make_registry(mutate=mutate)
    assert registry.board("global").grace == timedelta(hours=1)
    assert registry.board("region:na").grace == timedelta(days=2)
    assert registry.board("mode:ranked").grace == timedelta(0)
    assert registry.max_grace == timedelta(days=2)


def test_earliest_bounds_at_the_limit_are_accepted(make_registry):
    limit = max_abs_score("earliest", 33)  # all-time, 1970-2200 in seconds
    registry = make_registry(mutate=_set("board_defaults", ties="earliest", aggregation="max",
                                         max_points=limit, min_points=-limit))
    assert registry.board("global").max_points == limit
    assert registry.layout("global", "all-time").unit_us == 1_000_000
    daily = max_abs_score("earliest", 17)
    registry = make_registry(mutate=_set("board_defaults", ties="earliest", windows=["daily"],
                                         max_points=daily))
    assert registry.board("global").max_points == daily == 2**36 - 1


def test_earliest_uses_the_finest_unit_the_bounds_allow(make_registry):
    """Regression (issue 11.4): `earliest` keys counted whole seconds, so two players
    reaching a score within the same second ranked by id. Now the unit is the finest of
    us / ms / s whose key still holds the bounds (times SUM_HEADROOM on sum boards)."""
    registry = make_registry(mutate=_set("board_defaults", ties="earliest", aggregation="max",
                                         max_points=100))
    daily = registry.layout("global", "daily")
    assert (daily.unit_us, daily.time_bits) == (1, 37)  # 86,400,000,000 us < 2^37
    assert daily.limit == 2**16 - 1
    assert registry.layout("global", "all-time").unit_us == 1_000  # 7.26e12 ms < 2^43
    summed = make_registry(mutate=_set("board_defaults", ties="earliest", max_points=10))
    assert summed.layout("global", "daily").unit_us == 1_000  # us: the sum would cap at 65535
    assert summed.layout("global", "all-time").unit_us == 1_000_000
    shared = make_registry().layout("global", "daily")
    assert (shared.time_bits, shared.limit) == (0, 2**53 - 1)


def test_the_football_registry_keys_fit(football_registry):
    """Regression (issue 11.3): all_time_start 1870 with 2^32 s of time bits spilled into
    the score after 2006; the bits now cover 1870 to all_time_end."""
    calendar = football_registry.calendar
    assert calendar.all_time_start == date(1870, 1, 1)
    assert calendar.time_bits("all-time") == 34  # 1870-2200: 1.04e10 s


def test_explicit_seasons(make_registry):
    registry = make_registry(mutate=_explicit(("winter", "2026-01-01", "2026-03-01"),
                                              ("spring", "2026-03-15", "2026-06-01")))
    assert registry.calendar.window("season:spring").start.date() == date(2026, 3, 15)
    assert registry.calendar.window_on("season", date(2026, 3, 5)) is None


# -- the fingerprint -----------------------------------------------------------------------


FINGERPRINT_CHANGES: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
    ("grace", _set("limits", grace="8d")),
    ("future_skew", _set("limits", future_skew="10m")),
    ("retention", _set("limits", retention_days=31)),
    ("ties", _set("board_defaults", ties="earliest")),
    ("order of one board", _board(1, order="asc")),
    ("max_points", _set("board_defaults", max_points=999)),
    ("a region", lambda raw: raw["regions"].append("oce")),
    ("calendar origin", _set("calendar", all_time_start="2000-01-01")),
    ("a board", lambda raw: raw["boards"].pop()),
]


def test_fingerprint_is_stable(registry):
    assert load_registry().fingerprint == registry.fingerprint
    assert parse_registry(base_registry_raw()).fingerprint == registry.fingerprint


def test_fingerprint_changes_when_any_setting_does(registry):
    seen = {registry.fingerprint}
    for name, mutate in FINGERPRINT_CHANGES:
        raw = base_registry_raw()
        mutate(raw)
        fingerprint = parse_registry(raw).fingerprint
        assert fingerprint not in seen, f"changing {name} left the fingerprint unchanged"
        seen.add(fingerprint)


# -- random registries ---------------------------------------------------------------------


@given(raw=registry_raws())
def test_random_registries_are_valid(raw):
    before = copy.deepcopy(raw)
    registry = parse_registry(raw)
    assert raw == before, "parsing does not mutate its input"
    names = [b.name for b in registry.boards]
    assert len(names) == len(set(names))
    for board in registry.boards:
        assert board.windows == tuple(w for w in WINDOW_KINDS if w in board.windows)
        assert board.min_points <= 0 <= board.max_points
        if board.ties == "earliest":
            for window in board.windows:
                limit = max_abs_score("earliest", registry.calendar.time_bits(window))
                assert max(-board.min_points, board.max_points) <= limit
    assert parse_registry(raw).fingerprint == registry.fingerprint
