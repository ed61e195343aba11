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

import pyarrow as pa
import pyarrow.parquet as pq

from leaderboard.lake import atomic_write_bytes, atomic_write_parquet, retire_landing_floor

__all__ = [
    "ROLLUP_INDEX_SCHEMA",
    "STANDINGS_INDEX_SCHEMA",
    "Manifest",
    "ManifestError",
    "list_versions",
    "manifests_dir",
    "read_current",
    "read_version",
    "rollup_files",
    "swap_current",
    "version_as_of",
    "version_files",
    "version_order",
    "watermark_for",
    "write_version",
]


def rollup_files(rollups: dict[str, dict[str, Any]]) -> dict[str, list[date]]:
    """{rollup file path: the event dates a version reads from it} from `Manifest.rollups`:
    a file may also hold rows of dates a later run rewrote, so a reader filters each file
    to its own dates (the batch's ban check, the speed layer's seed)."""
    by_path: dict[str, list[date]] = {}
    for day, entry in rollups.items():
        by_path.setdefault(entry["path"], []).append(date.fromisoformat(day))
    return by_path


class ManifestError(RuntimeError):
    """A manifest that is missing or unreadable."""


def manifests_dir(lake: Path) -> Path:
    return lake / "manifests"


def watermark_for(as_of: date) -> datetime:
    """W = as_of + 1 day, 00:00 UTC: the version absorbs events with ingested_at < W."""
    return datetime.combine(as_of + timedelta(days=1), time.min, UTC)


ROLLUP_INDEX_SCHEMA = pa.schema([
    ("event_date", pa.date32()), ("path", pa.string()), ("rows", pa.int64()),
    ("events", pa.int64()), ("points", pa.int64()),
])
STANDINGS_INDEX_SCHEMA = pa.schema([
    ("board", pa.string()), ("window_id", pa.string()), ("path", pa.string()),
    ("rows", pa.int64()), ("score_total", pa.int64()), ("histogram", pa.string()),
    ("histogram_rows", pa.int64()), ("received", pa.bool_()),
])


@dataclass
class Manifest:
    """One batch version. Paths are relative to the lake dir.

    Per-date rollup entries and per-board-window standings entries live in two Parquet
    indexes beside the manifest (a century of daily windows is 10^5 entries), which the
    manifest names with their row counts.
    """

    version: str
    as_of: str  # YYYY-MM-DD
    watermark: str  # ISO 8601
    created_at: str
    engine: str
    registry_fingerprint: str
    previous: str | None = None
    # inputs: {"files": {relpath: 1}, "events": n, "new_events": n, "banned": [...], "mode"}
    inputs: dict[str, Any] = field(default_factory=dict)
    # index: {"rollups": {"path", "rows"}, "standings": {"path", "rows"}}
    index: dict[str, dict[str, Any]] = field(default_factory=dict)
    # boards: {board: {"windows": n, "rows": n}} (a summary for people)
    boards: dict[str, dict[str, int]] = field(default_factory=dict)
    checks: dict[str, Any] = field(default_factory=dict)
    # Seconds the run took up to writing this manifest (None in manifests older than the field).
    duration_seconds: float | None = None

    @property
    def as_of_date(self) -> date:
        return date.fromisoformat(self.as_of)

    @property
    def watermark_at(self) -> datetime:
        return datetime.fromisoformat(self.watermark.replace("Z", "+00:00"))

    def rollups(self, lake: Path) -> dict[str, dict[str, Any]]:
        """{event_date: {"path", "rows", "events", "points"}}."""
        table = pq.read_table(lake / self.index["rollups"]["path"])
        return {row.pop("event_date").isoformat(): row for row in table.to_pylist()}

    def standings(self, lake: Path) -> pa.Table:
        """The standings index: one row per board-window (STANDINGS_INDEX_SCHEMA)."""
        return pq.read_table(lake / self.index["standings"]["path"])

    def files(self, lake: Path) -> list[tuple[str, int]]:
        """Every file of the version with its row count (data files and the two indexes)."""
        found = {(e["path"], e["rows"]) for e in self.index.values()}
        rollups = pq.read_table(lake / self.index["rollups"]["path"])
        by_path: dict[str, int] = {}
        for path, rows in zip(rollups.column("path").to_pylist(),
                              rollups.column("rows").to_pylist(), strict=True):
            by_path[path] = by_path.get(path, 0) + rows
        standings = self.standings(lake)
        for column, rows_column in (("path", "rows"), ("histogram", "histogram_rows")):
            for path, rows in zip(standings.column(column).to_pylist(),
                                  standings.column(rows_column).to_pylist(), strict=True):
                by_path[path] = by_path.get(path, 0) + rows
        return sorted(found | set(by_path.items()))

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        return cls(**json.loads(text))


def write_version(lake: Path, manifest: Manifest, *, rollups: pa.Table,
                  standings: pa.Table) -> Path:
    """Write the two indexes, then the manifest naming them (not yet current)."""
    folder = manifests_dir(lake) / manifest.version
    for name, table, schema in (("rollups", rollups, ROLLUP_INDEX_SCHEMA),
                                ("standings", standings, STANDINGS_INDEX_SCHEMA)):
        target = folder / f"{name}.parquet"
        atomic_write_parquet(table.select(schema.names).cast(schema), target)
        manifest.index[name] = {"path": str(target.relative_to(lake)), "rows": table.num_rows}
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
    manifest = read_version(lake, version)  # refuse to point at a manifest not there
    payload = json.dumps({"version": version}).encode()
    atomic_write_bytes(manifests_dir(lake) / "current.json", payload)
    retire_landing_floor(lake, manifest.watermark_at)


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


def version_files(lake: Path) -> list[Path]:
    """Every version's manifest file (not the `current.json` pointer), by name."""
    return [p for p in sorted(manifests_dir(lake).glob("*.json")) if p.name != "current.json"]


def version_order(as_of: str, created_at: str) -> tuple[str, str]:
    """The order of versions, oldest first: by as_of, then by when each was computed (the
    last of a day is the one history answers for it)."""
    return as_of, created_at


def list_versions(lake: Path) -> list[Manifest]:
    """Every written version (published or not), oldest first."""
    found = []
    for path in version_files(lake):
        try:
            found.append(Manifest.from_json(path.read_text()))
        except (ValueError, TypeError):
            continue
    return sorted(found, key=lambda m: version_order(m.as_of, m.created_at))


def version_as_of(lake: Path, as_of: date) -> Manifest | None:
    """The latest version computed for `as_of` (the one history answers for that date)."""
    found = [m for m in list_versions(lake) if m.as_of == as_of.isoformat()]
    return found[-1] if found else None
