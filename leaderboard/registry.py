"""The board registry: which boards exist, their windows, aggregation, order and tie policy.

Loaded from TOML (the shipped `default` registry unless LEADERBOARD_CONFIG names another), and
validated up front so that a bad key is reported with its name and why, never mid-pipeline.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from dataclasses import dataclass, field
from datetime import date, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

from leaderboard.calendar import ALL_TIME_END, WINDOW_KINDS, Calendar, Season, WindowError
from leaderboard.sortkey import UNITS_US, KeyLayout, choose_layout
from leaderboard.timeutil import parse_duration

__all__ = [
    "AGGREGATIONS",
    "ORDERS",
    "SOURCES",
    "TIE_POLICIES",
    "Board",
    "Registry",
    "RegistryError",
    "load_registry",
    "shipped_registries",
]

AGGREGATIONS = ("sum", "max", "min", "last")
ORDERS = ("desc", "asc")
TIE_POLICIES = ("shared", "earliest")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
_BOARD_NAME = re.compile(r"^[a-z0-9][a-z0-9_.:-]{0,63}$")
_SEASON_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")
_BOARD_KEYS = {"scope", "name", "windows", "aggregation", "order", "ties", "min_points",
               "max_points", "grace", "source"}
#: Where a board's rows come from: match events (by its scope), or direct score submissions
#: (`POST /v1/boards/{board}/scores`), never both.
SOURCES = ("events", "direct")
_TOP_KEYS = {"regions", "modes", "calendar", "limits", "board_defaults", "boards"}


class RegistryError(ValueError):
    """A registry that cannot be used; the message names the key and what to change."""


@dataclass(frozen=True)
class Board:
    """One board: a scope of events and how they rank in each of its windows."""

    name: str
    scope: str  # "global" | "region" | "mode" | "board" (a direct board: only its own scores)
    scope_value: str | None
    windows: tuple[str, ...]
    aggregation: str
    order: str
    ties: str
    min_points: int
    max_points: int
    grace: timedelta
    #: "events" (fed by match events of its scope) or "direct" (fed by score submissions).
    source: str = "events"

    @property
    def direct(self) -> bool:
        return self.source == "direct"

    @property
    def mixed_sum(self) -> bool:
        """A `sum` board whose points may be of either sign: its total can pass the key's
        limit and come back, so its score is the exact total clamped once, which the speed
        layer keeps per player beside the clamped key (speed_layer.fold)."""
        return self.aggregation == "sum" and self.min_points < 0 < self.max_points

    @property
    def score_field(self) -> str:
        """What a submission to a direct board carries: `delta` (added to the player's
        total) for a sum board, `score` for a max|min|last board."""
        return "delta" if self.aggregation == "sum" else "score"

    @property
    def scope_key(self) -> str:
        """What the batch's explode step matches rows on: `global`, `region:<r>`, `mode:<m>`,
        or `board:<name>` for a direct board (only its own scores carry that key)."""
        return "global" if self.scope == "global" else f"{self.scope}:{self.scope_value}"

    def applies_to(self, region: str, mode: str) -> bool:
        """Whether a match event of (region, mode) counts on this board (never a direct one)."""
        if self.direct:
            return False
        if self.scope == "global":
            return True
        if self.scope == "region":
            return region == self.scope_value
        return mode == self.scope_value


@dataclass(frozen=True)
class Registry:
    """The validated registry; `fingerprint` changes whenever any setting does."""

    regions: tuple[str, ...]
    modes: tuple[str, ...]
    boards: tuple[Board, ...]
    calendar: Calendar
    future_skew: timedelta
    idempotency_horizon: timedelta
    retention_days: int
    source: str
    fingerprint: str = field(default="")
    #: More events than this from one player in one landing minute are held in quarantine
    #: (reason implausible_rate) instead of counting; None: no limit.
    player_events_per_minute: int | None = None
    #: (board name, window kind) -> its sort-key layout, fixed at load.
    layouts: dict[tuple[str, str], KeyLayout] = field(default_factory=dict, compare=False,
                                                      repr=False)

    def board(self, name: str) -> Board:
        for board in self.boards:
            if board.name == name:
                return board
        known = ", ".join(b.name for b in self.boards)
        raise RegistryError(f"unknown board {name!r}; the registry ({self.source}) has: {known}")

    def boards_for(self, region: str, mode: str) -> list[Board]:
        return [b for b in self.boards if b.applies_to(region, mode)]

    def layout(self, board: Board | str, kind: str) -> KeyLayout:
        """The sort-key layout of a board's windows of `kind` (time bits, unit, limit)."""
        name = board if isinstance(board, str) else board.name
        found = self.layouts.get((name, kind))
        if found is None:
            raise RegistryError(f"board {name!r} has no {kind} window in {self.source}")
        return found

    @property
    def max_grace(self) -> timedelta:
        return max(b.grace for b in self.boards)


