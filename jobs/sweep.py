"""Sweep the files of batch runs that died before a manifest named them.

A run writes its rollups (`rollups/run=<run>/`), standings and histograms
(`.../part-<run>.parquet`) and its two indexes (`manifests/<run>/`) in place, then the
manifest naming them. A run killed before its manifest leaves those files behind, and
nothing reads or removes them (issue 10: 72 files, 9 MB in one kill). The sweep deletes a
run's files only when no manifest names them, published or not, set aside as rejected
(`<run>.json.rejected`) included, and the run is not running.

A running run holds an exclusive lock on `runs/<run>.lock` for its whole life (from before
its first file to after its manifest). The sweep lists candidate files first, then the
running runs, then the manifests: a run that ends between those steps has written its
manifest before it released its lock, so its files are either protected by the lock or
named by a manifest the sweep reads afterwards. A killed process's lock is released by the
kernel, so a dead run is never mistaken for a running one.

The lock file is also the run's tombstone: it is removed only once the run's manifest is
written (`hold_run`, on the way out), or by a sweep after that run's files are gone. So
every run that may have left files no manifest names (killed, or failed with an error)
keeps its lock file until a sweep has deleted them, and `sweep_dead_runs` finds them all at
a cost set by the dead runs, not by the history (issue 13). The whole walk
(`sweep_orphans` without candidates) stays for lakes written before the tombstones.

`sweep_dead_runs` runs at the start of every batch (under the new run's own lock) and in
the DAG's retention task; the whole walk on demand (`leaderboard lake sweep`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from leaderboard.manifest import Manifest, manifests_dir

__all__ = ["SweepRefused", "SweepReport", "hold_run", "running_runs", "sweep_dead_runs",
           "sweep_orphans"]

_RUNS = "runs"
_REJECTED = ".json.rejected"


class SweepRefused(RuntimeError):
    """The sweep cannot tell orphans from version files (an unreadable manifest)."""


@dataclass
class SweepReport:
    """What a sweep removed: files (and bytes) of dead runs, and which runs they were."""

    files: int = 0
    bytes: int = 0
    runs: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"files": self.files, "bytes": self.bytes, "runs": self.runs}


def _lock_path(lake: Path, run: str) -> Path:
    return lake / _RUNS / f"{run}.lock"


@contextlib.contextmanager
def hold_run(lake: Path, run: str) -> Iterator[None]:
    """Mark `run` as running while the block runs (an exclusive lock the sweep respects)."""
    path = _lock_path(lake, run)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        handle: IO[bytes] = open(path, "ab")  # noqa: SIM115 - held for the whole block
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            if os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        # A sweep took the file for a dead run's between our open and our lock, and
        # removed it: lock a new one.
        handle.close()
    try:
        yield
    finally:
        # Only a run with a manifest drops its tombstone (before the unlock: a sweep never
        # sees it free); one that failed without one leaves it for the sweep to find.
        if (manifests_dir(lake) / f"{run}.json").exists():
            path.unlink(missing_ok=True)
        handle.close()


def _lock_states(lake: Path) -> tuple[set[str], set[str]]:
    """(runs whose lock is held now, runs whose lock file is left unheld: dead)."""
    running, dead = set(), set()
    for path in sorted((lake / _RUNS).glob("*.lock")):
        try:
            handle = open(path, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            continue  # the run just ended
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                running.add(path.name.removesuffix(".lock"))
                continue
            dead.add(path.name.removesuffix(".lock"))
    return running, dead


def _drop_tombstones(lake: Path, runs: set[str]) -> None:
    """Remove dead runs' lock files, each under its lock (a run id is never reused, so
    nobody else takes it): called once their files are gone, so a sweep that dies first
    leaves them to the next one."""
    for run in sorted(runs):
        path = _lock_path(lake, run)
        try:
            handle = open(path, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            continue
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            path.unlink(missing_ok=True)


def running_runs(lake: Path) -> set[str]:
    """Runs whose lock is held now (dead runs' lock files stay: the sweep removes them
    after their files)."""
    return _lock_states(lake)[0]


def _manifests(lake: Path) -> list[Manifest]:
    """Every manifest, published, unpublished or set aside as rejected. An unreadable one
    stops the sweep: its files cannot be told from orphans."""
    found = []
    for path in sorted(manifests_dir(lake).glob("*.json*")):
        if path.name == "current.json" or not (path.name.endswith(".json")
                                               or path.name.endswith(_REJECTED)):
            continue
        try:
            found.append(Manifest.from_json(path.read_text()))
        except (ValueError, TypeError) as exc:
            raise SweepRefused(f"manifest {path} is unreadable ({exc}); the sweep deletes "
                               "nothing until it is repaired or removed") from None
    return found


def _run_of(lake: Path, path: Path) -> str | None:
    """The run that wrote a version file, from its path; None for a file no run wrote."""
    relative = path.relative_to(lake).parts
    if relative[0] == "rollups" and len(relative) >= 3 and relative[1].startswith("run="):
        return relative[1].removeprefix("run=")
    if relative[0] in ("standings", "histograms") and path.name.startswith("part-"):
        return path.name.removeprefix("part-").removesuffix(".parquet")
    if relative[0] == "manifests" and len(relative) == 3:
        return relative[1]
    return None


def _candidates(lake: Path) -> list[Path]:
    found: list[Path] = []
    for kind in ("rollups", "standings", "histograms"):
        found.extend(p for p in (lake / kind).rglob("*") if p.is_file())
    found.extend(p for p in manifests_dir(lake).glob("*/*") if p.is_file())
    return sorted(found)


def _files_of(lake: Path, runs: set[str]) -> list[Path]:
    """The version files `runs` may have written, found where a run writes them (a run id
    begins with its as_of date) instead of by walking the lake."""
    found: list[Path] = []
    for run in runs:
        as_of = run.split(".", 1)[0]
        found.extend(p for p in (lake / "rollups" / f"run={run}").glob("*") if p.is_file())
        found.extend(p for p in (manifests_dir(lake) / run).glob("*") if p.is_file())
        for kind in ("standings", "histograms"):
            found.extend((lake / kind / f"as_of={as_of}").glob(f"*/*/part-{run}.parquet"))
    return sorted(found)


def sweep_dead_runs(lake: Path) -> SweepReport:
    """The sweep of runs that ended without a manifest since the last sweep, at a cost set
    by those runs, not by the history: such a run leaves its lock file behind (`hold_run`),
    and a sweep removes it only after the run's files, so its files are looked up where it
    wrote them, not by walking every version's files."""
    if not any((lake / _RUNS).glob("*.lock")):
        return SweepReport()
    return _sweep(lake, lambda dead: _files_of(lake, dead))


