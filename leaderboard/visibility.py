"""Accepted events a version did not read but the speed layer counts as absorbed.

A version V absorbs the rows with ingested_at < W(V) of the landed files it read (its
`inputs.files`); the speed layer folds only the rows at or after W(V). A landed file V did
not read that holds rows before W(V) therefore counts on no live board until a later batch
reads it. The door prevents it for an open day's cut (`leaderboard.lake.settle_landings`:
no landing is stamped before it unless it is in the version); what remains is a landing
whose clock is behind an ended night's watermark, a writer that bypasses the door (an older
release's) and, for versions published before the cut existed, any event landed after a
batch of a night not ended. The batch recomputes when its base missed such a file
(`jobs.batch`), and health reports them meanwhile (`/healthz`, the console).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import date, time, timedelta
from pathlib import Path
from time import time_ns

from leaderboard.lake import (
    LandedFile,
    absorbed_with_compactions,
    events_dir,
    landed_files,
    stamp_range,
)
from leaderboard.manifest import Manifest

__all__ = ["invisible_files", "unread_before"]

_PARTITION = "ingest_date="


def unread_before(lake: Path, version: Manifest, files: Iterable[LandedFile], *,
                  absorbed: set[str] | None = None) -> list[LandedFile]:
    """The files among `files` that `version` did not read and that may hold rows ingested
    before its watermark. A file's rows are stamped on its partition's day, so a partition
    before the watermark's day holds nothing else, one after it nothing before; only the
    watermark's own day is read for statistics, and only when the watermark is not at
    midnight (a batch of an open day). `absorbed`: the files the version read, compacted
    files included (`absorbed_with_compactions`), when the caller has them."""
    mark = version.watermark_at
    read = version.inputs.get("files", {})
    known = read if absorbed is None else absorbed
    candidates = [f for f in files if f.ingest_date <= mark.date()
                  and str(f.path.relative_to(lake)) not in known]
    if absorbed is None and candidates:
        # Compaction records of the candidates' partitions only (health asks often).
        absorbed = absorbed_with_compactions(lake, read, days={f.ingest_date for f in candidates})
    found = []
    for landed in candidates:
        if absorbed is not None and str(landed.path.relative_to(lake)) in absorbed:
            continue
        if landed.ingest_date == mark.date() and (
                mark.time() == time.min or stamp_range(landed.path)[0] >= mark):
            continue
        found.append(landed)
    return found


#: A partition directory whose mtime is at least this old when it is looked at has settled:
#: a landing renamed into it later moves its mtime (filesystems stamp it coarsely, so a
#: younger one may still change within the same tick and is looked at again next time).
_SETTLED_NS = 2_000_000_000

#: A file's identity on disk: a rewrite (compaction, an erasure) replaces it with a new inode.
_FileKey = tuple[int, int]


@dataclass
class _Checked:
    """What `invisible_files` found for one version: per partition {name: (its directory's
    mtime then, the invisible files it held)}, and per file of the watermark's own day (the
    only ones whose footer is read) {relative path: its identity} when it was found visible."""

    version: str
    partitions: dict[str, tuple[int, list[LandedFile]]] = field(default_factory=dict)
    visible: dict[str, _FileKey] = field(default_factory=dict)


_checked: dict[Path, _Checked] = {}
_LAKES = 8
_checked_lock = threading.Lock()


def _partitions(lake: Path, version: Manifest) -> dict[str, tuple[date, int]]:
    """{name: (day, directory mtime)} of the partitions that can hold rows before the
    version's watermark W: those of days before W's, and W's own when W is not midnight
    (every row of a partition is stamped on its day, so none of W's day precedes a
    midnight W)."""
    mark = version.watermark_at
    last = mark.date() if mark.time() != time.min else mark.date() - timedelta(days=1)
    present: dict[str, tuple[date, int]] = {}
    with suppress(FileNotFoundError), os.scandir(events_dir(lake)) as entries:
        for entry in entries:
            if entry.name.startswith(_PARTITION) and entry.is_dir():
                with suppress(ValueError):
                    day = date.fromisoformat(entry.name.removeprefix(_PARTITION))
                    if day <= last:
                        present[entry.name] = (day, entry.stat().st_mtime_ns)
    return present


def _file_key(path: Path) -> _FileKey | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_mtime_ns


def _unread(lake: Path, version: Manifest, listed: list[LandedFile],
            visible: dict[str, _FileKey]) -> tuple[list[LandedFile], dict[str, _FileKey]]:
    """`unread_before` over `listed`, skipping the files of the watermark's day already
    found visible with the same identity (a landed file never changes once renamed; only
    those cost a footer read). Returns the invisible files and the visible ones' keys."""
    day = version.watermark_at.date()
    keys: dict[str, _FileKey] = {}
    unknown = []
    for landed in listed:
        if landed.ingest_date != day:
            unknown.append(landed)
            continue
        name = str(landed.path.relative_to(lake))
        key = _file_key(landed.path)
        if key is None:  # compacted or erased meanwhile
            continue
        keys[name] = key
        if visible.get(name) != key:
            unknown.append(landed)
    found = unread_before(lake, version, unknown)
    for landed in found:  # re-checked at each look: an alarm, and a rare one
        keys.pop(str(landed.path.relative_to(lake)), None)
    return found, keys


def invisible_files(lake: Path, version: Manifest) -> list[LandedFile]:
    """The landed files whose accepted events are on no live board of `version`.

    Health asks this every few seconds: only partitions before the watermark's day can hold
    such files, and its day's when the watermark is not at midnight (an open day's version).
    Of those, only the ones whose directory changed since the last look at this version are
    listed again (a landing, a compaction and its record, an erasure's rewrite all rename
    into the directory), the rest answer from that look; in a listed partition of the
    watermark's day a file already found visible is not read again, so under steady ingest a
    look reads the footers of the files landed since the last one only."""
    lake = Path(lake)
    present = _partitions(lake, version)
    with _checked_lock:
        checked = _checked.get(lake)
        if checked is None or checked.version != version.version:
            if len(_checked) >= _LAKES:
                _checked.clear()  # a process serves one lake; tests open many
            checked = _checked[lake] = _Checked(version.version)
        known = dict(checked.partitions)
        visible = dict(checked.visible)
    changed = {name: day for name, (day, mtime) in present.items()
               if name not in known or known[name][0] != mtime}
    fresh: dict[str, list[LandedFile]] = {name: [] for name in changed}
    if changed:
        found, keys = _unread(lake, version, landed_files(lake, days=changed.values()), visible)
        for landed in found:
            fresh[landed.path.parent.name].append(landed)
        visible = keys if version.watermark_at.date() in changed.values() else visible
    settled = time_ns() - _SETTLED_NS
    with _checked_lock:
        checked.partitions = {name: (mtime, fresh[name] if name in fresh else known[name][1])
                              for name, (_, mtime) in present.items()
                              if name not in fresh or mtime <= settled}
        checked.visible = visible
    return sorted(landed for name in present
                  for landed in (fresh[name] if name in fresh else known[name][1]))