def shipped_registries() -> list[str]:
    """Names of the registries shipped in the package (usable as LEADERBOARD_CONFIG)."""
    folder = resources.files("leaderboard") / "registries"
    return sorted(p.name.removesuffix(".toml") for p in folder.iterdir()
                  if p.name.endswith(".toml"))


def load_registry(config: str | Path | None = None) -> Registry:
    """Load and validate a registry: a TOML path, a shipped name, or None for `default`."""
    if config is None or str(config) in shipped_registries():
        name = "default" if config is None else str(config)
        resource = resources.files("leaderboard") / "registries" / f"{name}.toml"
        text = resource.read_text(encoding="utf-8")
        source = f"shipped registry {name!r}"
    else:
        path = Path(config)
        if not path.is_file():
            raise RegistryError(
                f"board registry {str(path)!r} does not exist; set LEADERBOARD_CONFIG to a TOML "
                f"file or one of the shipped names ({', '.join(shipped_registries())})"
            )
        text = path.read_text(encoding="utf-8")
        source = str(path)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RegistryError(f"board registry {source} is not valid TOML: {exc}") from None
    return parse_registry(raw, source=source)


def _fail(source: str, key: str, why: str) -> RegistryError:
    return RegistryError(f"board registry {source}: `{key}` {why}")


def _names(raw: dict[str, Any], key: str, source: str) -> tuple[str, ...]:
    values = raw.get(key)
    if not isinstance(values, list) or not values:
        raise _fail(source, key, "must be a non-empty list of names")
    for value in values:
        if not isinstance(value, str) or not _NAME.match(value):
            raise _fail(source, key, f"has {value!r}: names are 1-32 chars of [a-z0-9_-]")
    if len(set(values)) != len(values):
        raise _fail(source, key, "lists a name twice")
    return tuple(values)


def _duration(table: dict[str, Any], key: str, default: str, source: str,
              prefix: str) -> timedelta:
    try:
        return parse_duration(table.get(key, default), what=f"{prefix}{key}")
    except ValueError as exc:
        raise _fail(source, f"{prefix}{key}", f"is invalid: {exc}") from None


def _calendar(raw: dict[str, Any], source: str) -> Calendar:
    table = raw.get("calendar", {})
    if not isinstance(table, dict):
        raise _fail(source, "calendar", "must be a table")
    unknown = set(table) - {"season", "seasons", "all_time_start", "all_time_end"}
    if unknown:
        raise _fail(source, f"calendar.{sorted(unknown)[0]}", "is not a known key")
    try:
        origin = date.fromisoformat(str(table.get("all_time_start", "1970-01-01")))
    except ValueError:
        raise _fail(source, "calendar.all_time_start", "must be a date YYYY-MM-DD") from None
    try:
        horizon = date.fromisoformat(str(table.get("all_time_end", ALL_TIME_END.isoformat())))
    except ValueError:
        raise _fail(source, "calendar.all_time_end", "must be a date YYYY-MM-DD") from None
    if horizon <= origin:
        raise _fail(source, "calendar.all_time_end",
                    f"({horizon}) must be after calendar.all_time_start ({origin})")
    kind = table.get("season", "quarterly")
    if kind == "quarterly":
        if "seasons" in table:
            raise _fail(source, "calendar.seasons", "needs calendar.season = \"explicit\"")
        return Calendar(None, origin, horizon)
    if kind != "explicit":
        raise _fail(source, "calendar.season", f"is {kind!r}; use \"quarterly\" or \"explicit\"")
    seasons_raw = table.get("seasons")
    if not isinstance(seasons_raw, list) or not seasons_raw:
        raise _fail(source, "calendar.seasons", "must list seasons as {id, start, end}")
    seasons = []
    for index, item in enumerate(seasons_raw):
        where = f"calendar.seasons[{index}]"
        if not isinstance(item, dict) or set(item) != {"id", "start", "end"}:
            raise _fail(source, where, "must have exactly the keys id, start, end")
        if not isinstance(item["id"], str) or not _SEASON_ID.match(item["id"]):
            raise _fail(source, f"{where}.id", "must be 1-32 chars of [A-Za-z0-9_.-]")
        try:
            start = date.fromisoformat(str(item["start"]))
            end = date.fromisoformat(str(item["end"]))
        except ValueError:
            raise _fail(source, where, "start and end must be dates YYYY-MM-DD") from None
        if end <= start:
            raise _fail(source, where, f"ends ({end}) on or before it starts ({start})")
        seasons.append(Season(item["id"], start, end))
    if len({s.id for s in seasons}) != len(seasons):
        raise _fail(source, "calendar.seasons", "uses a season id twice")
    try:
        return Calendar(tuple(seasons), origin, horizon)
    except WindowError as exc:
        raise _fail(source, "calendar.seasons", str(exc)) from None


