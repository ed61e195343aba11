"""The Redis key schema of the speed layer, shared by the speed and serving layers.

Per batch version V and board-window k, every key carries the hash tag `{board|window_id}`,
so a board-window lives in one Redis Cluster slot and every script touches one slot:
`lb:{k}:V:M` merged keys (zset), `:T` base keys of touched players (zset), `:C` the
files folded here past each writer's floor (hash), `:L` last-event marks for `last` boards
(hash), `:B` banned players (set). Global keys: `lb:current` (version pointer, JSON),
`lb:banned` (set), `lb:V:progress` (per writer: a floor every events file up to which is
folded everywhere, and the files folded past it), `lb:V:windows` (set of touched k),
`lb:V:bans` (players whose ban is applied in V's state), `{lb:banned}:voids` (hash: match_id
-> the voided players, `*` for all), `lb:V:voids` (voids applied to V's base part).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.retry import Retry

from leaderboard.lake import landed_files
from leaderboard.manifest import read_current
from leaderboard.settings import Settings

__all__ = [
    "BANNED",
    "BANS_GENERATION",
    "CLUSTER_SCHEMES",
    "COMMAND_TIMEOUT",
    "CONNECT_TIMEOUT",
    "CURRENT",
    "VOIDS",
    "BoardWindowKeys",
    "SpeedVersion",
    "StateLost",
    "bans_key",
    "connect",
    "progress_key",
    "read_current_version",
    "read_live_version",
    "state_needed",
    "version_tag",
    "voids_key",
    "windows_key",
]

CURRENT = "lb:current"
BANNED = "lb:banned"
#: Counts changes of BANNED (same Cluster slot: its hash tag is BANNED's whole name), so a
#: fold that read the set can tell whether a ban or unban ran meanwhile.
BANS_GENERATION = "{lb:banned}:generation"
#: The lake's voids (hash: match_id -> voided player ids joined by newlines, `*`: the whole
#: match), in BANS_GENERATION's slot: a void changes both in one transaction, so a fold that
#: read the voids of its file can tell whether a void ran meanwhile.
VOIDS = "{lb:banned}:voids"


def version_tag(version: str | None) -> str:
    """A short, stable tag for a batch version id (`2026-12-01.<stamp>.<hex>` -> `20261201a1b2c3`);
    `none` before the first batch."""
    if not version:
        return "none"
    as_of, _, rest = version.partition(".")
    return as_of.replace("-", "") + rest.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class SpeedVersion:
    """What `lb:current` says: the batch version whose base the speed state extends, and
    the state's epoch (a token written with the state when it is built; a state without it
    lost its past, or predates the epoch, and is rebuilt before use)."""

    version: str | None
    watermark: datetime | None  # None before the first batch: every event is speed
    epoch: str | None = None

    @property
    def tag(self) -> str:
        return version_tag(self.version)

    def to_json(self) -> str:
        return json.dumps({"version": self.version,
                           "watermark": None if self.watermark is None
                           else self.watermark.isoformat(), "epoch": self.epoch})

    @classmethod
    def from_json(cls, text: str | bytes) -> SpeedVersion:
        data = json.loads(text)
        mark = data.get("watermark")
        return cls(data.get("version"), None if mark is None else datetime.fromisoformat(mark),
                   data.get("epoch"))

    def with_epoch(self, epoch: str | None = None) -> SpeedVersion:
        """This version with `epoch`, or with a new one."""
        return replace(self, epoch=epoch or uuid.uuid4().hex)


class StateLost(redis.RedisError):
    """The speed state is gone (Redis lost its data: a flush, a restart without its AOF) or
    was never built while the lake holds events it must hold. It is neither served as
    merged truth nor folded onto until rebuilt."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"{detail}; rebuild it from the lake with `leaderboard speed "
                         "rebuild` (a running `leaderboard serve` starts that itself)")


