"""Erasure of a player (issue 12 part 4): no byte of the id remains under the data dir, and
everyone else's standings are what a batch of everything minus that player gives.

One data dir with every place an id can be: landed events (batch-absorbed and speed),
quarantined rows, a ban and an unban, a void of the player's result, a profile, two published
versions (rollups, standings, histograms, manifests), the warehouse, and a Redis under the
data dir with its AOF (base RDB preamble and increments).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import redis
from lakes import EXOTIC, day, killed_batch, land, random_stream, registry_from, write_registry
from oracle import reference_standings

import leaderboard.erasure as erasure_module
from app.erasure import ErasureStopped, erase_player
from jobs.batch import run_batch
from jobs.release import validate_version
from jobs.warehouse import refresh_warehouse
from leaderboard.bans import write_tombstone
from leaderboard.batch_view import BatchView
from leaderboard.lake import LandingWriter, landed_files
from leaderboard.manifest import list_versions, read_current
from leaderboard.profiles import history_of, parse_profile, write_profile
from leaderboard.redis_server import EmbeddedRedis
from leaderboard.settings import Settings
from serving.service import Leaderboards
from speed_layer.ingest import Ingestor
from speed_layer.service import SpeedLayer

pytestmark = pytest.mark.redis
VICTIM = "gdpr-victim-7Q"
START = day("2026-11-28")


def _with_victim(events: list[dict], stand_in: str) -> list[dict]:
    return [dict(e, player_id=VICTIM) if e["player_id"] == stand_in else e for e in events]


def _land_victim(settings: Settings, speed: SpeedLayer | None, seed: int, *,
                 days: int) -> None:
    """Land `days` days of a random stream from START in which p003 is the victim, folded
    into `speed` too when given."""
    land(settings.lake_dir, settings.registry, _with_victim(random_stream(
        seed, start=START, days=days, duplicate_share=0.0), "p003"), speed=speed)


def _land_victim_alone(settings: Settings) -> None:
    """A score of the victim's on the direct board `coins`, where no one else scores: the
    erasure empties its windows."""
    at = START + timedelta(hours=5)
    land(settings.lake_dir, settings.registry, [
        {"match_id": "solo-1", "board": "coins", "player_id": VICTIM, "points": 7,
         "event_time": at, "server_id": "s1", "ingested_at": at + timedelta(minutes=3)}])


def _holding(data: Path) -> list[str]:
    """Every file under the data dir holding the id, in any case (the name index holds it
    lowercased): as bytes anywhere, or (Parquet, whose pages may be compressed) in any
    value of any column."""
    needle = VICTIM.lower().encode()
    found = []
    for path in sorted(p for p in data.rglob("*") if p.is_file()):
        try:
            payload = path.read_bytes().lower()
        except FileNotFoundError:
            continue  # removed meanwhile (Redis unlinks replaced AOF files in the background)
        if needle in payload or VICTIM.lower() in str(path).lower():
            found.append(str(path.relative_to(data)))
        elif path.suffix == ".parquet" and path.stat().st_size:
            table = pq.read_table(path)
            for column in table.itercolumns():
                if pa.types.is_string(column.type) and pc.any(pc.fill_null(
                        pc.match_substring(column, VICTIM, ignore_case=True), False)).as_py():
                    found.append(f"{path.relative_to(data)} (column values)")
                    break
    return found


def _settled_holding(data: Path, rounds: int = 100) -> list[str]:
    """`_holding`, asked again while only Redis's replaced AOF files (unlinked by a
    background thread right after a rewrite) still hold the id."""
    for _ in range(rounds):
        found = _holding(data)
        if not all("appendonlydir" in f for f in found):
            return found
        if not found:
            return []
        time.sleep(0.1)
    return found


def _redis_holding(client: redis.Redis) -> list[str]:
    """Every key whose name, members, fields or values hold the id, in any case."""
    needle = VICTIM.lower().encode()
    found = []
    for key in client.scan_iter(count=1000):
        kind = client.type(key).decode()
        values: list[bytes] = [key]
        if kind == "string":
            values.append(client.get(key) or b"")
        elif kind == "hash":
            for f, v in client.hgetall(key).items():
                values += [f, v]
        elif kind == "set":
            values += list(client.smembers(key))
        elif kind == "zset":
            values += [m for m, _ in client.zrange(key, 0, -1, withscores=True)]
        if any(needle in v.lower() for v in values):
            found.append(key.decode())
    return found


def _as_the_cli(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> None:
    """The CLI's environment naming the world's data dir, registry, Redis and clock."""
    for name, value in (("LEADERBOARD_DATA", settings.data_dir),
                        ("LEADERBOARD_CONFIG", settings.data_dir / "exotic.toml"),
                        ("REDIS_URL", settings.redis_url),
                        ("LEADERBOARD_NOW", "2026-11-30T12:00:00Z")):
        monkeypatch.setenv(name, str(value))


def _standings(view: BatchView) -> dict[tuple[str, str], list[tuple]]:
    found = {}
    for board, window_id in view.windows():
        table = view.standings(board, window_id)
        found[(board, window_id)] = [tuple(r.values()) for r in table.to_pylist()]
    return found


def _histograms(view: BatchView) -> dict[tuple[str, str], list[tuple]]:
    found = {}
    for board, window_id in view.windows():
        table = view.histogram(board, window_id)
        if table is not None and table.num_rows:
            found[(board, window_id)] = [tuple(r.values()) for r in table.to_pylist()]
    return found


@pytest.fixture
def world(tmp_path):
    with _a_world(tmp_path, EXOTIC) as made:
        yield made


@contextmanager
def _a_world(tmp_path: Path, raw: dict) -> Iterator[tuple[Settings, Any, redis.Redis,
                                                           SpeedLayer]]:
    """A data dir with the registry `raw` and a Redis with AOF on (the erasure rewrites
    its files): (settings, registry, client, speed layer)."""
    data = tmp_path / "data"
    (data / "lake").mkdir(parents=True)
    config = data / "exotic.toml"
    write_registry(config, raw)
    registry = registry_from(raw)
    with EmbeddedRedis(dir=data / "redis", appendonly=True) as server:
        settings = Settings.from_env({"LEADERBOARD_DATA": str(data),
                                      "LEADERBOARD_CONFIG": str(config),
                                      "REDIS_URL": server.url,
                                      "LEADERBOARD_NOW": "2026-11-30T12:00:00Z"})
        client = redis.Redis.from_url(server.url, protocol=2)
        yield settings, registry, client, SpeedLayer(client, registry, settings.lake_dir)
        client.close()


def test_erasure_leaves_no_byte_of_the_id_and_everyone_elses_ranks_right(world, tmp_path):
    settings, registry, client, speed = world
    lake = settings.lake_dir
    # No re-deliveries past the door's horizon: the speed layer would count those twice
    # until the next batch (the documented lambda trade), which is not what this checks.
    _land_victim(settings, speed, 61, days=2)
    write_tombstone(lake, VICTIM, "ban", day("2026-11-28T12:00:00"), reason="suspected")
    write_tombstone(lake, VICTIM, "unban", day("2026-11-29T01:00:00"), reason="appeal")
    run_batch(settings, date(2026, 11, 28))
    run_batch(settings, date(2026, 11, 29))
    speed.rebase(read_current(lake))
    land(lake, registry, _with_victim(random_stream(62, start=day("2026-11-30T00:00:00"),
                                                    days=1, duplicate_share=0.0), "p005"),
         writer="live", speed=speed)
    victim_rows = [r for f in landed_files(lake)
                   for r in pq.read_table(f.path).to_pylist() if r["player_id"] == VICTIM]
    assert victim_rows
    speed.void(victim_rows[0]["match_id"], VICTIM, day("2026-11-30T10:00:00"), "typo")
    write_profile(lake, parse_profile(VICTIM, {"display_name": "Victim"}),
                  day("2026-11-30T10:00:00"), "test")
    with LandingWriter(lake, "live") as writer:  # a quarantined row naming the id
        Ingestor(registry, writer, speed).ingest(pa.table({
            "match_id": ["q1"], "player_id": [VICTIM], "points": pa.array([5], pa.int64()),
            "event_time": [day("2026-11-30T11:00:00")], "region": ["moon"],
            "mode": ["ranked"], "server_id": ["s1"]}), now=settings.now(), source="test")
    refresh_warehouse(settings.data_dir, registry)
    speed.rewrite_persistence()
    assert _holding(settings.data_dir)  # the id is everywhere before
    assert _redis_holding(client)

    result = erase_player(settings, speed, VICTIM, settle=0.0)
    assert result["lake"]["versions"] == 2  # both batches (the live one is then re-published)
    assert set(result["redis"]["rewritten"]) == {"aof"}

    assert _redis_holding(client) == []
    assert _settled_holding(settings.data_dir) == []
    # Every version is consistent with its files (the checks a publish runs).
    for manifest in list_versions(lake):
        validate_version(lake, manifest.version, registry=registry)
    # The published versions are what the batch gives for everything minus the player:
    # a fresh lake of the erased events, recomputed in full as of the live night.
    twin = tmp_path / "twin"
    shutil.copytree(lake / "events", twin / "lake" / "events")
    shutil.copytree(lake / "bans", twin / "lake" / "bans", dirs_exist_ok=True)
    (twin / "lake" / "voids").mkdir(parents=True)
    twin_settings = Settings.from_env({"LEADERBOARD_DATA": str(twin),
                                       "LEADERBOARD_CONFIG": str(settings.config)})
    live = read_current(lake)
    run_batch(twin_settings, live.as_of_date, full=True)
    erased_view, fresh_view = BatchView(lake, live), BatchView(
        twin / "lake", read_current(twin / "lake"))
    fresh = _standings(fresh_view)
    for key, rows in _standings(erased_view).items():
        assert rows == fresh.get(key, []), key
    assert _histograms(erased_view) == _histograms(fresh_view)
    # Merged answers (batch + speed) equal the batch of everything minus the player.
    served = Leaderboards(lake, registry, client, now=lambda: day("2026-12-05T00:00:00"))
    reference = reference_standings(lake, registry, None, watermark=day("2100-01-01T00:00:00"))
    for (board, window_id), rows in reference.items():
        merged = served.merged(board, window_id)
        assert [(e.player_id, e.rank) for e in merged.top(len(rows) + 3)] == [
            (r.player_id, r.rank) for r in rows], (board, window_id)
    # A later event of the id is refused as erased, quarantined by hash, not by id.
    with LandingWriter(lake, "live") as writer:
        report = Ingestor(registry, writer, speed).ingest(pa.table({
            "match_id": ["again"], "player_id": [VICTIM], "points": pa.array([5], pa.int64()),
            "event_time": [day("2026-11-30T11:30:00")], "region": ["na"], "mode": ["ranked"],
            "server_id": ["s1"]}), now=settings.now(), source="test")
    assert (report.accepted, report.rejected) == (0, 1)
    assert report.reasons == {"erased": 1}
    assert _settled_holding(settings.data_dir) == []


def test_erasing_an_id_the_lake_never_held_rewrites_no_version(world):
    """Regression (noted in session 8): erasing an id the lake never held rewrote every
    manifest and its indexes (the same content, new files) and answered them all as
    `versions`. Now no version is touched and the answer counts none."""
    settings, _registry, _client, speed = world
    lake = settings.lake_dir
    _land_victim(settings, speed, 75, days=1)
    run_batch(settings, date(2026, 11, 28))
    run_batch(settings, date(2026, 11, 28), publish=False)  # a second, sealed version

    def versions() -> dict[str, tuple[int, bytes]]:
        return {str(p.relative_to(lake)): (p.stat().st_mtime_ns, p.read_bytes())
                for p in (lake / "manifests").rglob("*") if p.is_file()}

    before = versions()
    result = erase_player(settings, speed, "never-seen-1", settle=0.0)
    assert (result["lake"]["rows"], result["lake"]["versions"]) == (0, 0)
    assert versions() == before
    # The victim's erasure still rewrites both.
    assert erase_player(settings, speed, VICTIM, settle=0.0)["lake"]["versions"] == 2


def test_no_server_answers_from_an_old_version_once_the_erasure_returns(world):
    """Regression (a CI run: the console's erase confirmed, then the player still `ranked`):
    a server reuses the version pointer it read for a second, so right after an erasure it
    answered from the old version's cached base arrays, the id in them. The erasure now
    waits `settle` seconds after the pointer moved before it deletes the old versions' keys
    and returns: a reader holding the old pointer is answered consistently (old version,
    keys still there) while it waits, and from the erased version after."""
    settings, registry, client, speed = world
    lake = settings.lake_dir
    _land_victim(settings, speed, 63, days=2)
    run_batch(settings, date(2026, 11, 29))
    old = speed.rebase(read_current(lake))
    clock = [0.0]
    reader = Leaderboards(lake, registry, client, now=settings.now, pointer_ttl=1.0)
    reader._clock = lambda: clock[0]
    before = reader.player("global", VICTIM)
    assert before["status"] == "ranked"  # and the reader holds the old pointer from now

    waits: list[tuple[float, bool, str]] = []

    def sleep(seconds: float) -> None:
        moved = speed.current().tag != old.tag
        waits.append((seconds, moved, reader.player("global", VICTIM)["status"]))
        clock[0] += seconds

    erase_player(settings, speed, VICTIM, settle=1.0, sleep=sleep)
    # One wait of `settle`, after the pointer moved, while the old version still answered.
    assert waits == [(1.0, True, "ranked")]
    after = reader.player("global", VICTIM)
    assert (after["status"], after["rank"]) == ("unranked", None)
    assert reader.version().version.tag == speed.current().tag


def test_an_erasure_killed_before_its_manifest_leaves_files_the_nightly_sweep_removes(
        world, monkeypatch):
    """Regression (review): the erasure re-published the live version without a run lock,
    so the index files of a republish that died before its manifest were found only by a
    manual whole-lake sweep (the DAG sweeps by tombstones now). It holds a run lock like a
    batch: the lock stays as the tombstone and the nightly `sweep_dead_runs` removes them."""
    import leaderboard.manifest as manifest_module
    from jobs.sweep import sweep_dead_runs

    settings, _registry, _client, speed = world
    lake = settings.lake_dir
    _land_victim(settings, speed, 64, days=2)
    run_batch(settings, date(2026, 11, 29))
    live = read_current(lake)
    real = manifest_module.atomic_write_bytes

    def die_at_the_manifest(target: Path, payload: bytes) -> None:
        if (target.suffix == ".json" and target.parent == lake / "manifests"
                and target.stem not in (live.version, "current")):  # the republish's own
            raise OSError("killed before the manifest")
        real(target, payload)

    monkeypatch.setattr(manifest_module, "atomic_write_bytes", die_at_the_manifest)
    with pytest.raises(ErasureStopped, match="killed before the manifest"):
        erase_player(settings, speed, VICTIM, settle=0.0)
    monkeypatch.undo()
    strays = [p for p in (lake / "manifests").iterdir()
              if p.is_dir() and p.name != live.version]
    assert len(strays) == 1
    assert any(strays[0].iterdir())  # the republish's index files
    assert read_current(lake).version == live.version
    report = sweep_dead_runs(lake)
    assert (report.files, report.runs) == (2, [strays[0].name])
    assert not strays[0].exists() or not any(strays[0].iterdir())
    assert sweep_dead_runs(lake).runs == []  # its tombstone went with its files


@pytest.mark.parametrize("stop", ["before_the_versions", "at_a_histogram", "at_the_rebase"])
def test_an_erasure_stopped_part_way_is_finished_by_the_next_run(world, monkeypatch, stop):
    """Regression (review s9b, finding 1): an erasure stopped after rewriting lake files
    (a kill, a full disk), then run again, found nothing of the id left: it skipped the
    versions, the re-publish, the rebase and Redis, so every version's indexes no longer
    matched its files (validate_version failed) and Redis still served the player. A
    marker beside the ledger (no id in it) now says an erasure is under way and lists the
    files it set out to rewrite; the next run reads the index entries of those files from
    them (a window only the player held has none: review s9d) and does everything after
    the lake. A run stopped between a standings file and its histogram left the histogram
    counting the player for good: the histogram is written first now, so the next run finds
    the player in the standings file again."""
    import jobs.erase as erase_module

    settings, registry, client, speed = world
    lake = settings.lake_dir
    _land_victim(settings, speed, 77, days=2)
    _land_victim_alone(settings)
    run_batch(settings, date(2026, 11, 28))
    run_batch(settings, date(2026, 11, 29))
    speed.rebase(read_current(lake))
    assert _redis_holding(client)
    real_write = erase_module.atomic_write_parquet

    def stopped(*_args: object, **_kwargs: object) -> None:
        raise OSError("stopped")

    def stopped_at_a_histogram(table: pa.Table, path: Path, **kwargs: object) -> None:
        if "histograms" in path.relative_to(lake).parts[:1]:
            raise OSError("stopped")
        real_write(table, path, **kwargs)

    if stop == "before_the_versions":
        monkeypatch.setattr(erase_module, "_versions", stopped)
    elif stop == "at_the_rebase":  # the lake and its versions done, Redis not
        monkeypatch.setattr(speed, "rebase", stopped)
    else:
        monkeypatch.setattr(erase_module, "atomic_write_parquet", stopped_at_a_histogram)
    # A failed write stops it with a sentence (ErasureStopped).
    with pytest.raises(ErasureStopped, match="stopped"):
        erase_player(settings, speed, VICTIM, settle=0.0)
    monkeypatch.undo()

    result = erase_player(settings, speed, VICTIM, settle=0.0)
    for manifest in list_versions(lake):
        validate_version(lake, manifest.version, registry=registry)
        for entry in manifest.standings(lake).to_pylist():  # validate_version reads none
            if entry["histogram"]:
                windows = pq.read_table(lake / entry["histogram"], columns=["window_id"])
                assert entry["histogram_rows"] == windows.column("window_id").to_pylist(
                    ).count(entry["window_id"]), entry
    assert _redis_holding(client) == []
    assert _settled_holding(settings.data_dir) == []
    # Each histogram counts the players its window's standings hold, in every kind.
    for path in (lake / "histograms").rglob("*.parquet"):
        standings = pq.read_table(lake / "standings" / path.relative_to(lake / "histograms"))
        ranked = {w: standings.column("window_id").to_pylist().count(w)
                  for w in set(standings.column("window_id").to_pylist())}
        counted: dict[tuple[str, str], int] = {}
        for row in pq.read_table(path).to_pylist():
            key = (row["window_id"], row["kind"])
            counted[key] = counted.get(key, 0) + row["players"]
        assert counted == {(w, k): ranked[w] for w, k in counted}, path
    assert result["lake"]["resumed"] is True
    assert result["version"] is not None  # re-published
    # Done: the next run of it is an ordinary one (nothing of the id left, nothing to do).
    again = erase_player(settings, speed, VICTIM, settle=0.0)
    assert (again["lake"]["resumed"], again["version"]) == (False, None)



@pytest.mark.parametrize("tombstone", [True, False])
def test_an_erasure_after_a_killed_batch_sweeps_its_files_and_finishes(world, tombstone):
    """A batch killed mid-write leaves Parquet files cut short that no manifest names; the
    erasure deletes them first (the killed run's lock file says whose they are; without
    it, a lake from before those, the whole walk after the first unreadable file) and then
    erases the player everywhere, on the first try."""
    settings, registry, client, speed = world
    lake = settings.lake_dir
    _land_victim(settings, speed, 79, days=2)
    run_batch(settings, date(2026, 11, 28))
    speed.rebase(read_current(lake))
    run = killed_batch(settings.data_dir, date(2026, 11, 29),
                       env={"LEADERBOARD_CONFIG": str(settings.config)})
    left = sorted(lake.rglob(f"*{run}*"))
    assert any(p.suffix == ".parquet" for p in left)
    if not tombstone:
        (lake / "runs" / f"{run}.lock").unlink()
    served = Leaderboards(lake, registry, client, now=settings.now)
    assert served.player("global", VICTIM)["status"] == "ranked"

    result = erase_player(settings, speed, VICTIM, settle=0.0)
    assert result["status"] == "erased"
    assert result["lake"]["unreadable"] == []
    assert result["lake"]["swept"] >= len([p for p in left if p.is_file()
                                           and p.suffix == ".parquet"])
    assert sorted(lake.rglob(f"*{run}*")) == []
    assert not list((lake / "erasure").glob("pending-*"))  # done, nothing to resume
    served = Leaderboards(lake, registry, client, now=settings.now)
    assert served.player("global", VICTIM)["status"] == "unranked"
    for manifest in list_versions(lake):
        validate_version(lake, manifest.version, registry=registry)
    assert _redis_holding(client) == []
    assert _settled_holding(settings.data_dir) == []


def test_an_erasure_that_cannot_read_a_versions_file_says_what_remains(world, monkeypatch,
                                                                      capsys):
    """A file a version names that cannot be read (damaged on disk) is not a killed run's:
    no sweep takes it. The erasure does the rest, names the file in its answer (status
    `incomplete`, and the CLI's sentence, exit 1), and stays under way: each night's batch
    says to run it again, and a run after the file is restored finishes it."""
    from app.cli import main

    settings, registry, client, speed = world
    lake = settings.lake_dir
    _land_victim(settings, speed, 80, days=2)
    run_batch(settings, date(2026, 11, 28))
    speed.rebase(read_current(lake))
    named = sorted(lake.glob("rollups/*/*.parquet"))[0]
    whole = named.read_bytes()
    os.truncate(named, len(whole) // 2)
    relative = str(named.relative_to(lake))

    result = erase_player(settings, speed, VICTIM, settle=0.0)
    assert result["status"] == "incomplete"
    assert result["lake"]["unreadable"] == [relative]
    assert relative in result["remains"]
    assert result["lake"]["rows"] > 0  # the rest was erased
    assert list((lake / "erasure").glob("pending-*"))  # still under way
    said: list[str] = []
    run_batch(settings, date(2026, 11, 28), publish=False, step=said.append)
    assert any("1 erasure(s) stopped part-way" in s for s in said), said
    _as_the_cli(monkeypatch, settings)
    assert main(["erase", VICTIM, "--yes"]) == 1
    printed = capsys.readouterr()
    assert f"could not be read and may still hold the id: {relative}" in printed.err
    assert "Traceback" not in printed.err

    named.write_bytes(whole)  # restored from a backup
    result = erase_player(settings, speed, VICTIM, settle=0.0)
    assert (result["status"], result["lake"]["resumed"]) == ("erased", True)
    assert not list((lake / "erasure").glob("pending-*"))
    for manifest in list_versions(lake):
        validate_version(lake, manifest.version, registry=registry)
    assert _redis_holding(client) == []
    assert _settled_holding(settings.data_dir) == []


def _erase_over_http(settings: Settings, client: redis.Redis, player: str) -> Any:
    """`DELETE /v1/admin/players/{player}` on an app over the world's data dir."""
    import warnings

    from app.http import ApiKeys, HttpConfig, create_app

    with warnings.catch_warnings():  # starlette suggests httpx2; httpx is installed
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient
    admin = "admin-key-0123456789abcdef"
    keys = ApiKeys.parse({"servers": {"eu-1": "eu-1-key-0123456789abcdef"},
                          "admin_key": admin})
    with TestClient(create_app(settings, HttpConfig(keys=keys), client=client)) as http:
        return http.delete(f"/v1/admin/players/{player}", headers={"X-Admin-Key": admin})


#: Where a full disk stops an erasure: (what is written, the name the sentence gives it,
#: whether the ledger holds the id by then, whether the boards are clean by then).
_FULL_DISK_AT = {
    "the ledger": ("erasure/ledger.json", False, False),
    "a swept file": ("events/ingest_date=", True, False),
    "a landed file": ("events/ingest_date=", True, False),
    "a manifest": ("manifests/", True, False),
    "the re-publish": ("manifests/current.json", True, False),
    "Redis's append-only file": ("Redis's append-only file", True, True),
    "the warehouse": ("warehouse", True, True),
}


@pytest.mark.parametrize("written", list(_FULL_DISK_AT))
def test_an_erasure_that_cannot_write_a_file_stops_and_is_finished_by_running_it_again(
        world, monkeypatch, capsys, written):
    """A full disk at any write of the erasure (the ledger of erasures, its first; the sweep
    of a killed run's file; a landed file written back without the player; a version's
    manifest; the live pointer's move; Redis's rewrite of its append-only file; the
    warehouse): nothing is damaged, so the answer is
    not "could not be read ... restore from a backup" nor a 500 or a traceback, but a stop
    naming the file and the cause, saying whether the id is refused at ingest yet (not when
    the ledger was the write that failed) and that the player can still be shown until a
    new run finishes, to fix and run again (HTTP 503 `erasure_stopped`; CLI exit 1 with the
    sentence); a run once the disk has room finishes it, every version in line with its
    files."""
    import errno

    import jobs.erase as erase_module
    from app.cli import main
    from leaderboard.erasure import ErasureLedger

    settings, registry, client, speed = world
    lake = settings.lake_dir
    named, refused, boards_clean = _FULL_DISK_AT[written]
    _land_victim(settings, speed, 81, days=2)
    run_batch(settings, date(2026, 11, 28))
    speed.rebase(read_current(lake))
    refresh_warehouse(settings.data_dir, registry)
    real = erasure_module.atomic_write_parquet

    def full_disk(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def full_disk_at(folder: str, write: Callable[..., None]) -> Callable[..., None]:
        def maybe(target: Path, *args: object, **kwargs: object) -> None:
            if str(target).startswith(str(lake / folder)):
                full_disk()
            write(target, *args, **kwargs)
        return maybe

    with monkeypatch.context() as patch:
        if written == "the ledger":
            patch.setattr(erasure_module, "atomic_write_bytes", full_disk_at(
                "erasure/ledger.json", erasure_module.atomic_write_bytes))
        elif written == "a swept file":
            swept = next(iter(sorted((lake / "events").rglob("*.parquet"))))

            def sweep_that_fails(_lake: Path) -> None:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(swept))

            patch.setattr(erase_module, "sweep_dead_runs", sweep_that_fails)
        elif written == "a landed file":
            patch.setattr(erasure_module, "atomic_write_parquet", full_disk)
        elif written == "a manifest":
            patch.setattr(erase_module, "write_version", full_disk)
        elif written == "the re-publish":
            import leaderboard.manifest as manifest_module
            patch.setattr(manifest_module, "atomic_write_bytes", full_disk_at(
                "manifests/current.json", manifest_module.atomic_write_bytes))
        elif written == "Redis's append-only file":  # a full disk on Redis's side
            real_info = redis.Redis.info

            def info_after_a_failed_rewrite(self: redis.Redis, *args: Any, **kwargs: Any
                                            ) -> Any:
                found = real_info(self, *args, **kwargs)
                return (dict(found, aof_last_bgrewrite_status="err")
                        if args[:1] == ("persistence",) else found)

            patch.setattr(redis.Redis, "info", info_after_a_failed_rewrite)
        else:
            import jobs.warehouse as warehouse_module
            patch.setattr(warehouse_module, "_refresh", full_disk)
        answer = _erase_over_http(settings, client, VICTIM)
        assert answer.status_code == 503, answer.text
        body = answer.json()
        assert body["error"] == "erasure_stopped"
        message = body["message"]
        assert named in message
        assert ("aof_last_bgrewrite_status: err" if "Redis" in written
                else "No space left on device") in message
        assert "erase the player again" in message
        assert "backup" not in message
        assert ErasureLedger.load(lake).erased(VICTIM) is refused
        assert ("the id is refused at ingest" in message) is refused
        assert ("NOT refused at ingest yet" in message) is not refused
        assert ("can still be shown on the public boards" in message) is not boards_clean
        assert "until the erasure is run again and finishes" in message
        _as_the_cli(patch, settings)
        assert main(["erase", VICTIM, "--yes"]) == 1
        printed = capsys.readouterr()
        assert "could not be written (" in printed.err
        assert named in printed.err
        assert "backup" not in printed.err
        assert "Traceback" not in printed.err
    assert erasure_module.atomic_write_parquet is real
    result = erase_player(settings, speed, VICTIM, settle=0.0)
    assert result["status"] == "erased"
    assert result["lake"]["resumed"] is refused  # a run stopped at its ledger left nothing
    assert ErasureLedger.load(lake).erased(VICTIM)
    assert not list((lake / "erasure").glob("pending-*"))
    for manifest in list_versions(lake):
        validate_version(lake, manifest.version, registry=registry)
    assert _redis_holding(client) == []
    assert _settled_holding(settings.data_dir) == []


def test_an_erasure_that_cannot_read_a_landed_file_asks_for_it_restored(world):
    """A landed file cut short (damaged on disk) cannot be read: the erasure does the rest
    and answers `incomplete` naming the file and asking for it restored from a backup
    (the write failure's sentence is not given for it)."""
    settings, _registry, _client, _speed = world
    lake = settings.lake_dir
    _land_victim(settings, None, 82, days=1)
    landed = landed_files(lake)[0].path
    os.truncate(landed, landed.stat().st_size // 2)
    result = erase_player(settings, None, VICTIM, settle=0.0)
    assert result["status"] == "incomplete"
    assert result["lake"]["unreadable"] == [str(landed.relative_to(lake))]
    assert "could not be read" in result["remains"]
    assert "Restore those files from a backup" in result["remains"]
    assert "could not be written" not in result["remains"]


def _stop_an_erasure(settings: Settings, speed: SpeedLayer, player: str,
                     monkeypatch: pytest.MonkeyPatch) -> None:
    """An erasure of `player` stopped after the lake's files, before the versions."""
    import jobs.erase as erase_module

    def stopped(*_args: object, **_kwargs: object) -> None:
        raise OSError("stopped")

    with monkeypatch.context() as patch:
        patch.setattr(erase_module, "_versions", stopped)
        with pytest.raises(ErasureStopped, match="stopped"):
            erase_player(settings, speed, player, settle=0.0)


def test_a_stopped_erasure_does_not_stop_the_nightly_batch_or_other_erasures(
        world, monkeypatch):
    """Regression (review s9c, findings 1 and 3): after an erasure stopped part-way, the
    nightly batch failed ("rollups count 155 events, expected 160": the versions disagreed
    with the files the erasure had rewritten) and so did another player's erasure (at the
    rebase), until someone ran the stopped one again; and that run crashed for good on a
    set-aside version naming a file gone. The marker lists the files the erasure set out
    to rewrite: the batch first brings the versions naming them in line (under the barrier
    held exclusively), other erasures do too, and only versions naming them are read."""
    from jobs.release import set_aside

    settings, registry, client, speed = world
    lake = settings.lake_dir
    _land_victim(settings, speed, 78, days=2)
    _land_victim_alone(settings)
    run_batch(settings, date(2026, 11, 28))
    aside = run_batch(settings, date(2026, 11, 28), publish=False).manifest
    set_aside(lake, aside.version)
    for path in aside.standings(lake).column("path").to_pylist()[:1]:
        (lake / path).unlink()  # why a version is set aside: a file of it is gone
    speed.rebase(read_current(lake))
    _stop_an_erasure(settings, speed, VICTIM, monkeypatch)

    said: list[str] = []
    run_batch(settings, date(2026, 11, 29), step=said.append)  # it failed its checks
    for manifest in list_versions(lake):
        validate_version(lake, manifest.version, registry=registry)
    assert any("brought in line" in s for s in said), said
    assert any("1 erasure(s) stopped part-way" in s for s in said), said
    said.clear()  # once: the next night does not read them again, but still says so
    run_batch(settings, date(2026, 11, 29), publish=False, step=said.append)
    assert not any("brought in line" in s for s in said), said
    assert any("1 erasure(s) stopped part-way" in s for s in said), said
    speed.rebase(read_current(lake))
    assert erase_player(settings, speed, "p004", settle=0.0)["lake"]["rows"] > 0
    for manifest in list_versions(lake):
        validate_version(lake, manifest.version, registry=registry)
    result = erase_player(settings, speed, VICTIM, settle=0.0)  # crashed on the set-aside
    assert result["lake"]["resumed"] is True
    assert _redis_holding(client) == []
    assert _settled_holding(settings.data_dir) == []
    assert not list((lake / "erasure").glob("pending-*"))  # both done

def test_an_operators_free_text_naming_the_player_is_redacted(world):
    """Regression (audit of issue 12): the reason of another player's ban, of a whole
    match's void and another player's display name are free text, and named the erased id
    ("smurf of <id>"): those rows stayed as written, so the id stayed in the lake. They
    keep their place (the ban and the void still hold, the name is still set) with the id,
    as a token, replaced by `[erased]`. Regression (review s8, finding 2): the name was
    redacted in the lake only; the serving cache (`{lb:profiles}` and its name index,
    lowercased) kept it, and the AOF rewrite wrote it out again. The byte checks are
    case-insensitive now, so the index's lowercased copy counts."""
    from leaderboard.bans import read_tombstones
    from leaderboard.erasure import REDACTED
    from leaderboard.voids import read_voids
    from serving.profiles import ProfileCache

    settings, _registry, client, speed = world
    lake = settings.lake_dir
    _land_victim(settings, speed, 65, days=1)
    at = day("2026-11-30T10:00:00")
    write_tombstone(lake, "p004", "ban", at, reason=f"smurf of {VICTIM},{VICTIM}")
    speed.void("m-other", None, at, f"{VICTIM} used an aimbot")
    cache = ProfileCache(client, lake)
    cache.store([write_profile(lake, parse_profile("p005", {"display_name": f"fan of {VICTIM}"}),
                               at, "t")])  # as `profile set` and PUT do
    assert _holding(settings.data_dir)

    erase_player(settings, speed, VICTIM, settle=0.0)

    assert _redis_holding(client) == []
    assert _settled_holding(settings.data_dir) == []
    assert cache.get("p005")["display_name"] == f"fan of {REDACTED}"
    assert [p["player_id"] for p in cache.find(f"fan of {REDACTED}")] == ["p005"]
    [ban] = [t for t in read_tombstones(lake).to_pylist() if t["player_id"] == "p004"]
    assert (ban["action"], ban["reason"]) == ("ban", f"smurf of {REDACTED},{REDACTED}")
    [void] = [v for v in read_voids(lake) if v.match_id == "m-other"]
    assert void.reason == f"{REDACTED} used an aimbot"
    assert [p.display_name for p in history_of(lake, "p005")] == [f"fan of {REDACTED}"]


def test_free_text_naming_an_erased_id_written_afterwards_is_redacted(world, monkeypatch):
    """Regression (noted in session 8): a ban's or a void's reason, or a display name,
    written after the erasure and naming the erased id put the id back into the lake (and
    the name into Redis), for good: no later erasure runs for it. Each write redacts it as
    the erasure would have: HTTP and CLI alike (the lake's writers do it)."""
    from app.cli import main
    from leaderboard.bans import read_tombstones
    from leaderboard.erasure import REDACTED
    from leaderboard.voids import read_voids

    settings, _registry, client, speed = world
    lake = settings.lake_dir
    _land_victim(settings, speed, 74, days=1)
    erase_player(settings, speed, VICTIM, settle=0.0)
    _as_the_cli(monkeypatch, settings)
    assert main(["ban", "p004", "--reason", f"alt of {VICTIM}"]) == 0
    assert main(["void", "m74-1", "--reason", f"{VICTIM} boosted it"]) == 0
    assert main(["profile", "set", "p005", "--name", f"fan of {VICTIM}"]) == 0

    assert _redis_holding(client) == []
    assert _settled_holding(settings.data_dir) == []
    [ban] = [t for t in read_tombstones(lake).to_pylist() if t["player_id"] == "p004"]
    assert ban["reason"] == f"alt of {REDACTED}"
    [void] = [v for v in read_voids(lake) if v.match_id == "m74-1"]
    assert void.reason == f"{REDACTED} boosted it"
    assert [p.display_name for p in history_of(lake, "p005")] == [f"fan of {REDACTED}"]


def test_an_erasure_on_a_redis_cluster_rewrites_every_nodes_files(redis_cluster, tmp_path):
    """Regression (audit of issue 12): on a Redis Cluster with AOF on, the erasure died at
    BGREWRITEAOF (a command with no key: the cluster client cannot route it; the CLI printed
    a traceback, the HTTP route a 500), and every node's AOF kept the id. Now each node
    rewrites its own files, and no node's AOF holds the id."""
    from leaderboard.speed_keys import connect

    for node in redis_cluster.nodes:  # AOF on: each node writes a base file, then appends
        node.config_set("appendonly", "yes")
    data = tmp_path / "data"
    (data / "lake").mkdir(parents=True)
    settings = Settings.from_env({"LEADERBOARD_DATA": str(data),
                                  "REDIS_URL": redis_cluster.url,
                                  "LEADERBOARD_NOW": "2026-11-30T12:00:00Z"})
    speed = SpeedLayer(connect(settings), settings.registry, settings.lake_dir)
    land(settings.lake_dir, settings.registry, _with_victim(random_stream(
        66, start=START, days=2, duplicate_share=0.0), "p003"), speed=speed)
    run_batch(settings, date(2026, 11, 28))
    speed.rebase(read_current(settings.lake_dir))
    node_dirs = [tmp_path / f"cluster-node-{n.connection_pool.connection_kwargs['port']}"
                 for n in redis_cluster.nodes]
    assert any(_holding(d) for d in node_dirs)  # the id is in the nodes' AOF increments

    result = erase_player(settings, speed, VICTIM, settle=0.0)

    assert result["redis"]["rewritten"] == ["aof"]
    assert [f for d in node_dirs for f in _settled_holding(d)] == []
    assert _settled_holding(data) == []


def _erasure_waits(monkeypatch: pytest.MonkeyPatch) -> Any:
    """An Event set when an erasure (or a job sharing the barrier) finds the erasure
    barrier held and starts to wait for it (the barrier's flock tried without blocking
    first): how a test knows it is waiting without timing it."""
    import fcntl
    from types import SimpleNamespace


    waiting = threading.Event()

    def flock(handle: Any, operation: int) -> None:
        try:
            fcntl.flock(handle, operation | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            waiting.set()
        fcntl.flock(handle, operation)

    monkeypatch.setattr(erasure_module, "fcntl", SimpleNamespace(
        flock=flock, LOCK_EX=fcntl.LOCK_EX, LOCK_SH=fcntl.LOCK_SH, LOCK_NB=fcntl.LOCK_NB))
    return waiting


class _Meanwhile:
    """The forced interleaving the barrier tests share: `start()`, called from a patched
    step of the job under test, runs `job` in a thread and goes on once that thread has
    finished (the old code: nothing made it wait) or is waiting at the erasure barrier,
    and records which in `seen`. Only the first call starts the thread."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, job: Callable[[], object]) -> None:
        self.waiting = _erasure_waits(monkeypatch)
        self.done = threading.Event()
        self.errors: list[BaseException] = []
        self.results: list[object] = []
        self.seen: list[str] = []
        self._thread = threading.Thread(target=self._run, args=(job,))

    def _run(self, job: Callable[[], object]) -> None:
        try:
            self.results.append(job())
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)
        finally:
            self.done.set()

    def start(self) -> None:
        if self.seen or threading.current_thread() is self._thread:
            return  # started already, or the job's own pass through the patched step
        self._thread.start()
        while not (self.done.wait(0.05) or self.waiting.is_set()):
            pass
        self.seen.append("finished" if self.done.is_set() else "waits")

    def join(self) -> None:
        self._thread.join()

    def before_writes_of(self, monkeypatch: pytest.MonkeyPatch, module: Any) -> None:
        """Start before the first Parquet write of `module` (its `atomic_write_parquet`):
        for an erasure, about to write its first rewritten file. The job's own writes
        there (another erasure's) go straight through."""
        real = module.atomic_write_parquet

        def start_then_write(table: pa.Table, path: Path, **kwargs: object) -> None:
            self.start()
            real(table, path, **kwargs)

        monkeypatch.setattr(module, "atomic_write_parquet", start_then_write)


def _an_eraser(monkeypatch: pytest.MonkeyPatch, settings: Settings,
               speed: SpeedLayer | None) -> _Meanwhile:
    """The victim's erasure, to run meanwhile."""
    return _Meanwhile(monkeypatch, lambda: erase_player(settings, speed, VICTIM, settle=0.0))


def test_two_erasures_at_once_each_remove_their_player(world, monkeypatch):
    """Regression (audit of issue 12): two erasures at once (two DELETE requests: the
    route runs in a thread pool) each read a file and wrote it back without their own
    player only, so one removal was lost (or a read met a file mid-replace: a 500). One
    erasure now waits for the other (`erasure_barrier`). Forced interleaving: the first
    erasure, about to write its first rewritten file, starts the second and goes on once
    the second has finished (the old code: the first then wrote back the second's player)
    or waits at the barrier."""
    settings, _registry, _client, speed = world
    lake = settings.lake_dir
    _land_victim(settings, speed, 67, days=1)
    other = "p004"

    def players() -> set[str]:
        return {r["player_id"] for f in landed_files(lake)
                for r in pq.read_table(f.path, columns=["player_id"]).to_pylist()}

    assert {VICTIM, other} <= players()
    second = _Meanwhile(monkeypatch, lambda: erase_player(settings, speed, other, settle=0.0))
    second.before_writes_of(monkeypatch, erasure_module)
    erase_player(settings, speed, VICTIM, settle=0.0)
    second.join()
    assert second.errors == []
    assert second.seen == ["waits"]  # the second erasure could not run meanwhile
    assert not {VICTIM, other} & players()
    assert _settled_holding(settings.data_dir) == []


def test_an_erasure_during_a_batch_run_waits_and_leaves_no_byte_in_its_version(
        world, monkeypatch):
    """Regression (audit of issue 12): an erasure while a batch run had rolled up the
    events but not yet written them made the run refuse to publish (its standings no
    longer added up to the points it had counted: "not publishing", the night lost until a
    retry). The erasure now waits for
    the run (`erasure_barrier`, shared by batch runs) and then erases its version too.
    Forced interleaving: with the events rolled up, not yet written, the run starts the
    erasure and goes on once it has finished (the old code) or waits at the barrier."""
    import jobs.batch as batch_module

    settings, _registry, _client, speed = world
    lake = settings.lake_dir
    _land_victim(settings, speed, 68, days=2)
    run_batch(settings, date(2026, 11, 28))
    eraser = _an_eraser(monkeypatch, settings, speed)
    real = batch_module.checkpoint

    def erase_meanwhile(name: str) -> None:
        if name == "batch.rollups":
            eraser.start()
        real(name)

    monkeypatch.setattr(batch_module, "checkpoint", erase_meanwhile)
    run_batch(settings, date(2026, 11, 29))
    eraser.join()
    assert eraser.errors == []
    assert eraser.seen == ["waits"]  # the erasure could not run meanwhile
    assert read_current(lake).as_of == "2026-11-29"
    assert _settled_holding(settings.data_dir) == []


def test_an_erasure_during_a_compaction_waits_for_it(world, monkeypatch):
    """Regression (audit of issue 12): an erasure between a compaction's record (the
    originals' row count and checksum) and its write rewrote the originals, and the
    compaction stopped with "the originals ... no longer hold the rows it recorded; ...
    check the partition by hand". The erasure now waits for the compaction
    (`erasure_barrier`, shared by compactions), then erases the compacted file. Forced
    interleaving as for the batch run above."""
    import jobs.compact as compact_module
    from jobs.compact import SpeedWatermark, compact_partition
    from leaderboard.manifest import watermark_for

    settings, _registry, _client, speed = world
    lake = settings.lake_dir
    _land_victim(settings, speed, 69, days=2)
    run_batch(settings, date(2026, 11, 28))
    eraser = _an_eraser(monkeypatch, settings, speed)
    real = compact_module._write_target

    def erase_meanwhile(lake_dir: Path, record: dict) -> Path:
        eraser.start()
        return real(lake_dir, record)

    monkeypatch.setattr(compact_module, "_write_target", erase_meanwhile)
    report = compact_partition(lake, START.date(), speed=SpeedWatermark(
        present=True, watermark=watermark_for(START.date()), version="v"))
    eraser.join()
    assert eraser.errors == []
    assert eraser.seen == ["waits"]  # the erasure could not run meanwhile
    assert len(report.compacted) == 1
    assert _settled_holding(settings.data_dir) == []


def test_retention_during_an_erasure_waits_for_it(tmp_path, monkeypatch):
    """Regression (audit of issue 12): retention deleting an expired partition while an
    erasure was rewriting that partition's files: the erasure died writing its rewritten
    file into the deleted partition (FileNotFoundError). Retention now waits for
    the erasure (`erasure_barrier`). Forced interleaving: the erasure, about to write its
    first rewritten file, starts retention and goes on once retention has finished (the
    old code) or waits at the barrier. No speed layer here: the lake's part is what
    matters."""
    from jobs.compact import SpeedWatermark
    from jobs.retention import apply_retention

    data = tmp_path / "data"
    settings = Settings.from_env({"LEADERBOARD_DATA": str(data)})
    land(settings.lake_dir, settings.registry, _with_victim(random_stream(
        70, start=START, days=3, duplicate_share=0.0), "p003"))
    for night in range(3):
        run_batch(settings, START.date() + timedelta(days=night))
    as_of = START.date() + timedelta(days=2)
    other = _Meanwhile(monkeypatch, lambda: apply_retention(
        settings.lake_dir, as_of, 1, speed=SpeedWatermark(present=False),
        registry=settings.registry))
    other.before_writes_of(monkeypatch, erasure_module)
    erase_player(settings, None, VICTIM, settle=0.0)
    other.join()
    assert other.errors == []
    assert other.seen == ["waits"]  # retention could not run meanwhile
    [report] = other.results
    assert report.deleted  # then it deleted the expired partitions, wholly
    for day_text in report.deleted:
        assert not (settings.lake_dir / "events" / f"ingest_date={day_text}").exists()
    assert _settled_holding(data) == []


def test_the_name_search_index_forgets_an_erased_player(world):
    """Regression (audit of issue 12): the erasure deleted the player's cached profile but
    not their entry in the console's name index (`{lb:profiles}:names`, members
    `<name>\\0<id>`): the id stayed in Redis, and in its AOF, where the base RDB's LZF
    compression hid it from a byte search. Every name of the player leaves the index;
    other players' names stay."""
    from serving.profiles import NAMES_KEY, ProfileCache

    settings, _registry, client, speed = world
    lake = settings.lake_dir
    _land_victim(settings, speed, 71, days=1)
    cache = ProfileCache(client, lake)
    at = day("2026-11-30T10:00:00")
    stored = [write_profile(lake, parse_profile(player, {"display_name": name}), at, "t")
              for player, name in ((VICTIM, "Victim One"), ("p004", "Four"))]
    cache.store(stored)
    assert any(VICTIM.encode() in m for m in client.zrange(NAMES_KEY, 0, -1))

    erase_player(settings, speed, VICTIM, settle=0.0)

    assert _redis_holding(client) == []
    assert client.zrange(NAMES_KEY, 0, -1) == [b"four\0p004"]
    assert [p["player_id"] for p in cache.find("four")] == ["p004"]
    assert cache.find("victim") == []


def test_an_erasure_during_a_profile_log_compaction_waits_for_it(world, monkeypatch):
    """Regression (review s8, finding 1): the nightly profile-log compaction
    (`compact_log`) held only the log's own rewrite lock, which the erasure never took: an
    erasure between its read of the log and its write of the folded file ran to the end,
    then the folded file put the erased player's profile (and the other players'
    un-redacted names) back into lake/profiles for good. The compaction now holds the
    erasure barrier shared. Forced interleaving: with the log read, not yet written, the
    compaction starts the erasure and goes on once it has finished (the old code) or waits
    at the barrier."""
    import leaderboard.profiles as profiles_module
    from leaderboard.profiles import compact_log, profiles_dir

    settings, _registry, _client, speed = world
    lake = settings.lake_dir
    at = day("2026-11-30T10:00:00")
    write_profile(lake, parse_profile(VICTIM, {"display_name": "Victim"}), at, "t")
    write_profile(lake, parse_profile("p005", {"display_name": f"fan of {VICTIM}"}), at, "t")
    eraser = _an_eraser(monkeypatch, settings, speed)
    real = profiles_module._unique

    def erase_meanwhile(tables: list[pa.Table]) -> pa.Table:
        folded = real(tables)
        eraser.start()
        return folded

    monkeypatch.setattr(profiles_module, "_unique", erase_meanwhile)
    assert compact_log(lake) == 2
    eraser.join()
    assert eraser.errors == []
    assert eraser.seen == ["waits"]  # the erasure could not run meanwhile
    assert len(list(profiles_dir(lake).glob("*.parquet"))) == 1  # the folded file
    assert history_of(lake, VICTIM) == []
    assert _settled_holding(settings.data_dir) == []


def test_a_ban_checked_before_an_erasure_waits_for_it_to_be_written(world, monkeypatch):
    """Regression (review s8, finding 3): a ban (unban, void of a result) read the erasure
    ledger, found the player not erased, then wrote its record outside the erasure
    barrier: an erasure starting in between finished first, and the ban's tombstone then
    put the id back into the lake after a "successful" erasure. The check and the write
    now hold the barrier shared (`app.erasure.unless_erased`, the CLI's and the HTTP
    routes' one function), so the erasure waits and then erases the ban too. Forced
    interleaving: the ban, checked and about to write its tombstone, starts the erasure
    and goes on once it has finished (the old code) or waits at the barrier."""
    import speed_layer.service as service_module
    from app.cli import main

    settings, _registry, _client, speed = world
    _land_victim(settings, speed, 72, days=1)
    _as_the_cli(monkeypatch, settings)
    eraser = _an_eraser(monkeypatch, settings, speed)
    real = service_module.write_tombstone

    def erase_meanwhile(*args: Any, **kwargs: Any) -> Any:
        eraser.start()
        return real(*args, **kwargs)

    monkeypatch.setattr(service_module, "write_tombstone", erase_meanwhile)
    assert main(["ban", VICTIM, "--reason", "cheating"]) == 0
    eraser.join()
    assert eraser.errors == []
    assert eraser.seen == ["waits"]  # the erasure could not run meanwhile
    assert _settled_holding(settings.data_dir) == []
    assert main(["unban", VICTIM]) == 2  # and now the id is refused


@pytest.mark.parametrize("door", ["cli", "http"])
def test_a_profile_write_checked_before_an_erasure_waits_for_it(world, monkeypatch, door):
    """Regression (review s8, finding 3, the rest): a profile write (`PUT
    /v1/players/{id}/profile`, `leaderboard profile set`) read the erasure ledger, found
    the player not erased, then wrote the log and the serving cache outside the erasure
    barrier: an erasure starting in between finished first, and the write then put the id
    back into lake/profiles and Redis. The check and both writes now hold the barrier
    shared. Forced interleaving: the write, checked and about to write its file, starts
    the erasure and goes on once it has finished (the old code) or waits at the barrier."""
    import leaderboard.profiles as profiles_module
    from app.cli import main
    from app.http import ApiKeys, HttpConfig, create_app

    settings, _registry, client, speed = world
    _land_victim(settings, speed, 73, days=1)
    eraser = _an_eraser(monkeypatch, settings, speed)
    eraser.before_writes_of(monkeypatch, profiles_module)
    if door == "cli":
        _as_the_cli(monkeypatch, settings)
        assert main(["profile", "set", VICTIM, "--name", "Victim"]) == 0
    else:
        import warnings

        with warnings.catch_warnings():  # starlette suggests httpx2; httpx is installed
            warnings.simplefilter("ignore")
            from fastapi.testclient import TestClient
        key = "eu-1-key-0123456789abcdef"
        app = create_app(settings, HttpConfig(keys=ApiKeys.parse({"servers": {"eu-1": key}})),
                         client=client)
        with TestClient(app) as http:
            answer = http.put(f"/v1/players/{VICTIM}/profile", json={"display_name": "Victim"},
                              headers={"Authorization": f"Bearer {key}"})
        assert answer.status_code == 200, answer.text
    eraser.join()
    assert eraser.errors == []
    assert history_of(settings.lake_dir, VICTIM) == []
    assert _redis_holding(client) == []
    assert _settled_holding(settings.data_dir) == []
    assert eraser.seen == ["waits"]  # the erasure could not run meanwhile


def test_a_quarantine_release_checked_before_an_erasure_waits_for_it(tmp_path, monkeypatch):
    """Regression (review s8, finding 3, the rest): a release of a quarantined row
    validated it again against the erasure ledger, then landed and folded it outside the
    erasure barrier: an erasure starting in between finished first, and the release then
    put the id back into the lake and Redis. The release now holds the barrier shared.
    Forced interleaving: the release, its rows validated, starts the erasure and goes on
    once it has finished (the old code) or waits at the barrier."""
    import speed_layer.review as review_module
    from leaderboard.quarantine import list_quarantine
    from speed_layer.review import release_rows

    limited = {**EXOTIC, "limits": {"grace": "1d", "player_events_per_minute": 1}}
    with _a_world(tmp_path, limited) as (settings, registry, client, speed):
        at = day("2026-11-29T10:00:00")
        land(settings.lake_dir, registry, [
            {"match_id": f"m{n}", "player_id": VICTIM, "points": 5, "event_time": at,
             "region": "na", "mode": "ranked", "server_id": "s1", "ingested_at": at}
            for n in range(2)], speed=speed)
        [held], _ = list_quarantine(settings.lake_dir, reason="implausible_rate")
        eraser = _an_eraser(monkeypatch, settings, speed)
        real = review_module.validate_events

        def validate_then_erase(*args: Any, **kwargs: Any) -> Any:
            checked = real(*args, **kwargs)
            eraser.start()
            return checked

        monkeypatch.setattr(review_module, "validate_events", validate_then_erase)
        [outcome], fold_error = release_rows(speed, [held.id], day("2026-11-30T12:00:00"))
        eraser.join()
        assert eraser.errors == []
        assert (outcome.status, fold_error) == ("released", None)
        assert _redis_holding(client) == []
        assert _settled_holding(settings.data_dir) == []
        assert eraser.seen == ["waits"]  # the erasure could not run meanwhile


def test_a_whole_match_void_naming_the_player_waits_for_an_erasure(world, monkeypatch):
    """Regression (review s9, finding 4): a whole match's void names no player, so it took
    no barrier; its reason may name the player being erased. Read the ledger (in
    `write_void`) before the erasure recorded the id, and written after the erasure's pass
    over the voids, it kept the id. It holds the barrier shared now. Forced interleaving:
    the void, about to write its file, starts the erasure and goes on once it has finished
    (the old code) or waits at the barrier."""
    import leaderboard.voids as voids_module
    from app.cli import main

    settings, _registry, _client, speed = world
    _land_victim(settings, speed, 76, days=1)
    _as_the_cli(monkeypatch, settings)
    eraser = _an_eraser(monkeypatch, settings, speed)
    eraser.before_writes_of(monkeypatch, voids_module)
    assert main(["void", "m-other", "--reason", f"{VICTIM} used an aimbot"]) == 0
    eraser.join()
    assert eraser.errors == []
    assert _settled_holding(settings.data_dir) == []
    assert eraser.seen == ["waits"]  # the erasure could not run meanwhile
