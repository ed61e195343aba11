"""The Redis key schema of the speed layer, shared by the speed and serving layers.

Per batch version V and board-window k, every key carries the hash tag `{board|window_id}`,
so a board-window lives in one Redis Cluster slot and every script touches one slot:
`lb:{k}:V:M` merged keys (zset), `:T` base keys of touched players (zset), `:C` the
files folded here past each writer's floor (hash), `:L` last-event marks for `last` boards
(hash), `:B` banned players (set). Global keys: `lb:current` (version pointer, JSON),
`lb:banned` (set), `lb:V:progress` (per writer: a floor every events file up to which is
folded everywhere, and the files folded past it), `lb:V:windows` (set of touched k),
`lb:V:bans` (players whose ban is applied in V's state).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import redis
from redis.retry import Retry

from leaderboard.settings import Settings

__all__ = [
    "BANNED",
    "BANS_GENERATION",
    "COMMAND_TIMEOUT",
    "CONNECT_TIMEOUT",
    "CURRENT",
    "BoardWindowKeys",
    "SpeedVersion",
    "bans_key",
    "connect",
    "progress_key",
    "read_current_version",
    "version_tag",
    "windows_key",
]

CURRENT = "lb:current"
BANNED = "lb:banned"
#: Counts changes of BANNED (same Cluster slot: its hash tag is BANNED's whole name), so a
#: fold that read the set can tell whether a ban or unban ran meanwhile.
BANS_GENERATION = "{lb:banned}:generation"


def version_tag(version: str | None) -> str:
    """A short, stable tag for a batch version id (`2026-12-01.<stamp>.<hex>` -> `20261201a1b2c3`);
    `none` before the first batch."""
    if not version:
        return "none"
    as_of, _, rest = version.partition(".")
    return as_of.replace("-", "") + rest.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class SpeedVersion:
    """What `lb:current` says: the batch version whose base the speed state extends."""

    version: str | None
    watermark: datetime | None  # None before the first batch: every event is speed

    @property
    def tag(self) -> str:
        return version_tag(self.version)

    def to_json(self) -> str:
        return json.dumps({"version": self.version,
                           "watermark": None if self.watermark is None
                           else self.watermark.isoformat()})

    @classmethod
    def from_json(cls, text: str | bytes) -> SpeedVersion:
        data = json.loads(text)
        mark = data.get("watermark")
        return cls(data.get("version"), None if mark is None else datetime.fromisoformat(mark))


@dataclass(frozen=True)
class BoardWindowKeys:
    board: str
    window_id: str
    tag: str

    @property
    def prefix(self) -> str:
        return f"lb:{{{self.board}|{self.window_id}}}:{self.tag}"

    @property
    def merged(self) -> str:
        return f"{self.prefix}:M"

    @property
    def touched(self) -> str:
        return f"{self.prefix}:T"

    @property
    def checkpoints(self) -> str:
        return f"{self.prefix}:C"

    @property
    def last_marks(self) -> str:
        return f"{self.prefix}:L"

    @property
    def banned(self) -> str:
        return f"{self.prefix}:B"

    def all(self) -> list[str]:
        return [self.merged, self.touched, self.checkpoints, self.last_marks, self.banned]


def progress_key(tag: str) -> str:
    return f"lb:{tag}:progress"


def bans_key(tag: str) -> str:
    """The players whose ban is applied in version `tag`'s state (hidden from M, in T, B)."""
    return f"lb:{tag}:bans"


def windows_key(tag: str) -> str:
    return f"lb:{tag}:windows"


#: Seconds a command may take before the client gives up (the longest are the rebase's and
#: rebuild's pipelined scripts), and seconds to open a connection.
COMMAND_TIMEOUT = 60.0
CONNECT_TIMEOUT = 5.0


def connect(settings: Settings, *, timeout: float = COMMAND_TIMEOUT,
            connect_timeout: float = CONNECT_TIMEOUT, retry: Retry | None = None) -> redis.Redis:
    """The one way every layer builds its Redis client: REDIS_URL, or the local server kept
    under the data dir (started on first use, followed to another port if it is restarted
    there). RESP2 pinned (the layers depend on reply shapes), bytes replies, and timeouts
    always, so a Redis that stops answering fails the caller instead of hanging it. `retry`:
    redis-py's default unless given (the HTTP app retries once, without backoff)."""
    options: dict[str, Any] = {"protocol": 2, "decode_responses": False,
                               "socket_timeout": timeout,
                               "socket_connect_timeout": connect_timeout}
    if retry is not None:
        options["retry"] = retry
    if settings.redis_url is None:
        from leaderboard.redis_server import local_server_client

        return local_server_client(settings.data_dir, **options)
    return redis.Redis.from_url(settings.redis_url, **options)


def read_current_version(client: redis.Redis) -> SpeedVersion | None:
    raw = client.get(CURRENT)
    return None if raw is None else SpeedVersion.from_json(raw)
