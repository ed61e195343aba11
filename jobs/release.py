"""Check a written batch version on its own, then publish it: the DAG's check-then-swap.

Usage: python -m jobs.release --version 2026-12-01.20261202T000512.a1b2c3 [--check-only]
       [--data DIR] [--config NAME]

`jobs.batch.run_batch(..., publish=False)` writes and seals a version without making it
live. `validate_version` then re-reads what the version names (every file present, the
files this run wrote ordered, ranked and totalled as their index says, events adding up)
before `publish_version` swaps `manifests/current.json` in one atomic rename. The live
pointer never moves back in time: rerunning an older night writes that night's version for
the history (the warehouse shows it) and leaves the newer live version in place.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jobs.publish import PublishError, check_standings, window_runs
from jobs.retention import deleted_through
from leaderboard.manifest import (
    Manifest,
    ManifestError,
    manifests_dir,
    read_current,
    read_version,
    swap_current,
)
from leaderboard.registry import Registry
from leaderboard.settings import Settings

__all__ = ["main", "publish_version", "set_aside", "validate_version"]

def _windows_of(table: pa.Table) -> dict[str, tuple[int, int]]:
    """(rows, score total) per window_id of a standings file."""
    if table.num_rows == 0:
        return {}
    starts, lengths = window_runs(table.column("window_id"))
    windows = table.column("window_id").to_pylist()
    scores = table.column("score")
    found = {}
    for start, length in zip(starts.tolist(), lengths.tolist(), strict=True):
        total = pc.sum(scores.slice(start, length)).as_py() or 0
        found[windows[start]] = (length, int(total))
    return found


def validate_version(lake: Path, version: str, *, registry: Registry,
                     as_of: date | None = None) -> dict[str, Any]:
    """Re-check a written version before it goes live; raises PublishError naming the
    first problem, else returns what was checked."""
    manifest = read_version(lake, version)
    where = f"version {version}"
    if as_of is not None and manifest.as_of_date != as_of:
        raise PublishError(f"{where} is as of {manifest.as_of}, the run is for {as_of}")
    if manifest.registry_fingerprint != registry.fingerprint:
        raise PublishError(f"{where} was computed with another board registry; rerun the batch "
                           "with the registry the DAG uses")
    deleted = deleted_through(lake)
    if manifest.inputs.get("mode") == "full" and deleted is not None:
        raise PublishError(
            f"{where} is a full recompute, but raw events through {deleted} were deleted by "
            "retention, so it misses them; publish an incremental run instead (the previous "
            "version must be present and no file may land into a partition it closed)")
    # Every file the version names, those of earlier runs too (their windows are published
    # again): a count that grows with the history, so one plain stat each, no Path objects.
    root = os.fspath(lake)
    missing = [path for path, _rows in manifest.files(lake)
               if not os.path.exists(os.path.join(root, path))]
    if missing:
        raise PublishError(f"{where} names {len(missing)} missing file(s), e.g. {missing[0]}")
    rollups = pq.read_table(lake / manifest.index["rollups"]["path"])
    events = int(pc.sum(rollups.column("events")).as_py() or 0) if rollups.num_rows else 0
    if events != manifest.inputs.get("events") or events != manifest.checks.get("events"):
        raise PublishError(f"{where}: rollups count {events} events, the manifest says "
                           f"{manifest.inputs.get('events')}")
    index = manifest.standings(lake)
    earliest = {b.name for b in registry.boards if b.ties == "earliest"}
    banned = set(manifest.inputs.get("banned", []))
    own = f"part-{version}.parquet"
    checked_windows = 0
    for path in sorted(set(index.column("path").to_pylist())):
        if not path.endswith(own):
            continue  # an earlier version's file, checked when that version was published
        table = pq.read_table(lake / path)
        entries = index.filter(pc.equal(index.column("path"), path))
        board = entries.column("board")[0].as_py()
        check_standings(table, earliest=board in earliest, banned=banned, where=path)
        on_disk = _windows_of(table)
        for window_id, rows, total in zip(entries.column("window_id").to_pylist(),
                                          entries.column("rows").to_pylist(),
                                          entries.column("score_total").to_pylist(),
                                          strict=True):
            if on_disk.get(window_id, (0, 0)) != (rows, total):
                raise PublishError(
                    f"{path} {window_id}: {on_disk.get(window_id, (0, 0))} (rows, score total) "
                    f"on disk, the index says {(rows, total)}")
            checked_windows += 1
    return {"version": version, "as_of": manifest.as_of, "events": events,
            "windows": index.num_rows, "windows_checked": checked_windows}


def set_aside(lake: Path, version: str) -> Path:
    """Rename a version's manifest to `<version>.json.rejected`, so that neither the next
    incremental run nor the warehouse builds on a version that failed its checks."""
    source = manifests_dir(lake) / f"{version}.json"
    target = source.with_name(source.name + ".rejected")
    source.replace(target)
    return target


def publish_version(lake: Path, version: str) -> tuple[bool, Manifest]:
    """Make `version` live unless the live version is of a later night; returns (whether
    it was published, the live manifest)."""
    manifest = read_version(lake, version)
    live = read_current(lake)
    if live is not None and live.as_of_date > manifest.as_of_date:
        return False, live
    swap_current(lake, version)
    return True, manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", required=True, help="a written version id")
    parser.add_argument("--check-only", action="store_true", help="validate, do not publish")
    parser.add_argument("--data", help="data dir (env LEADERBOARD_DATA)")
    parser.add_argument("--config", help="board registry (env LEADERBOARD_CONFIG)")
    args = parser.parse_args(argv)
    settings = Settings.from_env(data_dir=args.data, config=args.config)
    try:
        checked = validate_version(settings.lake_dir, args.version, registry=settings.registry)
    except (PublishError, ManifestError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not args.check_only:
        published, live = publish_version(settings.lake_dir, args.version)
        checked.update(published=published, live=live.version)
    print(json.dumps(checked))
    return 0


if __name__ == "__main__":
    sys.exit(main())
