"""Settings, the same everywhere (CLI, jobs, DAG, server): environment first, flags override.

LEADERBOARD_DATA     data dir (default ./data)
LEADERBOARD_CONFIG   board registry: a TOML path or a shipped name (default: `default`)
REDIS_URL            Redis/Valkey URL; unset means an embedded local server under the data dir
LEADERBOARD_ENGINE   batch engine: duckdb (default) | spark
LEADERBOARD_NOW      ISO 8601 instant that replaces the wall clock everywhere (tests, demos)
LEADERBOARD_BASE_CACHE_BYTES  bound on the base arrays a serving process keeps (default 512MiB)
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path

from leaderboard.registry import Registry, load_registry
from leaderboard.timeutil import parse_instant

__all__ = ["DEFAULT_BASE_CACHE_BYTES", "ENGINES", "Settings", "SettingsError", "parse_bytes"]

ENGINES = ("duckdb", "spark")

#: 512 MiB: about 17 million players at ~30 bytes each (one very large board, or thousands
#: of small windows), well below a serving host's memory.
DEFAULT_BASE_CACHE_BYTES = 512 * 1024 * 1024

_UNITS = {"": 1, "b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3}


class SettingsError(ValueError):
    """A setting with a bad value; the message names the variable and what to use."""


@dataclass(frozen=True)
class Settings:
    data_dir: Path
    config: str | None
    redis_url: str | None
    engine: str
    now_override: datetime | None
    base_cache_bytes: int = DEFAULT_BASE_CACHE_BYTES

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Read the environment; keyword overrides (from CLI flags) win when not None."""
        env = os.environ if env is None else env
        now_text = env.get("LEADERBOARD_NOW") or None
        try:
            now_override = parse_instant(now_text, what="LEADERBOARD_NOW") if now_text else None
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
        settings = cls(
            data_dir=Path(env.get("LEADERBOARD_DATA") or "data"),
            config=env.get("LEADERBOARD_CONFIG") or None,
            redis_url=env.get("REDIS_URL") or None,
            engine=(env.get("LEADERBOARD_ENGINE") or "duckdb").lower(),
            now_override=now_override,
            base_cache_bytes=parse_bytes(env.get("LEADERBOARD_BASE_CACHE_BYTES") or "",
                                         "LEADERBOARD_BASE_CACHE_BYTES",
                                         DEFAULT_BASE_CACHE_BYTES),
        )
        given = {k: v for k, v in overrides.items() if v is not None}
        if isinstance(given.get("data_dir"), str):
            given["data_dir"] = Path(str(given["data_dir"]))
        if isinstance(given.get("now_override"), str):
            try:
                given["now_override"] = parse_instant(str(given["now_override"]), what="--now")
            except ValueError as exc:
                raise SettingsError(str(exc)) from None
        if isinstance(given.get("engine"), str):
            given["engine"] = str(given["engine"]).lower()
        settings = replace(settings, **given)  # type: ignore[arg-type]
        if settings.engine not in ENGINES:
            where = "--engine " if "engine" in given else "LEADERBOARD_ENGINE="
            raise SettingsError(
                f"{where}{settings.engine!r} is not an engine; use duckdb or spark"
            )
        return settings

    def now(self) -> datetime:
        """The clock: LEADERBOARD_NOW when set, else the wall clock (UTC)."""
        return self.now_override if self.now_override is not None else datetime.now(UTC)

    @cached_property
    def registry(self) -> Registry:
        return load_registry(self.config)

    @property
    def lake_dir(self) -> Path:
        return self.data_dir / "lake"


def parse_bytes(text: str, name: str, default: int) -> int:
    """A size setting: whole bytes, or a number with KiB, MiB or GiB ("512MiB")."""
    raw = text.strip()
    if not raw:
        return default
    digits = raw.rstrip("BbKkIiMmGg ")
    unit = raw[len(digits):].strip().lower()
    try:
        value = float(digits)
    except ValueError:
        value = -1.0
    if unit not in _UNITS or not (math.isfinite(value) and value >= 0):
        raise SettingsError(f"{name}={text!r} is not a size; give whole bytes or e.g. 512MiB")
    return int(value * _UNITS[unit])