def sweep_orphans(lake: Path) -> SweepReport:
    """Delete the files of dead runs that no manifest names, walking every version file in
    the lake (a lake from before the tombstones); see the module docstring."""
    return _sweep(lake, lambda _dead: _candidates(lake))


def _sweep(lake: Path, candidates_of: Callable[[set[str]], list[Path]]) -> SweepReport:
    """The sweep: `candidates_of(dead runs)` lists the files it may delete.

    Order: the dead runs first (a dead run writes nothing more, so the files listed next are
    all it left, and its tombstone may go once they are deleted), then the candidates (a run
    starting later writes none of these), then the running runs (a run ending now has
    written its manifest), then the manifests."""
    _running, dead = _lock_states(lake)
    candidates = candidates_of(dead)
    if not candidates:
        # Nothing to delete (a batch's own lock is the only one, say): the manifests, as
        # many as the history's versions, are not read.
        _drop_tombstones(lake, dead)
        return SweepReport()
    running, _dead = _lock_states(lake)
    manifests = _manifests(lake)
    named_runs = {m.version for m in manifests}
    orphans = [p for p in candidates
               if (run := _run_of(lake, p)) is not None and run not in running
               and run not in named_runs]
    report = SweepReport()
    if not orphans:
        _drop_tombstones(lake, dead)
        return report
    # Versions name files of earlier runs (unchanged windows); those runs have manifests of
    # their own, so this is a second guard, paid only when there is something to delete.
    named: set[str] = set()
    for manifest in manifests:
        named.update(path for path, _rows in manifest.files(lake))
    swept: set[str] = set()
    for path in orphans:
        run = _run_of(lake, path)
        assert run is not None
        if str(path.relative_to(lake)) in named:
            continue
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            continue
        report.files += 1
        report.bytes += size
        swept.add(run)
    report.runs = sorted(swept)
    # Only a dead run's own folders: a shared one (standings/as_of=D/board=B/...) may be
    # between a running run's mkdir and its first file.
    for run in swept:
        for folder in (lake / "rollups" / f"run={run}", manifests_dir(lake) / run):
            with contextlib.suppress(OSError):
                folder.rmdir()
    _drop_tombstones(lake, dead)
    return report
