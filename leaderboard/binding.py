"""A data dir is bound to one board registry at first use.

Events are validated, rolled up and ranked under a registry (its regions, modes, boards,
bounds); a second registry over the same lake mixes incompatible rows into one log and
replaces the live version with standings of other boards (issue 10: the football walkthrough
run in the demo's data dir). So the first command on a data dir records the registry's
fingerprint in `lake/registry.json`, and every later command with another registry is
refused, saying which registry is bound, which was given, and what to do. A deliberate edit
of the bound registry is rebound with `leaderboard lake rebind`.

A rebind is refused when the edited registry's calendar leaves out events the lake already
holds (calendar.all_time_start moved past them, or all_time_end to or before them): ingest
refuses such events, so no layer has a window for them, and the nightly batch could not
account for them.

After a rebind the next batch builds on the live version whenever the rollups mean the same
under both registries (`rollup_layout`: the lateness bits and the calendar): the boards
whose definition is unchanged (`board_digests`) keep their standings, new and changed boards
are built from the rollups, which hold every absorbed event's per player-day aggregates for
good, so retention does not stop it. An edit that changes the layout needs the raw events:
once retention deleted some, it is refused at rebind, since no night could publish.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from leaderboard.event_dates import event_date_range
from leaderboard.lake import atomic_write_bytes, fsync_dir, landed_files
from leaderboard.lateness import lateness_bits
from leaderboard.manifest import read_current
from leaderboard.registry import Registry, RegistryError
from leaderboard.retained import deleted_through

__all__ = ["BINDING_NAME", "RegistryBindingError", "bind_registry", "board_digests",
           "bound_registry", "rebind_summary", "rollup_layout"]

BINDING_NAME = "registry.json"


class RegistryBindingError(RegistryError):
    """The data dir is bound to another registry; the message says which and what to do."""


def _path(lake: Path) -> Path:
    return lake / BINDING_NAME


def bound_registry(lake: Path) -> dict[str, Any] | None:
    """The binding record (fingerprint, source, bound_at), or None for an unbound lake."""
    try:
        record = json.loads(_path(lake).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise RegistryBindingError(
            f"the registry binding {_path(lake)} is unreadable ({exc}); run `leaderboard "
            "lake rebind` with the data dir's registry to write it again") from None
    if not isinstance(record, dict) or not isinstance(record.get("fingerprint"), str):
        raise RegistryBindingError(
            f"the registry binding {_path(lake)} has no fingerprint; run `leaderboard lake "
            "rebind` with the data dir's registry to write it again")
    return record


def _record(registry: Registry) -> bytes:
    return (json.dumps({"fingerprint": registry.fingerprint, "source": registry.source,
                        "bound_at": datetime.now(UTC).isoformat()}, indent=2) + "\n").encode()


def bind_registry(lake: Path, registry: Registry, *, rebind: bool = False) -> None:
    """Bind the lake to `registry` if it is unbound (or `rebind`); refuse another registry.

    The first binding is created with a hard link of a complete temp file, so two first
    commands racing with different registries cannot both win.
    """
    if rebind:
        _check_calendar_span(lake, registry)
        _check_rebuildable(lake, registry)
        lake.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(_path(lake), _record(registry))
        return
    record = bound_registry(lake)
    if record is None:
        lake.mkdir(parents=True, exist_ok=True)
        tmp = lake / f".{BINDING_NAME}.{os.getpid()}.tmp"
        with open(tmp, "wb") as handle:
            handle.write(_record(registry))
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, _path(lake))
            fsync_dir(lake)
        except FileExistsError:
            pass  # another command bound it first: check against its binding below
        finally:
            tmp.unlink(missing_ok=True)
        record = bound_registry(lake)
        assert record is not None
    if record["fingerprint"] != registry.fingerprint:
        data = lake.parent
        raise RegistryBindingError(
            f"data dir {data} is bound to the board registry {record.get('source')} "
            f"(fingerprint {record['fingerprint']}), but this command uses "
            f"{registry.source} (fingerprint {registry.fingerprint}). Use another data dir "
            f"for this registry (--data DIR or LEADERBOARD_DATA), or give the bound one "
            f"(--config / LEADERBOARD_CONFIG); if you changed the bound registry on purpose, "
            f"run `leaderboard --data {data} --config <it> lake rebind` (README: what a "
            "rebind keeps)")


def _check_calendar_span(lake: Path, registry: Registry) -> None:
    """Refuse a registry whose all-time calendar leaves out events already accepted: landed
    (Parquet statistics, no rows read) or in the live version's rollups (raw events of old
    dates may be gone)."""
    span = event_date_range(lake, landed_files(lake), read_current(lake))
    if span is None:
        return
    (earliest, latest), calendar = span, registry.calendar
    record = bound_registry(lake)
    bound = ("" if record is None else f"; the data dir stays bound to {record.get('source')} "
             f"(fingerprint {record['fingerprint']})")
    if earliest < calendar.all_time_start:
        raise RegistryBindingError(
            f"{registry.source} starts the calendar on {calendar.all_time_start} "
            f"(calendar.all_time_start), after events the lake already holds (the earliest on "
            f"{earliest}): they would count in no window. Set all_time_start to {earliest} or "
            f"earlier and run `leaderboard lake rebind` again{bound}")
    if latest >= calendar.all_time_end:
        raise RegistryBindingError(
            f"{registry.source} ends the calendar on {calendar.all_time_end} "
            f"(calendar.all_time_end), at or before events the lake already holds (the latest "
            f"on {latest}): they would count in no window. Set all_time_end to "
            f"{latest + timedelta(days=1)} or later and run `leaderboard lake rebind` "
            f"again{bound}")


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def rollup_layout(registry: Registry) -> str:
    """What a rollup row means under `registry`: its mask's bits ((window kind, grace) each)
    and the calendar that placed its events in windows. Versions record it; a base with
    the same layout serves a registry of another fingerprint."""
    calendar = registry.calendar
    return _digest({
        "bits": [(bit.kind, bit.grace_us) for bit in lateness_bits(registry)],
        "seasons": None if calendar.seasons is None else [
            (season.id, season.start, season.end) for season in calendar.seasons],
        "all_time": (calendar.all_time_start, calendar.all_time_end)})


def board_digests(registry: Registry) -> dict[str, str]:
    """Each board's definition as a digest (scope, windows, aggregation, order, ties,
    bounds, grace, source): a board whose digest a version recorded is unchanged."""
    return {board.name: _digest(asdict(board)) for board in registry.boards}


def _check_rebuildable(lake: Path, registry: Registry) -> None:
    """Refuse an edit whose rollups need the raw events retention already deleted."""
    gone = deleted_through(lake)
    live = read_current(lake)
    if gone is None or live is None or live.inputs.get("rollup_layout") == rollup_layout(
            registry):
        return
    if "rollup_layout" not in live.inputs:
        raise RegistryBindingError(
            f"the live version {live.version} does not record what its rollups mean (it was "
            f"published by an older release), and retention deleted the raw events through "
            f"{gone}: put the bound registry back, run one night (`leaderboard batch`), then "
            "edit and rebind again; the binding is unchanged")
    raise RegistryBindingError(
        f"{registry.source} changes how events roll up (a new window kind or grace on some "
        f"board, the seasons or the all-time calendar) from the live version {live.version}"
        f", and retention deleted the raw events through {gone}: no batch could recompute "
        "the history under it. Keep the live version's windows, graces and calendar (boards "
        "may be added, removed or changed otherwise), or load the history into a new data "
        "dir; the binding is unchanged")


def rebind_summary(lake: Path, registry: Registry) -> str | None:
    """What the next batch does after a rebind to `registry` (None: nothing published)."""
    live = read_current(lake)
    if live is None:
        return None
    if live.inputs.get("rollup_layout") != rollup_layout(registry):
        return "the next batch recomputes every board in full from the raw events"
    old = live.inputs.get("board_digests", {})
    new = board_digests(registry)
    kept = sorted(b for b, d in new.items() if old.get(b) == d)
    built = sorted(b for b, d in new.items() if old.get(b) != d)
    dropped = sorted(set(old) - set(new))
    parts = [f"the next batch keeps the standings of {len(kept)} unchanged board(s)"]
    if built:
        parts.append(
            f"builds {', '.join(built)} from the rollups (every absorbed event's per "
            "player-day aggregates, kept for good: the whole history, also before retention;"
            " not events the old registry refused, e.g. a new region's, which stay in "
            "quarantine until released)")
    if dropped:
        parts.append(f"drops {', '.join(dropped)}")
    return "; ".join(parts)