def _board_settings(table: dict[str, Any], base: dict[str, Any], source: str,
                    where: str) -> dict[str, Any]:
    merged = dict(base)
    merged.update({k: v for k, v in table.items() if k not in ("scope", "name", "source")})

    def key_of(key: str) -> str:
        """Where a setting was written: the board, or [board_defaults] it inherits."""
        return f"{where}.{key}" if key in table or key not in base else f"board_defaults.{key}"

    windows = merged.get("windows", list(WINDOW_KINDS))
    if not isinstance(windows, list) or not windows:
        raise _fail(source, key_of("windows"), "must be a non-empty list")
    for window in windows:
        if window not in WINDOW_KINDS:
            raise _fail(source, key_of("windows"),
                        f"has {window!r}; windows are {', '.join(WINDOW_KINDS)}")
    if len(set(windows)) != len(windows):
        raise _fail(source, key_of("windows"), "lists a window twice")
    for key, allowed, default in (("aggregation", AGGREGATIONS, "sum"),
                                  ("order", ORDERS, "desc"), ("ties", TIE_POLICIES, "shared")):
        value = merged.get(key, default)
        if value not in allowed:
            raise _fail(source, key_of(key), f"is {value!r}; use one of {', '.join(allowed)}")
        merged[key] = value
    for key, default_bound in (("min_points", 0), ("max_points", 1000)):
        bound = merged.get(key, default_bound)
        if isinstance(bound, bool) or not isinstance(bound, int):
            raise _fail(source, key_of(key), f"is {bound!r}; it must be an integer")
        merged[key] = bound
    if merged["min_points"] > merged["max_points"]:
        bounds_from = ("board_defaults" if not {"min_points", "max_points"} & set(table)
                       else where)
        raise _fail(source, bounds_from, f"has min_points {merged['min_points']} > max_points "
                                         f"{merged['max_points']}")
    merged["windows"] = tuple(w for w in WINDOW_KINDS if w in windows)
    return merged


