"""Erasing a player everywhere (GDPR right to erasure): the composition of the layers' parts.

Order: the ledger (the id's salted hash: ingest refuses the id from then on) and the lake's
files (`jobs.erase`); the live version re-published under a new version id with the same
files (every serving process keys its base arrays by version id, so all of them drop the
cached arrays that held the player within a second); the speed state rebuilt on it from the
erased lake by a rebase; then, once every server has had time to follow the pointer to it
(`settle`: the longest a server reuses a pointer it read), every other version's keys and
the keys naming the id deleted (`SpeedLayer.erase`), so no server answers from an old
version's base arrays or from its deleted keys; the warehouse rebuilt; Redis's AOF
rewritten (and its snapshot, when it keeps one) so no byte of the id stays in its files
either.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq

from jobs.erase import erase_from_lake
from jobs.sweep import hold_run
from jobs.warehouse import refresh_warehouse, warehouse_path
from jobs.warehouse_links import links_dir
from leaderboard.erasure import (
    REDACTED,
    ErasureLedger,
    RewriteFailed,
    erasure_barrier,
    rewriting,
)
from leaderboard.manifest import (
    Manifest,
    manifests_dir,
    read_current,
    swap_current,
    write_version,
)
from leaderboard.profiles import latest_profiles
from leaderboard.settings import Settings
from leaderboard.speed_keys import StateLost
from leaderboard.timeutil import format_instant
from serving.profiles import ProfileCache
from speed_layer.service import SpeedLayer

__all__ = ["ErasedPlayer", "ErasureStopped", "erase_player", "erased_problem", "unless_erased"]


def erased_problem(lake: Path, player: str) -> str | None:
    """Why an operator action naming `player` (a ban, an unban, a void of their result) is
    refused, or None: an erased id never comes back into the lake, which the action's record
    would do (the ledger keeps only its salted hash)."""
    if not ErasureLedger.load(lake).erased(player):
        return None
    return (f"player {player}'s data was erased (right to erasure): nothing is recorded "
            "under the id any more; there is nothing of it to ban, unban or void")


class ErasedPlayer(Exception):
    """An operator action named an erased player (`unless_erased`): the message says why."""


class ErasureStopped(Exception):
    """The erasure stopped part-way because a file could not be written (a full disk, a
    permission), at any step from the ledger to the warehouse: the message names the file
    and the cause, says whether the id is refused at ingest yet and where the player can
    still be seen, and what to do (fix it, run it again: the run resumes). Every file is
    whole."""


@contextmanager
def unless_erased(lake: Path, player: str | None) -> Iterator[None]:
    """Run the block (an operator action naming `player`: a ban, an unban, a void of their
    result) only if the player is not erased, holding the erasure barrier shared across the
    check and the block: an erasure starting between the two would finish, and the action's
    record then bring the id back into the lake. Raises ErasedPlayer. A whole match's void
    (no player) is checked against no one, but still waits: its reason may name the player
    being erased, which the record's write redacts only once the ledger holds the id."""
    with erasure_barrier(lake, exclusive=False):
        problem = None if player is None else erased_problem(lake, player)
        if problem is not None:
            raise ErasedPlayer(problem)
        yield


