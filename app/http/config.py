"""What the HTTP app needs beyond `Settings`: credentials, cache times, request limits.

Read once per process from the environment (`HttpConfig.from_env`), so a bad setting stops
`leaderboard serve` at start with the variable's name instead of failing a request later.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from app.http.auth import ApiKeys
from leaderboard.settings import SettingsError
from serving.cache import DEFAULT_MAX_STALE, DEFAULT_TTL

__all__ = ["MAX_BATCH_ROWS", "MAX_BODY_BYTES", "HttpConfig"]

MAX_BATCH_ROWS = 10_000
MAX_BODY_BYTES = 8 * 1024 * 1024


def _seconds(env: Mapping[str, str], name: str, default: float, low: float,
             high: float) -> float:
    text = env.get(name) or ""
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise SettingsError(f"{name}={text!r} is not a number of seconds") from None
    if not low <= value <= high:
        raise SettingsError(f"{name}={text!r} must be between {low:g} and {high:g} seconds")
    return value


@dataclass(frozen=True)
class HttpConfig:
    """What the HTTP app needs beyond `Settings`: credentials, cache times, limits."""

    keys: ApiKeys = field(default_factory=ApiKeys)
    top_ttl: float = DEFAULT_TTL
    top_max_stale: float = DEFAULT_MAX_STALE
    max_batch_rows: int = MAX_BATCH_ROWS
    max_body_bytes: int = MAX_BODY_BYTES
    writer: str = "http"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HttpConfig:
        """LEADERBOARD_API_KEYS (keys file), LEADERBOARD_ADMIN_KEY, LEADERBOARD_TOP_TTL
        (1-5 s, default 2), LEADERBOARD_TOP_STALE (default 60 s)."""
        env = os.environ if env is None else env
        admin = env.get("LEADERBOARD_ADMIN_KEY") or None
        path = env.get("LEADERBOARD_API_KEYS") or None
        if path is not None:
            keys = ApiKeys.load(Path(path), admin_key=admin)
        else:
            keys = ApiKeys.parse({}, source="(no LEADERBOARD_API_KEYS)", admin_key=admin)
        ttl = _seconds(env, "LEADERBOARD_TOP_TTL", DEFAULT_TTL, 1.0, 5.0)
        stale = _seconds(env, "LEADERBOARD_TOP_STALE", DEFAULT_MAX_STALE, ttl, 3600.0)
        return cls(keys=keys, top_ttl=ttl, top_max_stale=stale)