def parse_registry(raw: dict[str, Any], *, source: str = "<dict>") -> Registry:
    """Validate a registry already parsed from TOML (tests build registries this way)."""
    unknown = set(raw) - _TOP_KEYS
    if unknown:
        raise _fail(source, sorted(unknown)[0], f"is not a known key (known: {sorted(_TOP_KEYS)})")
    regions = _names(raw, "regions", source)
    modes = _names(raw, "modes", source)
    calendar = _calendar(raw, source)
    limits = raw.get("limits", {})
    if not isinstance(limits, dict):
        raise _fail(source, "limits", "must be a table")
    unknown = set(limits) - {"grace", "future_skew", "idempotency_horizon", "retention_days",
                             "player_events_per_minute"}
    if unknown:
        raise _fail(source, f"limits.{sorted(unknown)[0]}", "is not a known key")
    _duration(limits, "grace", "7d", source, "limits.")  # checked here; boards default to it
    future_skew = _duration(limits, "future_skew", "5m", source, "limits.")
    horizon = _duration(limits, "idempotency_horizon", "24h", source, "limits.")
    retention = limits.get("retention_days", 30)
    if isinstance(retention, bool) or not isinstance(retention, int) or retention < 1:
        raise _fail(source, "limits.retention_days", f"is {retention!r}; use a whole number >= 1")
    per_minute = limits.get("player_events_per_minute")
    if per_minute is not None and (isinstance(per_minute, bool) or not isinstance(per_minute, int)
                                   or per_minute < 1):
        raise _fail(source, "limits.player_events_per_minute",
                    f"is {per_minute!r}; use a whole number of events >= 1 (or leave it out: "
                    "no limit)")
    defaults = raw.get("board_defaults", {})
    if not isinstance(defaults, dict):
        raise _fail(source, "board_defaults", "must be a table")
    unknown = set(defaults) - _BOARD_KEYS
    if unknown or {"scope", "name", "source"} & set(defaults):
        bad = sorted(unknown | ({"scope", "name", "source"} & set(defaults)))[0]
        raise _fail(source, f"board_defaults.{bad}", "is not a board default")
    boards_raw = raw.get("boards")
    if not isinstance(boards_raw, list) or not boards_raw:
        raise _fail(source, "boards", "must list at least one [[boards]] entry")
    boards: list[Board] = []
    for index, entry in enumerate(boards_raw):
        where = f"boards[{index}]"
        if not isinstance(entry, dict):
            raise _fail(source, where, "must be a table")
        unknown = set(entry) - _BOARD_KEYS
        if unknown:
            raise _fail(source, f"{where}.{sorted(unknown)[0]}", "is not a known board key")
        settings = _board_settings(entry, defaults, source, where)
        grace_key = ("board_defaults.grace" if "grace" not in entry and "grace" in defaults
                     else f"{where}.grace")
        # TOML gives any type here; parse_duration refuses what is not a duration.
        grace_raw: Any = settings.get("grace", limits.get("grace", "7d"))
        try:
            board_grace = parse_duration(grace_raw, what=grace_key)
        except ValueError as exc:
            raise _fail(source, grace_key, f"is invalid: {exc}") from None
        source_kind = entry.get("source", "events")
        if source_kind not in SOURCES:
            raise _fail(source, f"{where}.source",
                        f"is {source_kind!r}; use one of {', '.join(SOURCES)}")
        if source_kind == "direct":
            name = entry.get("name")
            if "scope" in entry:
                raise _fail(source, f"{where}.scope", "is not for a direct board (it takes only "
                            "its own score submissions); remove it")
            if not isinstance(name, str) or not _BOARD_NAME.match(name):
                raise _fail(source, f"{where}.name", "is required for a direct board: 1-64 "
                            "chars of [a-z0-9_.:-]")
            boards.append(Board(
                name=name, scope="board", scope_value=name,
                windows=settings["windows"], aggregation=settings["aggregation"],
                order=settings["order"], ties=settings["ties"],
                min_points=settings["min_points"], max_points=settings["max_points"],
                grace=board_grace, source="direct",
            ))
            continue
        scope = entry.get("scope")
        if not isinstance(scope, str):
            raise _fail(source, f"{where}.scope", "is missing; use global, region:<r> or mode:<m>")
        kind, _, value = scope.partition(":")
        if scope == "global":
            expansions: list[tuple[str, str | None]] = [("global", None)]
        elif kind in ("region", "mode") and value:
            known = regions if kind == "region" else modes
            if value == "*":
                expansions = [(kind, v) for v in known]
            elif value in known:
                expansions = [(kind, value)]
            else:
                raise _fail(source, f"{where}.scope", f"names {kind} {value!r}, which is not "
                            f"in `{kind}s` ({', '.join(known)})")
        else:
            raise _fail(source, f"{where}.scope",
                        f"is {scope!r}; use global, region:<r>, region:*, mode:<m> or mode:*")
        name_pattern = entry.get("name")
        for scope_kind, scope_value in expansions:
            default_name = "global" if scope_value is None else f"{scope_kind}:{scope_value}"
            if name_pattern is None:
                name = default_name
            elif not isinstance(name_pattern, str):
                raise _fail(source, f"{where}.name", "must be a string")
            elif value == "*":
                if "*" not in name_pattern:
                    raise _fail(source, f"{where}.name", "needs a * for a wildcard scope")
                name = name_pattern.replace("*", scope_value or "")
            else:
                name = name_pattern
            if not _BOARD_NAME.match(name):
                raise _fail(source, f"{where}.name",
                            f"gives {name!r}; board names are 1-64 chars of [a-z0-9_.:-]")
            boards.append(Board(
                name=name, scope=scope_kind, scope_value=scope_value,
                windows=settings["windows"], aggregation=settings["aggregation"],
                order=settings["order"], ties=settings["ties"],
                min_points=settings["min_points"], max_points=settings["max_points"],
                grace=board_grace,
            ))
    seen: dict[str, int] = {}
    for board in boards:
        if board.name in seen:
            raise _fail(source, "boards", f"defines board {board.name!r} twice; give one a `name`")
        seen[board.name] = 1
    layouts: dict[tuple[str, str], KeyLayout] = {}
    for board in boards:
        for window in board.windows:
            try:
                layouts[(board.name, window)] = choose_layout(
                    ties=board.ties, aggregation=board.aggregation,
                    min_points=board.min_points, max_points=board.max_points,
                    bits_for_unit={u: calendar.time_bits(window, u) for u in UNITS_US})
            except ValueError as exc:
                fix = ("lower the bounds, shorten the window (calendar.all_time_end, seasons)"
                       " or use ties=shared" if board.ties == "earliest"
                       else "lower the bounds")
                raise _fail(source, f"boards.{board.name}",
                            f"cannot rank its {window} window exactly with ties={board.ties}: "
                            f"it {exc}; {fix}"
                            ) from None
    fingerprint_source = json.dumps(raw, sort_keys=True, default=str)
    registry = Registry(
        regions=regions, modes=modes, boards=tuple(boards), calendar=calendar,
        future_skew=future_skew, idempotency_horizon=horizon, retention_days=retention,
        source=source, player_events_per_minute=per_minute,
        fingerprint=hashlib.sha256(fingerprint_source.encode()).hexdigest()[:16],
        layouts=layouts,
    )
    return registry

