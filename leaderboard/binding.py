"""A data dir is bound to one board registry at first use.

Events are validated, rolled up and ranked under a registry (its regions, modes, boards,
bounds); a second registry over the same lake mixes incompatible rows into one log and
replaces the live version with standings of other boards (issue 10: the football walkthrough
run in the demo's data dir). So the first command on a data dir records the registry's
fingerprint in `lake/registry.json`, and every later command with another registry is
refused, saying which registry is bound, which was given, and what to do. A deliberate edit
of the bound registry is rebound with `leaderboard lake rebind`.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from leaderboard.lake import atomic_write_bytes, fsync_dir
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
