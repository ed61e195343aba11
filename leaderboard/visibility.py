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
from datetime import date, time
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


@dataclass
class _Checked:
    """What `invisible_files` found per partition for one version: {partition name:
    (its directory's mtime then, the invisible files it held)}."""

    version: str
    partitions: dict[str, tuple[int, list[LandedFile]]] = field(default_factory=dict)


_checked: dict[Path, _Checked] = {}
_LAKES = 8
_checked_lock = threading.Lock()


def invisible_files(lake: Path, version: Manifest) -> list[LandedFile]:
    """The landed files whose accepted events are on no live board of `version`.

    Health asks this every few seconds: only partitions up to the watermark's day can hold
    such files, and of those only the ones whose directory changed since the last look at
    this version are listed again (a landing, a compaction and its record, an erasure's
    rewrite all rename into the directory); the rest answer from that look."""
    lake = Path(lake)
    last = version.watermark_at.date()
    present: dict[str, tuple[date, int]] = {}
    with suppress(FileNotFoundError), os.scandir(events_dir(lake)) as entries:
        for entry in entries:
            if entry.name.startswith(_PARTITION) and entry.is_dir():
                with suppress(ValueError):
                    day = date.fromisoformat(entry.name.removeprefix(_PARTITION))
                    if day <= last:
                        present[entry.name] = (day, entry.stat().st_mtime_ns)
    with _checked_lock:
        checked = _checked.get(lake)
        if checked is None or checked.version != version.version:
            if len(_checked) >= _LAKES:
                _checked.clear()  # a process serves one lake; tests open many
            checked = _checked[lake] = _Checked(version.version)
        known = dict(checked.partitions)
    changed = {name: day for name, (day, mtime) in present.items()
               if name not in known or known[name][0] != mtime}
    fresh: dict[str, list[LandedFile]] = {name: [] for name in changed}
    if changed:
        for landed in unread_before(lake, version, landed_files(lake, days=changed.values())):
            fresh[landed.path.parent.name].append(landed)
    settled = time_ns() - _SETTLED_NS
    with _checked_lock:
        checked.partitions = {name: (mtime, fresh[name] if name in fresh else known[name][1])
                              for name, (_, mtime) in present.items()
                              if name not in fresh or mtime <= settled}
    return sorted(landed for name in present
                  for landed in (fresh[name] if name in fresh else known[name][1]))
