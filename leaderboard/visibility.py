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

from collections.abc import Iterable
from datetime import time
from pathlib import Path

from leaderboard.lake import LandedFile, absorbed_with_compactions, landed_files, stamp_range
from leaderboard.manifest import Manifest

__all__ = ["invisible_files", "unread_before"]


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


def invisible_files(lake: Path, version: Manifest) -> list[LandedFile]:
    """The landed files whose accepted events are on no live board of `version`."""
    return unread_before(lake, version, landed_files(lake))