def erase_player(settings: Settings, speed: SpeedLayer | None, player: str, *, settle: float,
                 say: Callable[[str], None] = lambda _m: None,
                 sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Erase `player` from the lake, the versions, Redis and the warehouse; returns what
    was done (counts, never the id's data). `settle`: seconds after which no server still
    reads a version other than the live one (`app.http.service.ERASURE_SETTLE`: the pointer
    reuse plus a request's longest Redis wait); the other versions' keys are deleted only
    that long after the pointer moved."""
    # One erasure at a time, and none while a batch run or a compaction holds the lake's
    # files (each waits for the other): see `erasure_barrier`.
    with erasure_barrier(settings.lake_dir, exclusive=True):
        return _erase(settings, speed, player, settle=settle, say=say, sleep=sleep)


def _erase(settings: Settings, speed: SpeedLayer | None, player: str, *, settle: float,
           say: Callable[[str], None], sleep: Callable[[float], None]) -> dict[str, Any]:
    # Every write of the erasure (the ledger, the sweeps, the lake's files, the marker, the
    # manifests, the re-publish, the warehouse) that fails ends here, in one answer saying
    # what the failed step leaves and what to do; `reached` is the part that was under way.
    reached = _Reached()
    try:
        return _steps(settings, speed, player, reached, settle=settle, say=say, sleep=sleep)
    except (RewriteFailed, OSError, duckdb.IOException) as exc:
        raise ErasureStopped(_stopped(settings, player, exc, reached.part)) from exc


class _Reached:
    """The part of an erasure under way: "boards" until Redis no longer holds the player
    (up to then the servers' cached version and Redis can still show them), "redis" while
    Redis rewrites its files, then "warehouse"."""

    part = "boards"


def _steps(settings: Settings, speed: SpeedLayer | None, player: str, reached: _Reached, *,
           settle: float, say: Callable[[str], None],
           sleep: Callable[[float], None]) -> dict[str, Any]:
    lake, now = settings.lake_dir, settings.now()
    report = erase_from_lake(lake, settings.registry, player, at=now, say=say)
    # Nothing of the id in the lake (an id never seen, or erased before): no version or
    # warehouse holds it either; Redis is still cleaned and its files rewritten.
    found = report.found
    live = read_current(lake) if found else None
    version = None
    if live is not None:
        version = _republish(lake, live, now)
        say(f"live version re-published as {version}")
    result: dict[str, Any] = {"status": "erased" if report.complete else "incomplete",
                              "lake": report.as_dict(), "version": version, "redis": None,
                              "warehouse": False}
    if not report.complete:
        result["remains"] = _remains(report.unreadable)
        say(result["remains"])
    if speed is not None:
        state = None
        try:
            fresh = read_current(lake)
            if live is not None and fresh is not None:
                state = speed.rebase(fresh)
            elif not found:
                state = speed.current()
        except StateLost:
            state = None
        if state is None:
            speed.rebuild(now)
            state = speed.current()
        # The serving cache's profile and every name of the player in the search index; then
        # the other players' names the lake pass redacted (their cached copy and index
        # member still held the id, and the AOF rewrite below would write it out again).
        cache = ProfileCache(speed.client, lake)
        cache.forget(player)
        cache.store([p for p in latest_profiles(lake).values() if REDACTED in p.display_name],
                    same_order=True)
        # Other versions' keys go only once every server reads the live pointer (this
        # erasure's rebase or rebuild, or a nightly rebase a moment ago).
        deleted = speed.erase(player, keep=state.tag, settle=lambda: sleep(settle))
        reached.part = "redis"
        result["redis"] = {"keys_deleted": deleted, "rewritten": speed.rewrite_persistence()}
        say(f"Redis: {deleted} key(s) deleted, files rewritten: "
            f"{', '.join(result['redis']['rewritten']) or 'none kept'}")
    reached.part = "warehouse"
    if found and (warehouse_path(settings.data_dir).exists()
                  or links_dir(settings.data_dir).exists()):
        # The link tree relinked whole: a copy of a lake file in it (a data dir restored
        # from a copy with its links followed) would keep the id.
        refresh_warehouse(settings.data_dir, settings.registry, relink=True)
        result["warehouse"] = True
        say("warehouse rebuilt")
    report.done()  # stopped before this, the next run of it resumes (`erase_from_lake`)
    return result


def _remains(unreadable: list[str]) -> str:
    """What an erasure that could not read some files leaves to do, in words (killed runs'
    files are swept before: these are files a version names, or the lake's own logs)."""
    return (f"not finished: {len(unreadable)} file(s) of the lake could not be read and may "
            f"still hold the id: {', '.join(sorted(unreadable))}. Everything else is erased "
            "and the id is refused at ingest. Restore those files from a backup, then erase "
            "the player again")


def _stopped(settings: Settings, player: str, exc: Exception, part: str) -> str:
    """What an erasure stopped by a failed write leaves, in words: nothing is damaged (each
    write is atomic), so no backup is needed, only the cause fixed and a new run; whether
    the id is refused at ingest is read from the ledger (its write may be the one that
    failed), and where the player can still be seen from the part under way."""
    lake = settings.lake_dir
    path: Path | None
    if isinstance(exc, RewriteFailed):
        path, cause = exc.path, exc.cause.strerror or str(exc.cause)
    else:  # a write not named by `rewriting`: a sweep's delete, the warehouse's database
        named = getattr(exc, "filename", None)
        path = Path(named) if isinstance(named, str) else (
            warehouse_path(settings.data_dir) if part == "warehouse" else None)
        cause = getattr(exc, "strerror", None) or str(exc)
    where = ("a file" if path is None
             else path.relative_to(lake) if path.is_relative_to(lake) else path)
    try:
        refused = ErasureLedger.load(lake).erased(player)
    except (OSError, ValueError, KeyError, TypeError):
        refused = False
    ingest = ("the id is refused at ingest" if refused else
              "the id is NOT refused at ingest yet (the ledger of erasures does not hold it)")
    seen = {"boards": "the player can still be shown on the public boards (the servers' "
                      "cached version and Redis hold them)",
            "redis": "the public boards no longer show the player, Redis's files and the "
                     "warehouse's views can still hold the id"}.get(
        part, "the public boards and Redis no longer hold the player, the warehouse's views "
              "still can")
    return (f"stopped part-way: {where} could not be written ({cause}). No file is damaged; "
            f"{ingest}; {seen} until the erasure is run again and finishes. Fix the cause "
            "(free disk space, check the permissions), then erase the player again: the run "
            "resumes where this one stopped")


def _republish(lake: Path, live: Manifest, now: datetime) -> str:
    """The live version's manifest under a new id (same files, same as_of): the pointer
    moves to it, so every reader loads the erased files afresh."""
    version = f"{live.as_of}.{now.strftime('%Y%m%dT%H%M%S')}.{uuid.uuid4().hex[:6]}"
    copy = replace(live, version=version, created_at=format_instant(now),
                   previous=live.version, index=dict(live.index))
    # A run like a batch's: its lock file is its tombstone, so the files of an erasure
    # killed before the manifest are swept by the next night (and no sweep deletes them
    # while they are written).
    with hold_run(lake, version), rewriting(manifests_dir(lake) / f"{version}.json"):
        write_version(lake, copy, rollups=pq.read_table(lake / live.index["rollups"]["path"]),
                      standings=live.standings(lake))
    with rewriting(manifests_dir(lake) / "current.json"):
        swap_current(lake, version)
    return version
