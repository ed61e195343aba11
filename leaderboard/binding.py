"""A data dir is bound to one board registry at first use.

Events are validated, rolled up and ranked under a registry (its regions, modes, boards,
bounds); a second registry over the same lake mixes incompatible rows into one log and
replaces the live version with standings of other boards (issue 10: the football walkthrough
run in the demo's data dir). So the first command on a data dir records the registry's
fingerprint in `lake/registry.json`, and every later command with another registry is
refused, saying which registry is bound, which was given, and what to do. A deliberate edit
of the bound registry is rebound with `leaderboard lake rebind`.

A rebind is refused when the edited registry's calendar starts after events the lake already
holds (calendar.all_time_start moved past them): ingest refuses such events, so no layer has
a window for them, and the nightly batch could not account for them.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from leaderboard.lake import atomic_write_bytes, fsync_dir, landed_files, stamp_range
from leaderboard.manifest import read_current
from leaderboard.registry import Registry, RegistryError

__all__ = ["BINDING_NAME", "RegistryBindingError", "bind_registry", "bound_registry"]

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
        _check_calendar_start(lake, registry)
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
            f"run `leaderboard --data {data} --config <it> lake rebind` (the next batch then "
            f"recomputes in full)")


def _earliest_event_date(lake: Path) -> date | None:
    """The earliest event date the lake counts: landed events (Parquet statistics, no rows
    read) and the live version's rollups (raw events of old dates may be gone)."""
    found = [stamp_range(f.path, "event_time")[0].date() for f in landed_files(lake)]
    live = read_current(lake)
    if live is not None:
        found.extend(date.fromisoformat(day) for day in live.rollups(lake))
    return min(found, default=None)


def _check_calendar_start(lake: Path, registry: Registry) -> None:
    """Refuse a registry whose all-time calendar starts after events already accepted."""
    start = registry.calendar.all_time_start
    earliest = _earliest_event_date(lake)
    if earliest is None or earliest >= start:
        return
    record = bound_registry(lake)
    bound = ("" if record is None else f"; the data dir stays bound to {record.get('source')} "
             f"(fingerprint {record['fingerprint']})")
    raise RegistryBindingError(
        f"{registry.source} starts the calendar on {start} (calendar.all_time_start), after "
        f"events the lake already holds (the earliest on {earliest}): they would count in no "
        f"window. Set all_time_start to {earliest} or earlier and run `leaderboard lake "
        f"rebind` again{bound}")