def state_needed(lake: Path, watermark: datetime | None, *, margin: timedelta = timedelta(0)
                 ) -> bool:
    """Whether the lake holds landed events a speed state must hold: a file that may hold
    rows ingested at or after `watermark - margin` (a file sits in its landing day's
    partition, so a partition from that day on), or any file before the first batch."""
    since = None if watermark is None else (watermark - margin).date()
    return any(since is None or f.ingest_date >= since for f in landed_files(lake))


def read_live_version(client: redis.Redis, lake: Path, *, margin: timedelta = timedelta(0)
                      ) -> SpeedVersion | None:
    """The live speed version: the pointer with its epoch; None when no state was ever
    needed (no pointer and nothing in the lake since `margin` before the published
    watermark: readers need the events since the watermark, writers the door's record of
    the idempotency horizons before it too). Raises StateLost when the state is gone or
    predates the epoch: the one rule of a lost state, for readers and writers alike."""
    found = read_current_version(client)
    if found is not None and found.epoch:
        return found
    if found is not None:
        raise StateLost("the speed state predates its epoch record (written by an older "
                        "release)")
    manifest = read_current(lake)
    watermark = None if manifest is None else manifest.watermark_at
    if state_needed(lake, watermark, margin=margin):
        raise StateLost("the speed state is missing from Redis (its version pointer is gone) "
                        "while the lake holds events since the watermark" + (
                            " or within the idempotency horizon" if margin else ""))
    return None


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


def voids_key(tag: str) -> str:
    """The voids (`match NUL player|*`) applied to version `tag`'s base part: voids the
    batch of that version had not seen (at or after its watermark)."""
    return f"lb:{tag}:voids"


def windows_key(tag: str) -> str:
    return f"lb:{tag}:windows"


#: Seconds a command may take before the client gives up (the longest are the rebase's and
#: rebuild's pipelined scripts), and seconds to open a connection.
COMMAND_TIMEOUT = 60.0
CONNECT_TIMEOUT = 5.0


#: REDIS_URL schemes that name a Redis Cluster (any one node: the client finds the rest), and
#: the plain scheme each stands for.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def connect(settings: Settings, *, timeout: float = COMMAND_TIMEOUT,
            connect_timeout: float = CONNECT_TIMEOUT, retry: Retry | None = None) -> redis.Redis:
    """The one way every layer builds its Redis client: REDIS_URL, or the local server kept
    under the data dir (started on first use, followed to another port if it is restarted
    there). RESP2 pinned (the layers depend on reply shapes), bytes replies, and timeouts
    always, so a Redis that stops answering fails the caller instead of hanging it. `retry`:
    redis-py's default unless given (the HTTP app retries once, without backoff).

    `redis+cluster://host:port` (or `rediss+cluster://`) is a Redis Cluster: redis-py's
    cluster client, which routes each command by its key's slot. Every script and MULTI of
    the layers keeps its keys in one slot (hash tags, see the module docstring), and the
    multi-node commands they use (SCAN, SCRIPT LOAD, multi-key DEL) are fanned out by the
    client. It is typed as `redis.Redis` on purpose: it answers the same commands the layers
    send, and one client type keeps every signature of the layers unchanged."""
    options: dict[str, Any] = {"protocol": 2, "decode_responses": False,
                               "socket_timeout": timeout,
                               "socket_connect_timeout": connect_timeout}
    if retry is not None:
        options["retry"] = retry
    if settings.redis_url is None:
        from leaderboard.redis_server import local_server_client

        return local_server_client(settings.data_dir, **options)
    scheme, sep, rest = settings.redis_url.partition("://")
    if sep and scheme.lower() in CLUSTER_SCHEMES:
        url = f"{CLUSTER_SCHEMES[scheme.lower()]}://{rest}"
        return RedisCluster.from_url(url, **options)  # type: ignore[return-value]
    return redis.Redis.from_url(settings.redis_url, **options)


def read_current_version(client: redis.Redis) -> SpeedVersion | None:
    raw = client.get(CURRENT)
    return None if raw is None else SpeedVersion.from_json(raw)
