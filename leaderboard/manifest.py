"""Batch-version manifests and the atomic publish pointer.

A version's manifest names every file it consists of (rollups, standings, histograms) with
row counts, and the inputs it absorbed. `manifests/current.json` names the live version and
is replaced atomically (temp + fsync + rename), so a reader sees the old version or the new
one, never a mix; a crash before the swap leaves the old version live.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any

from leaderboard.lake import atomic_write_bytes

__all__ = [
    "Manifest",
    "ManifestError",
    "list_versions",
    "manifests_dir",
    "read_current",
    "read_version",
    "swap_current",
    "watermark_for",
    "write_version",
]


class ManifestError(RuntimeError):
    """A manifest that is missing or unreadable."""


def manifests_dir(lake: Path) -> Path:
    return lake / "manifests"


def watermark_for(as_of: date) -> datetime:
    """W = as_of + 1 day, 00:00 UTC: the version absorbs events with ingested_at < W."""
    return datetime.combine(as_of + timedelta(days=1), time.min, UTC)


@dataclass
class Manifest:
    """One batch version. Paths are relative to the lake dir."""

    version: str
    as_of: str  # YYYY-MM-DD
    watermark: str  # ISO 8601
    created_at: str
    engine: str
    registry_fingerprint: str
    previous: str | None = None
    # inputs: {"files": {relpath: rows absorbed}, "rows": n, "events": n, "banned": [...]}
    inputs: dict[str, Any] = field(default_factory=dict)
    # rollups: {event_date: {"path": relpath, "rows": n}}
    rollups: dict[str, dict[str, Any]] = field(default_factory=dict)
    # standings: {board: {window_id: {"path", "rows", "histogram", "histogram_rows"}}}
    standings: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    checks: dict[str, Any] = field(default_factory=dict)

    @property
    def as_of_date(self) -> date:
        return date.fromisoformat(self.as_of)

    @property
    def watermark_at(self) -> datetime:
        return datetime.fromisoformat(self.watermark.replace("Z", "+00:00"))

    def files(self) -> list[tuple[str, int]]:
        """Every file of the version with its row count."""
        found = [(r["path"], r["rows"]) for r in self.rollups.values()]
        for windows in self.standings.values():
            for entry in windows.values():
                found.append((entry["path"], entry["rows"]))
                found.append((entry["histogram"], entry["histogram_rows"]))
        return found

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        return cls(**json.loads(text))


def write_version(lake: Path, manifest: Manifest) -> Path:
    target = manifests_dir(lake) / f"{manifest.version}.json"
    atomic_write_bytes(target, manifest.to_json().encode())
    return target


def read_version(lake: Path, version: str) -> Manifest:
    path = manifests_dir(lake) / f"{version}.json"
    try:
        return Manifest.from_json(path.read_text())
    except FileNotFoundError:
        raise ManifestError(f"manifest {path} is missing; the lake is damaged or partial") from None
    except (ValueError, TypeError) as exc:
        raise ManifestError(f"manifest {path} is unreadable: {exc}") from None


def swap_current(lake: Path, version: str) -> None:
    """Make `version` live: one atomic rename of manifests/current.json."""
    read_version(lake, version)  # refuse to point at a manifest that is not there
    payload = json.dumps({"version": version}).encode()
    atomic_write_bytes(manifests_dir(lake) / "current.json", payload)


def read_current(lake: Path) -> Manifest | None:
    """The live version, or None before the first publish."""
    pointer = manifests_dir(lake) / "current.json"
    try:
        version = json.loads(pointer.read_text())["version"]
    except FileNotFoundError:
        return None
    except (ValueError, KeyError) as exc:
        raise ManifestError(f"{pointer} is unreadable ({exc}); republish a version") from None
    return read_version(lake, version)


def list_versions(lake: Path) -> list[Manifest]:
    """Every written version (published or not), oldest first."""
    found = []
    for path in sorted(manifests_dir(lake).glob("*.json")):
        if path.name == "current.json":
            continue
        try:
            found.append(Manifest.from_json(path.read_text()))
        except (ValueError, TypeError):
            continue
    return sorted(found, key=lambda m: (m.as_of, m.created_at))
