"""Redis servers under a locale whose collation is not byte order (Lua's string `<` is
`strcoll`): what the fixtures check before a test relies on one."""

from __future__ import annotations

import os
from typing import Any

from leaderboard.redis_server import LOCALE_VAR, EmbeddedRedis

__all__ = ["NON_C_LOCALE", "collates_as_bytes", "start_checked"]

#: A locale whose collation is not byte order ('a' sorts before 'B'); the servers of a run
#: with LEADERBOARD_TEST_REDIS_LOCALE=en_US.UTF-8 (CI's) run under it.
NON_C_LOCALE = "en_US.UTF-8"


def collates_as_bytes(client: Any) -> bool:
    """Whether the server's Lua orders text as bytes ('B' < 'a', the C locale) rather than by
    a locale's collation (en_US.UTF-8 puts 'a' first)."""
    return bool(client.eval("if 'B' < 'a' then return 1 end return 0", 0) == 1)


def start_checked(locale: str | None) -> EmbeddedRedis:
    """An EmbeddedRedis started under `locale` (None: LEADERBOARD_TEST_REDIS_LOCALE's, else
    C); RuntimeError (the server stopped) where it was asked for a non-C locale and still
    collates as bytes: the locale is not installed (Redis then falls back to C silently), and
    the run would not test what it says."""
    server = EmbeddedRedis(locale=locale).start()
    try:
        _check_locale(server, locale or os.environ.get(LOCALE_VAR))
    except RuntimeError:
        server.stop()
        raise
    return server


def _check_locale(server: EmbeddedRedis, locale: str | None) -> None:
    import redis

    if not locale or locale in ("C", "POSIX") or locale.upper().startswith("C."):
        return
    client = redis.Redis.from_url(server.url, protocol=2)
    try:
        if collates_as_bytes(client):
            raise RuntimeError(
                f"the test Redis was started under LC_ALL={locale} but compares text as "
                f"bytes: the locale is not installed here; install it (as root, "
                f"scripts/ensure_locale.sh installs {NON_C_LOCALE}), or unset "
                f"LEADERBOARD_TEST_REDIS_LOCALE")
    finally:
        client.close()
