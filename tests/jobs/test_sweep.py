"""The sweep of orphan version files left by killed batch runs (jobs.sweep)."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest
from lakes import day, killed_batch, land, random_stream

from jobs.batch import run_batch
from jobs.release import set_aside
from jobs.sweep import (
    SweepRefused,
    hold_run,
    running_runs,
    sweep_dead_runs,
    sweep_orphans,
)
from leaderboard import faults
from leaderboard.manifest import list_versions, read_current
from leaderboard.registry import load_registry
from leaderboard.settings import Settings


def _settings(data: Path) -> Settings:
    return Settings.from_env({"LEADERBOARD_DATA": str(data)})


def _version_files(lake: Path) -> set[str]:
    """Every file under the version trees (rollups, standings, histograms, indexes)."""
    found = set()
    for kind in ("rollups", "standings", "histograms"):
        found |= {str(p.relative_to(lake)) for p in (lake / kind).rglob("*") if p.is_file()}
    found |= {str(p.relative_to(lake)) for p in (lake / "manifests").glob("*/*")
              if p.is_file()}
    return found


def _named(lake: Path) -> set[str]:
    """Files some manifest names (published, sealed, or set aside as rejected)."""
    from leaderboard.manifest import Manifest

    named = set()
    for path in (lake / "manifests").glob("*.json*"):
        if path.name != "current.json":
            named |= {p for p, _ in Manifest.from_json(path.read_text()).files(lake)}
    return named


def _killed_run(data: Path, as_of: date, at: str) -> None:
    """A batch run killed (SIGKILL) at fault checkpoint `at`, its files left whole."""
    killed_batch(data, as_of, at=at, cut=False)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    land(tmp_path / "lake", load_registry(),
         random_stream(11, start=day("2026-11-27"), days=4, late_share=0.1))
    return tmp_path


def test_a_killed_run_leaves_orphans_the_next_batch_sweeps(data: Path) -> None:
    """Issue 10 item 8: a run killed after writing its standings leaves files no manifest
    names; the next batch removes exactly those, nothing a version names."""
    lake = data / "lake"
    run_batch(_settings(data), date(2026, 11, 28))
    run_batch(_settings(data), date(2026, 11, 29), publish=False)  # sealed, not live
    rejected = run_batch(_settings(data), date(2026, 11, 29), publish=False).manifest
    set_aside(lake, rejected.version)  # rejected, kept for a person to look at
    kept = _version_files(lake)
    assert kept == _named(lake)
    _killed_run(data, date(2026, 11, 30), "batch.checks")
    orphans = _version_files(lake) - kept
    assert orphans, "the killed run wrote rollups and standings"
    assert not orphans & _named(lake)
    assert running_runs(lake) == set()  # the kernel released the dead run's lock

    report = sweep_orphans(lake)
    assert report.files == len(orphans)
    assert report.bytes > 0
    assert len(report.runs) == 1
    assert _version_files(lake) == kept
    assert not (lake / "rollups" / f"run={report.runs[0]}").exists()
    assert sweep_orphans(lake).files == 0

    # A batch sweeps at its start: a second kill's leftovers are gone after the next run.
    _killed_run(data, date(2026, 11, 30), "batch.standings")
    assert _version_files(lake) != kept
    live = run_batch(_settings(data), date(2026, 11, 30)).manifest
    assert read_current(lake).version == live.version  # type: ignore[union-attr]
    assert _version_files(lake) == _named(lake)
    assert {m.version for m in list_versions(lake)} >= {live.version}


def test_a_running_runs_files_are_never_swept(data: Path) -> None:
    lake = data / "lake"
    run_batch(_settings(data), date(2026, 11, 28))
    kept = _version_files(lake)
    run = "2026-11-29.20261203T000000.abcdef"
    partial = [lake / "rollups" / f"run={run}" / "part-0.parquet",
               lake / "standings" / "as_of=2026-11-29" / "board=global" / "window=daily"
               / f"part-{run}.parquet"]
    with hold_run(lake, run):
        for path in partial:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"being written")
        assert running_runs(lake) == {run}
        assert sweep_orphans(lake).files == 0
        assert all(path.exists() for path in partial)
    assert running_runs(lake) == set()
    assert sweep_orphans(lake).files == 2
    assert _version_files(lake) == kept


def test_an_unreadable_manifest_stops_the_sweep(data: Path) -> None:
    lake = data / "lake"
    _killed_run(data, date(2026, 11, 28), "batch.checks")
    before = _version_files(lake)
    (lake / "manifests").mkdir(exist_ok=True)
    (lake / "manifests" / "broken.json").write_text("{not json")
    with pytest.raises(SweepRefused, match="deletes nothing"):
        sweep_orphans(lake)
    assert _version_files(lake) == before


def test_the_sweep_at_a_batchs_start_finds_killed_runs_by_their_locks(data: Path) -> None:
    """A batch sweeps only the runs that left a lock file behind, found where they write,
    so its cost does not grow with the history (issue 13: walking every version's files
    took a third of a small night after 40 nights); the whole walk finds the rest."""
    lake = data / "lake"
    run_batch(_settings(data), date(2026, 11, 28))
    kept = _version_files(lake)
    _killed_run(data, date(2026, 11, 29), "batch.checks")
    killed = _version_files(lake) - kept
    assert killed
    assert list((lake / "runs").glob("*.lock"))  # the dead run's lock stays
    # Leftovers of a run whose lock file is gone: only the whole walk knows them.
    stray = (lake / "standings" / "as_of=2026-11-29" / "board=global" / "window=daily"
             / "part-2026-11-29.20261203T000000.abcdef.parquet")
    stray.write_bytes(b"left")
    report = sweep_dead_runs(lake)
    assert report.files == len(killed)
    assert _version_files(lake) == kept | {str(stray.relative_to(lake))}
    assert not list((lake / "runs").glob("*.lock"))
    assert sweep_dead_runs(lake).files == 0
    assert sweep_orphans(lake).files == 1
    assert _version_files(lake) == kept


def test_a_run_that_failed_with_an_error_is_swept_by_its_tombstone(data: Path) -> None:
    """A run that raised (the DAG's failed first try) keeps its lock file as a tombstone,
    so the sweep that reads only tombstones (the DAG's, the batch's) still deletes its
    files: the whole walk is no longer needed to find them (issue 13, large mode)."""
    lake = data / "lake"
    run_batch(_settings(data), date(2026, 11, 28))
    kept = _version_files(lake)
    assert not list((lake / "runs").glob("*.lock"))  # a run with a manifest leaves none
    with pytest.raises(faults.InjectedFault), faults.injected("batch.checks", faults.fail):
        run_batch(_settings(data), date(2026, 11, 29))
    failed = _version_files(lake) - kept
    assert failed
    assert len(list((lake / "runs").glob("*.lock"))) == 1
    report = sweep_dead_runs(lake)
    assert report.files == len(failed)
    assert _version_files(lake) == kept
    assert not list((lake / "runs").glob("*.lock"))


def test_a_sweep_that_dies_midway_leaves_the_tombstone_for_the_next(
        data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tombstone goes only after the run's files: a sweep that dies after deleting
    one file leaves the rest to the next sweep of tombstones (the old sweep removed the
    lock file first, and the rest stayed until a whole walk)."""
    lake = data / "lake"
    run_batch(_settings(data), date(2026, 11, 28))
    kept = _version_files(lake)
    with pytest.raises(faults.InjectedFault), faults.injected("batch.checks", faults.fail):
        run_batch(_settings(data), date(2026, 11, 29))
    assert len(_version_files(lake) - kept) > 1
    unlink = Path.unlink
    deleted: list[Path] = []

    def dies_after_one(self: Path, missing_ok: bool = False) -> None:
        if deleted:
            raise OSError("the sweep's process died (test hook)")
        deleted.append(self)
        unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", dies_after_one)
    with pytest.raises(OSError, match="test hook"):
        sweep_dead_runs(lake)
    monkeypatch.setattr(Path, "unlink", unlink)
    assert deleted
    assert _version_files(lake) != kept
    assert sweep_dead_runs(lake).files > 0
    assert _version_files(lake) == kept
    assert not list((lake / "runs").glob("*.lock"))


def test_a_batchs_sweep_reads_no_manifest_when_no_run_died(
        data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep at a batch's start sees the batch's own lock and nothing else to sweep:
    it reads no manifest (it read every version's, a cost that grew with the history:
    0.001 s a night at nights 6-10 of bench_nights --large, 0.037 s at nights 361-365)."""
    from leaderboard.manifest import Manifest

    lake = data / "lake"
    run_batch(_settings(data), date(2026, 11, 28))
    read: list[str] = []
    from_json = Manifest.from_json

    def counted(text: str) -> Manifest:
        read.append(text)
        return from_json(text)

    monkeypatch.setattr(Manifest, "from_json", counted)
    with hold_run(lake, "2026-11-29.20261203T000000.abcdef"):
        assert sweep_dead_runs(lake).files == 0
    assert read == []
