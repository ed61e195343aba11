"""The DuckDB batch job against the plain-Python reference, incrementally and in full."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import warnings
from datetime import date, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given
from hypothesis import strategies as st
from lakes import (
    EXOTIC,
    batches,
    day,
    land,
    random_scores,
    random_stream,
    registry_from,
    write_registry,
)
from oracle import absorbed_events, reference_standings
from strategies import scope_rollup_rows

import jobs.duckdb_engine as duckdb_engine
from jobs.batch import run_batch
from jobs.publish import PublishError, StandingsWriter, check_standings
from jobs.rank_stream import CODED_SCHEMA
from jobs.spec import STANDINGS_SCHEMA
from leaderboard.bans import write_tombstone
from leaderboard.batch_view import BatchView, open_current
from leaderboard.lake import LandingWriter
from leaderboard.manifest import list_versions, read_current, read_version
from leaderboard.registry import load_registry
from leaderboard.settings import Settings
from leaderboard.voids import write_void

START = day("2026-11-28")


def settings_for(data: Path, config: str | None = None) -> Settings:
    env = {"LEADERBOARD_DATA": str(data)}
    if config:
        env["LEADERBOARD_CONFIG"] = config
    return Settings.from_env(env)


def published(data: Path) -> dict[tuple[str, str], list[tuple]]:
    view = open_current(data / "lake")
    assert view is not None
    result = {}
    for board, window_id in view.windows():
        table = view.standings(board, window_id)
        result[(board, window_id)] = [tuple(r.values()) for r in table.to_pylist()]
    return result


def expected(data: Path, registry, as_of: date) -> dict[tuple[str, str], list[tuple]]:
    reference = reference_standings(data / "lake", registry, as_of)
    return {k: [(r.player_id, r.score, r.sort_key, r.rank, r.percentile, r.matches,
                 r.reached_at, r.first_event_at, r.last_event_at, r.last_match_id)
                for r in rows]
            for k, rows in reference.items()}


def assert_matches_reference(data: Path, registry, as_of: date) -> None:
    got, want = published(data), expected(data, registry, as_of)
    # The published version may keep windows built earlier (unchanged since); all others
    # must be exactly the reference.
    for key, rows in want.items():
        assert key in got, f"window {key} missing from the published version"
        assert got[key] == rows, f"window {key} differs from the reference"
    assert set(got) == set(want)


@pytest.fixture(params=["default", "exotic"])
def world(request, tmp_path):
    """(data dir, registry, config) with a landed random stream."""
    if request.param == "default":
        config, registry = None, load_registry()
        stream = random_stream(1, start=START, regions=("na", "eu", "sa"),
                               modes=("ranked", "casual"))
    else:
        config = str(tmp_path / "exotic.toml")
        write_registry(Path(config), EXOTIC)
        registry = registry_from(EXOTIC)
        stream = random_stream(2, start=START, points=(-5, 0, 3, 3, 7, 20, 20))
    # Scores to the registry's direct board (default best-lap, exotic coins) beside them.
    stream += random_scores(3, registry, start=START)
    data = tmp_path / "data"
    land(data / "lake", registry, stream)
    return data, registry, config


def test_full_run_matches_reference(world):
    data, registry, config = world
    as_of = date(2026, 11, 30)
    result = run_batch(settings_for(data, config), as_of)
    assert result.mode == "full"
    assert_matches_reference(data, registry, as_of)


def test_incremental_runs_equal_full_recompute(world, tmp_path):
    data, registry, config = world
    settings = settings_for(data, config)
    first = run_batch(settings, date(2026, 11, 28))
    second = run_batch(settings, date(2026, 11, 29))
    third = run_batch(settings, date(2026, 12, 1))
    assert first.mode == "full"
    assert second.mode == "incremental"
    assert third.mode == "incremental"
    assert third.manifest.previous == second.manifest.version
    assert_matches_reference(data, registry, date(2026, 12, 1))
    fresh = tmp_path / "fresh"
    shutil.copytree(data / "lake" / "events", fresh / "lake" / "events")
    run_batch(settings_for(fresh, config), date(2026, 12, 1))
    assert published(fresh) == published(data)


def test_a_batch_emits_no_warnings_from_the_project(world):
    """Regression: three DuckDB queries fetched Arrow from a DB-API result (`con.execute`),
    and every batch printed "Arrow output on a DB-API result makes an extra copy" three times."""
    data, _registry, config = world
    settings = settings_for(data, config)
    root = str(Path(__file__).resolve().parents[2])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_batch(settings, date(2026, 11, 29))
        run_batch(settings, date(2026, 11, 30))
    assert [f"{w.filename}:{w.lineno}: {w.message}" for w in caught
            if w.filename.startswith(root)] == []


def test_rerun_of_the_same_day_is_idempotent(world):
    data, _registry, config = world
    settings = settings_for(data, config)
    run_batch(settings, date(2026, 11, 30))
    before = published(data)
    again = run_batch(settings, date(2026, 11, 30))
    assert published(data) == before
    assert read_current(data / "lake").version == again.manifest.version
    assert len(list_versions(data / "lake")) == 2


def test_bans_drop_players_and_unbans_restore_them(world):
    data, registry, config = world
    settings = settings_for(data, config)
    as_of = date(2026, 11, 30)
    run_batch(settings, as_of)
    victim = published(data)[("global", "all-time")][0][0]
    write_tombstone(data / "lake", victim, "ban", day("2026-11-30T10:00:00"), reason="cheat")
    run_batch(settings, as_of)
    banned_view = published(data)
    assert all(victim not in {row[0] for row in rows} for rows in banned_view.values())
    assert_matches_reference(data, registry, as_of)
    write_tombstone(data / "lake", victim, "unban", day("2026-11-30T11:00:00"))
    run_batch(settings, date(2026, 12, 1))
    assert victim in {row[0] for row in published(data)[("global", "all-time")]}
    assert_matches_reference(data, registry, date(2026, 12, 1))


def test_a_ban_after_the_watermark_does_not_apply_to_the_version(world):
    data, _registry, config = world
    run_batch(settings_for(data, config), date(2026, 11, 30))
    victim = published(data)[("global", "all-time")][0][0]
    write_tombstone(data / "lake", victim, "ban", day("2026-12-01T10:00:00"))
    run_batch(settings_for(data, config), date(2026, 11, 30))
    assert victim in {row[0] for row in published(data)[("global", "all-time")]}


def test_late_events_count_only_where_the_grace_allows(tmp_path):
    registry = load_registry()
    event_time = day("2026-11-20T12:00:00")
    events = [
        {"match_id": "on-time", "player_id": "a", "points": 5, "event_time": event_time,
         "region": "na", "mode": "ranked", "server_id": "s", "ingested_at": event_time},
        # Landed 2026-11-30 01:00: past end + 7 d grace of the daily window (11-28) and of the
        # weekly one (ends 11-23, so 11-30 00:00), inside it for the month and all later.
        {"match_id": "late", "player_id": "a", "points": 7, "event_time": event_time,
         "region": "na", "mode": "ranked", "server_id": "s",
         "ingested_at": day("2026-11-30T00:30:00")},
    ]
    land(tmp_path / "lake", registry, events)
    run_batch(settings_for(tmp_path), date(2026, 11, 30))
    got = published(tmp_path)
    assert got[("global", "daily:2026-11-20")][0][1] == 5
    assert got[("global", "weekly:2026-W47")][0][1] == 5
    assert got[("global", "monthly:2026-11")][0][1] == 12
    assert got[("global", "all-time")][0][1] == 12


def test_absorbs_exactly_what_was_ingested_before_the_watermark(tmp_path):
    registry = load_registry()
    base = {"player_id": "a", "points": 1, "event_time": day("2026-11-30T23:00:00"),
            "region": "na", "mode": "ranked", "server_id": "s"}
    events = [dict(base, match_id="in", ingested_at=day("2026-11-30T23:59:59")),
              dict(base, match_id="out", ingested_at=day("2026-12-01T00:00:00"))]
    slots = {"in": day("2026-11-30T23:59:59.999999"), "out": day("2026-12-01T00:00:00")}
    from leaderboard.lake import LandingWriter
    from speed_layer.ingest import Ingestor

    with LandingWriter(tmp_path / "lake", "t") as writer:
        for event in events:
            table = pa.table({k: [v] for k, v in event.items() if k != "ingested_at"})
            Ingestor(registry, writer).ingest(table, now=slots[event["match_id"]], source="t")
    run_batch(settings_for(tmp_path), date(2026, 11, 30))
    assert published(tmp_path)[("global", "all-time")][0][5] == 1  # matches: only "in"


def test_a_backfill_is_absorbed_by_the_first_night_after_it_lands(tmp_path):
    """A backfill is stamped at landing (11-30): the nights before absorb none of it, the
    night of its landing all of it, counted in every window its event_time falls in, late
    or not (the reference applies the same rule)."""
    from leaderboard.lake import LandingWriter
    from leaderboard.schema import TIMESTAMP
    from speed_layer.ingest import Ingestor

    registry = load_registry()
    events = random_stream(3, start=day("2026-11-20"), days=5, late_share=0.0)
    table = pa.table({
        "match_id": [e["match_id"] for e in events],
        "player_id": [e["player_id"] for e in events],
        "points": pa.array([e["points"] for e in events], pa.int64()),
        "event_time": pa.array([e["event_time"] for e in events], TIMESTAMP),
        "region": [e["region"] for e in events], "mode": [e["mode"] for e in events],
        "server_id": [e["server_id"] for e in events]})
    with LandingWriter(tmp_path / "lake", "b") as writer:
        report = Ingestor(registry, writer).ingest(table, now=day("2026-11-30"), source="t",
                                                   backfill=True)
    assert report.accepted > 0
    run_batch(settings_for(tmp_path), date(2026, 11, 29))
    assert read_current(tmp_path / "lake").inputs["events"] == 0
    run_batch(settings_for(tmp_path), date(2026, 11, 30))
    assert read_current(tmp_path / "lake").inputs["mode"] == "incremental"
    assert read_current(tmp_path / "lake").inputs["events"] == report.accepted
    assert_matches_reference(tmp_path, registry, date(2026, 11, 30))


def test_last_match_id_is_the_latest_event_ties_by_the_larger_match(tmp_path):
    """Every board carries the match of the latest counted event; on `last` boards it marks
    the score (reached_at == last_event_at), ties on event_time going to the larger match_id
    (here across two rollup rows: the regions differ)."""
    config = tmp_path / "exotic.toml"
    write_registry(config, EXOTIC)
    registry = registry_from(EXOTIC)
    at = day("2026-12-02T12:00:00")
    base = {"player_id": "p", "mode": "ranked", "server_id": "s"}
    events = [dict(base, match_id="naf23", points=-50, region="na", event_time=at,
                   ingested_at=at),
              dict(base, match_id="da3", points=1, region="eu", event_time=at,
                   ingested_at=at + timedelta(hours=2)),
              dict(base, match_id="zz", points=5, region="na",
                   event_time=at - timedelta(hours=1), ingested_at=at)]
    land(tmp_path / "lake", registry, events)
    run_batch(settings_for(tmp_path, str(config)), date(2026, 12, 2))
    assert_matches_reference(tmp_path, registry, date(2026, 12, 2))
    view = open_current(tmp_path / "lake")
    assert view is not None
    for board, window_id in view.windows():
        for row in view.standings(board, window_id).to_pylist():
            # worst:eu sees only the eu event
            latest = "da3" if board == "worst:eu" else "naf23"
            assert row["last_match_id"] == latest, (board, window_id)
            assert row["last_event_at"] == at
            if registry.board(board).aggregation == "last":
                assert row["reached_at"] == row["last_event_at"]
    assert view.player("latest:ranked", "daily:2026-12-02", "p")["score"] == -50
    assert view.player("best", "all-time", "p")["score"] == 5  # not the latest event's


def test_windows_open_on_as_of_exist_even_without_data(tmp_path):
    registry = load_registry()
    land(tmp_path / "lake", registry, random_stream(3, start=START, days=1))
    run_batch(settings_for(tmp_path), date(2026, 12, 5))
    got = published(tmp_path)
    assert got[("region:asia", "daily:2026-12-05")] == []
    assert ("mode:tournament", "weekly:2026-W49") in got


def test_a_sum_past_the_exact_key_range_saturates_and_the_batch_publishes(tmp_path):
    """Regression (issue 11.1): totals past the exact key range raised SortKeyOverflow and
    the batch published nothing, that night and every night after. A sum now saturates at
    the key's limit (identically in the speed layer, see tests/speed_layer/test_fold.py)."""
    top = 2**20 - 1  # all-time with earliest ties, 1970-2200 in seconds: |score| <= 2^20 - 1
    raw = {"regions": ["na"], "modes": ["ranked"],
           "board_defaults": {"max_points": top, "ties": "earliest",
                              "windows": ["daily", "all-time"]},
           "boards": [{"scope": "global"}]}
    registry = registry_from(raw)
    assert registry.layout("global", "all-time").limit == top
    config = tmp_path / "r.toml"
    write_registry(config, raw)
    events = [{"match_id": f"m{i}", "player_id": player, "points": top,
               "event_time": START + timedelta(minutes=i), "region": "na", "mode": "ranked",
               "server_id": "s", "ingested_at": START + timedelta(minutes=i)}
              for i, player in enumerate(["a", "a", "a", "b", "b"])]
    land(tmp_path / "lake", registry, events)
    run_batch(settings_for(tmp_path, str(config)), date(2026, 11, 28))
    view = open_current(tmp_path / "lake")
    assert view is not None
    all_time = view.standings("global", "all-time").to_pylist()
    # Both saturate; a's latest counted event is earlier, so a ranks first.
    assert [(r["player_id"], r["score"], r["rank"]) for r in all_time] == [
        ("a", top, 1), ("b", top, 2)]
    daily = view.standings("global", "daily:2026-11-28").to_pylist()
    assert [(r["player_id"], r["score"]) for r in daily] == [("a", 3 * top), ("b", 2 * top)]


@pytest.mark.parametrize("crash_at", ["rollups", "standings", "manifest"])
def test_a_kill_at_any_step_leaves_the_old_version_live(world, crash_at):
    data, registry, config = world
    settings = settings_for(data, config)
    run_batch(settings, date(2026, 11, 29))
    before = read_current(data / "lake").version
    before_rows = published(data)
    env = {"LEADERBOARD_DATA": str(data), "PATH": "/usr/bin:/bin",
           "LEADERBOARD_FAULTS": f"batch.{crash_at}=kill",
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    if config:
        env["LEADERBOARD_CONFIG"] = config
    code = (
        "from datetime import date; from jobs.batch import run_batch; "
        "from leaderboard.settings import Settings; "
        "run_batch(Settings.from_env(), date(2026, 11, 30))"
    )
    process = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             timeout=300)
    assert process.returncode == -9, process.stderr.decode()[-2000:]
    assert read_current(data / "lake").version == before
    assert published(data) == before_rows
    run_batch(settings, date(2026, 11, 30))
    assert_matches_reference(data, registry, date(2026, 11, 30))


def test_football_results_match_the_reference(tmp_path, football_results):
    import pyarrow.compute as pc

    from app.football import football_events
    from leaderboard.lake import LandingWriter
    from speed_layer.ingest import Ingestor

    registry = load_registry("football")
    table, _ = football_events(football_results)
    table = table.filter(pc.greater_equal(table.column("event_time"),
                                          pa.scalar(day("2022-01-01"), table.schema.field(
                                              "event_time").type)))
    with LandingWriter(tmp_path / "lake", "f") as writer:
        Ingestor(registry, writer).ingest(table, now=day("2026-12-01"), source="football",
                                          backfill=True)
    run_batch(settings_for(tmp_path, "football"), date(2026, 12, 1))
    assert_matches_reference(tmp_path, registry, date(2026, 12, 1))
    top = published(tmp_path)[("global", "all-time")]
    assert top[0][3] == 1
    assert top[1][3] >= 1
    ties = [row for row in top if row[3] == top[-1][3]]
    assert len(ties) >= 1


def test_check_standings_catches_broken_ranks():
    rows = pa.table({"player_id": ["a", "b", "c"], "score": [5, 5, 3], "sort_key": [5, 5, 3],
                     "rank": [1, 2, 3], "percentile": [100.0, 100.0, 100 / 3],
                     "matches": [1, 1, 1]})
    with pytest.raises(PublishError, match="rank 2 at position 2 should be 1"):
        check_standings(rows, earliest=False, banned=set(), where="t")
    check_standings(rows, earliest=True, banned=set(), where="t") if False else None
    good = rows.set_column(3, "rank", pa.array([1, 1, 3]))
    good = good.set_column(4, "percentile", pa.array([100.0, 100.0, 100 / 3]))
    check_standings(good, earliest=False, banned=set(), where="t")
    with pytest.raises(PublishError, match="banned"):
        check_standings(good, earliest=False, banned={"b"}, where="t")
    assert STANDINGS_SCHEMA.names[0] == "player_id"


def test_voids_drop_events_from_the_next_version_and_history_stays(world):
    """A void of a whole match and one of one player's result: the next version counts
    neither (a full recompute: the events were absorbed), the published one is unchanged;
    a void recorded before its match lands keeps the late event out too."""
    data, registry, config = world
    settings = settings_for(data, config)
    first = run_batch(settings, date(2026, 11, 29))
    before = published(data)
    events = absorbed_events(data / "lake", None)
    whole, single = events[0]["match_id"], events[-1]
    write_void(data / "lake", whole, None, day("2026-11-29T12:00:00"), reason="exploit")
    write_void(data / "lake", single["match_id"], single["player_id"],
               day("2026-11-29T13:00:00"), reason="wrong score")
    write_void(data / "lake", "m-not-yet", None, day("2026-11-29T14:00:00"), reason="early")
    land(data / "lake", registry, [{
        "match_id": "m-not-yet", "player_id": "p999", "points": 5,
        "event_time": day("2026-11-30T10:00:00"), "region": "na", "mode": "ranked",
        "server_id": "s1", "ingested_at": day("2026-11-30T10:00:01")}], writer="late")
    second = run_batch(settings, date(2026, 11, 30))
    assert second.mode == "full"
    assert second.manifest.inputs["voids"]
    assert_matches_reference(data, registry, date(2026, 11, 30))
    after = published(data)
    assert all("p999" not in {row[0] for row in rows} for rows in after.values())
    assert after != before
    # the published history is as it was
    view = BatchView(data / "lake", read_version(data / "lake", first.manifest.version))
    assert {k: [tuple(r.values()) for r in view.standings(*k).to_pylist()]
            for k in view.windows()} == before
    # same voids: the next night is incremental again
    assert run_batch(settings, date(2026, 12, 1)).mode == "incremental"
    assert_matches_reference(data, registry, date(2026, 12, 1))


@pytest.mark.parametrize("world", ["default"], indirect=True)
def test_a_full_recompute_refuses_scores_that_do_not_add_up_to_the_counted_points(
        world, monkeypatch):
    """The all-time check of a full recompute sums the counted points of the rollup rows it
    holds (no per-player totals read back while no total saturates): an engine that scored
    the global all-time board one point high per player is refused, nothing published."""
    data, _, config = world
    ranked = duckdb_engine.rank_stream

    def one_high(batches, **names):
        for batch in ranked(batches, **names):
            wrong = pc.and_(pc.equal(batch.column("board"), "global"),
                            pc.equal(batch.column("window_id"), "all-time"))
            score = pc.if_else(wrong, pc.add(batch.column("score"), 1), batch.column("score"))
            yield batch.set_column(batch.schema.get_field_index("score"), "score", score)

    def reader(batches, **names):
        return pa.RecordBatchReader.from_batches(CODED_SCHEMA,
                                                 one_high(batches, **names))

    monkeypatch.setattr(duckdb_engine, "rank_stream", reader)
    with pytest.raises(PublishError, match="global all-time scores add up to"):
        run_batch(settings_for(data, config), date(2026, 11, 30))
    assert read_current(data / "lake") is None


@pytest.mark.parametrize("world", ["default"], indirect=True)
def test_a_failed_standings_write_stops_the_read_ahead_before_the_error_propagates(
        world, monkeypatch):
    """The writer failing (here: after its first batch) must not leave the engine's
    read-ahead thread running: the batch stops and joins it before the error leaves the
    run, though the error's traceback still holds the stream (review s6 finding 6)."""
    data, _, config = world
    ranked = duckdb_engine.rank_stream

    def one_row_batches(batches, **names):
        # read eagerly, then hand many small batches: the read-ahead fills its queue and
        # waits there, as on a real season's stream
        table = ranked(batches, **names).read_all()
        assert table.num_rows > 10
        return pa.RecordBatchReader.from_batches(CODED_SCHEMA, table.to_batches(1))

    def failing_write(self, reader):
        reader.read_next_batch()
        raise PublishError("the disk filled up")

    monkeypatch.setattr(duckdb_engine, "rank_stream", one_row_batches)
    monkeypatch.setattr(StandingsWriter, "write_stream", failing_write)
    before = set(threading.enumerate())
    with pytest.raises(PublishError, match="the disk filled up") as failure:
        run_batch(settings_for(data, config), date(2026, 11, 30))
    assert failure.traceback  # the stream is still referenced from the failed frames
    assert not [t for t in set(threading.enumerate()) - before
                if t.name == "standings-prefetch"]
    assert read_current(data / "lake") is None



@given(rows=scope_rollup_rows(), banned=st.sampled_from([set(), {"a"}]),
       end=st.integers(1, 5))
def test_scope_points_are_the_exact_sums_by_scope(rows, banned, end):
    """The all-time check's per-scope sums (one int64 grouping by (region, mode) in high and
    low parts) equal exact sums: events count on global, their region and mode; direct
    scores (region "") on their board only; nothing at or after `end`, nor of the banned,
    nor with no region; points at +-2^62 without overflow."""
    from jobs.batch import _add_scope_points
    from jobs.spec import ROLLUP_SCHEMA

    n = len(rows)
    columns = {
        "player_id": pa.array([r[0] for r in rows], pa.string()),
        "event_date": pa.array([date(2026, 1, r[1]) for r in rows], pa.date32()),
        "region": pa.array([r[2] for r in rows], pa.string()),
        "mode": pa.array([r[3] for r in rows], pa.string()),
        "points_sum": pa.array([r[4] for r in rows], pa.int64())}
    table = pa.table({f.name: columns.get(f.name, pa.nulls(n, f.type)) for f in ROLLUP_SCHEMA})
    want: dict[str, int] = {"global": 7}
    for player, day_of, region, mode, points in rows:
        if day_of >= end or player in banned or region is None:
            continue
        for key in ([f"board:{mode}"] if region == ""
                    else ["global", f"region:{region}", f"mode:{mode}"]):
            want[key] = want.get(key, 0) + points
    assert _add_scope_points({"global": 7}, table, banned, date(2026, 1, end)) == want


def _now_and_ahead() -> list[dict]:
    """Two events landed 2026-11-30T10:00: one of that instant, one 47 h ahead of it."""
    landed_at = day("2026-11-30T10:00:00")
    return [{"match_id": match_id, "player_id": player, "points": points,
             "event_time": landed_at + timedelta(hours=ahead), "region": "na",
             "mode": "ranked", "server_id": "s", "ingested_at": landed_at}
            for match_id, player, points, ahead in (("now", "a", 5, 0), ("ahead", "b", 7, 47))]


def test_an_event_ahead_of_its_landing_within_the_skew_counts_in_its_own_window(tmp_path):
    """With future_skew = 3d, an event 47 h ahead of its landing is accepted; every night
    publishes, the event counts in the daily (and weekly...) window its event_time falls
    in, a future day's window included, and each night equals the reference."""
    config = tmp_path / "skew.toml"
    raw = dict(EXOTIC, limits={"grace": "1d", "future_skew": "3d"})
    write_registry(config, raw)
    registry = registry_from(raw)
    events = _now_and_ahead()
    assert land(tmp_path / "lake", registry, events) == 2
    for as_of in (date(2026, 11, 30), date(2026, 12, 1), date(2026, 12, 2)):
        run_batch(settings_for(tmp_path, str(config)), as_of)
        assert read_current(tmp_path / "lake").as_of == as_of.isoformat()
        assert read_current(tmp_path / "lake").inputs["events"] == 2
        assert_matches_reference(tmp_path, registry, as_of)
    got = published(tmp_path)
    assert [row[:2] for row in got[("global", "daily:2026-12-02")]] == [("b", 7)]
    assert {row[0] for row in got[("global", "all-time")]} == {"a", "b"}


def _landed_with_a_calendar(tmp_path):
    """A lake bound to EXOTIC with an explicit calendar, holding two days of a random
    stream: (its registry file, the raw registry, the lake, the events)."""
    from leaderboard.binding import bind_registry

    config = tmp_path / "reg.toml"
    raw = dict(EXOTIC, calendar={"all_time_start": "2026-01-01"})
    write_registry(config, raw)
    registry = registry_from(raw)
    lake = tmp_path / "lake"
    bind_registry(lake, registry)
    events = random_stream(4, start=START, days=2)
    land(lake, registry, events)
    return config, raw, lake, events


@pytest.mark.parametrize("edge", ["start", "end"])
def test_a_rebind_leaving_landed_events_outside_the_calendar_is_refused(tmp_path, edge):
    """A registry edit whose calendar leaves out events the lake holds (all_time_start after
    the earliest event date, or all_time_end on or before the latest) is refused at `lake
    rebind` (the binding stays), naming that date and the bound that keeps it; with that
    bound the rebind is accepted and the next night publishes every event."""
    from leaderboard.binding import RegistryBindingError, bind_registry, bound_registry

    config, raw, lake, events = _landed_with_a_calendar(tmp_path)
    run_batch(settings_for(tmp_path, str(config)), date(2026, 11, 30))
    earliest = min(e["event_time"] for e in events).date()
    latest = max(e["event_time"] for e in events).date()
    after = latest + timedelta(days=1)
    refused, kept, says = {
        "start": ({"all_time_start": (earliest + timedelta(days=1)).isoformat()},
                  {"all_time_start": earliest.isoformat()}, f"the earliest on {earliest}"),
        "end": ({"all_time_start": "2026-01-01", "all_time_end": latest.isoformat()},
                {"all_time_start": "2026-01-01", "all_time_end": after.isoformat()},
                f"the latest on {latest}.*Set all_time_end to {after} or later"),
    }[edge]
    before = bound_registry(lake)
    with pytest.raises(RegistryBindingError, match=says):
        bind_registry(lake, registry_from(dict(raw, calendar=refused)), rebind=True)
    assert bound_registry(lake) == before
    moved = dict(raw, calendar=kept)
    write_registry(config, moved)
    bind_registry(lake, registry_from(moved), rebind=True)
    run_batch(settings_for(tmp_path, str(config)), date(2026, 12, 1))
    assert read_current(lake).as_of == "2026-12-01"
    assert_matches_reference(tmp_path, registry_from(moved), date(2026, 12, 1))


def test_a_landed_file_an_erasure_emptied_bounds_no_rebind(tmp_path):
    """A landed file left without rows by the erasure's pass (every player it held erased)
    holds no event date: a rebind keeping every remaining event in the calendar is
    accepted, and the next night publishes them."""
    import pyarrow.parquet as pq

    from leaderboard.binding import bind_registry
    from leaderboard.erasure import without_player
    from leaderboard.lake import landed_files

    config, raw, lake, _ = _landed_with_a_calendar(tmp_path)
    emptied = landed_files(lake)[0].path
    for player in set(pq.read_table(emptied, columns=["player_id"])["player_id"].to_pylist()):
        without_player(emptied, player)
    assert pq.read_metadata(emptied).num_rows == 0
    earliest = min(min(pq.read_table(f.path, columns=["event_time"])["event_time"].to_pylist())
                   for f in landed_files(lake) if pq.read_metadata(f.path).num_rows)
    moved = dict(raw, calendar={"all_time_start": earliest.date().isoformat()})
    write_registry(config, moved)
    bind_registry(lake, registry_from(moved), rebind=True)
    run_batch(settings_for(tmp_path, str(config)), date(2026, 12, 1))
    assert read_current(lake).as_of == "2026-12-01"


def test_an_event_on_or_past_the_calendar_end_is_quarantined_and_nights_publish(tmp_path):
    """An event within future_skew of its landing but on or after calendar.all_time_end is
    refused at the door (after_calendar_end, in the quarantine), not landed: every night
    publishes the other event and equals the reference."""
    from leaderboard.quarantine import list_quarantine

    config = tmp_path / "ending.toml"
    raw = dict(EXOTIC, limits={"grace": "1d", "future_skew": "3d"},
               calendar={"all_time_end": "2026-12-01"})
    write_registry(config, raw)
    registry = registry_from(raw)
    events = _now_and_ahead()
    assert land(tmp_path / "lake", registry, events) == 1
    [held], _ = list_quarantine(tmp_path / "lake")
    assert (held.values["match_id"], held.reason) == ("ahead", "after_calendar_end")
    run_batch(settings_for(tmp_path, str(config)), date(2026, 11, 30))
    assert read_current(tmp_path / "lake").inputs["events"] == 1
    assert_matches_reference(tmp_path, registry, date(2026, 11, 30))


def test_a_night_after_an_open_day_version_absorbs_what_landed_past_its_cut(tmp_path):
    """A version of today read at 13:00 (--allow-open-day) has that instant as its
    watermark; the next night built on it counts the rest of that day (incremental) and
    equals the reference; a file stamped before the cut that it did not read (still landing
    while it read the lake) makes a night on it recompute in full."""
    from jobs.batch import OpenNightRefused

    registry = load_registry()
    events = random_stream(5, start=day("2026-12-01"), days=2, late_share=0.0)
    cut = day("2026-12-01T13:00:00")
    land(tmp_path / "lake", registry, [e for e in events if e["ingested_at"] < cut])
    settings = settings_for(tmp_path)
    with pytest.raises(OpenNightRefused, match="2026-11-30"):
        run_batch(settings, date(2026, 12, 1), now=cut)
    run_batch(settings, date(2026, 12, 1), now=cut, allow_open_day=True)
    assert read_current(tmp_path / "lake").watermark == "2026-12-01T13:00:00Z"
    land(tmp_path / "lake", registry, [e for e in events if e["ingested_at"] >= cut],
         writer="u")
    run_batch(settings, date(2026, 12, 2), now=day("2026-12-03T01:00:00"))
    assert read_current(tmp_path / "lake").inputs["mode"] == "incremental"
    assert_matches_reference(tmp_path, registry, date(2026, 12, 2))
    # The same night again, built on the open day's version: a file stamped before its cut
    # that it did not read (landed past the door, which stamps no landing before the cut:
    # a writer of an older release) is a late landing, so the night is full.
    in_flight = dict(events[0], match_id="in-flight", event_time=cut - timedelta(hours=2),
                     ingested_at=cut - timedelta(minutes=30))
    with LandingWriter(tmp_path / "lake", "v") as writer:
        [(_, table)] = batches([in_flight])
        writer.land(table, cut - timedelta(minutes=30))
    run_batch(settings, date(2026, 12, 2), now=day("2026-12-03T01:00:00"))
    assert read_current(tmp_path / "lake").inputs["mode"] == "full"
    assert_matches_reference(tmp_path, registry, date(2026, 12, 2))


def test_a_rebind_after_retention_keeps_unchanged_boards_and_builds_new_ones(tmp_path):
    """After retention deleted raw events, an edit that adds a board and changes another's
    bounds, then `lake rebind`: the next night publishes (incremental on the live version),
    keeps the unchanged boards' standings files, builds the new and changed boards from
    the rollups, and equals a full recompute of a twin lake that kept every raw event.
    An edit of a grace (the rollups' meaning) is refused at rebind instead."""
    import shutil

    from jobs.compact import SpeedWatermark
    from jobs.retention import apply_retention
    from leaderboard.binding import RegistryBindingError, bind_registry, rebind_summary

    raw = dict(EXOTIC)
    config = tmp_path / "reg.toml"
    write_registry(config, raw)
    registry = registry_from(raw)
    data, twin = tmp_path / "data", tmp_path / "twin"
    bind_registry(data / "lake", registry)
    events = random_stream(6, start=START, days=4, late_share=0.0)
    first = [e for e in events if e["ingested_at"] < day("2026-12-02")]
    land(data / "lake", registry, first)
    for as_of in (date(2026, 11, 29), date(2026, 11, 30), date(2026, 12, 1)):
        run_batch(settings_for(data, str(config)), as_of)
    shutil.copytree(data, twin)
    report = apply_retention(data / "lake", date(2026, 12, 1), 2,
                             speed=SpeedWatermark(present=False), registry=registry)
    assert report.deleted, "retention deleted raw partitions"
    before = read_current(data / "lake").standings(data / "lake").to_pylist()
    boards = [dict(b, max_points=90) if b.get("name") == "best" else b for b in raw["boards"]]
    edited = dict(raw, boards=[*boards, {"scope": "mode:casual", "name": "casual-best",
                                         "aggregation": "max"}])
    regraced = dict(edited, limits={"grace": "2d"})
    with pytest.raises(RegistryBindingError, match="retention deleted the raw events"):
        bind_registry(data / "lake", registry_from(regraced), rebind=True)
    write_registry(config, edited)
    new = registry_from(edited)
    for lake in (data / "lake", twin / "lake"):
        bind_registry(lake, new, rebind=True)
    summary = rebind_summary(data / "lake", new)
    assert "builds best, casual-best from the rollups" in summary
    rest = [e for e in events if e["ingested_at"] >= day("2026-12-02")]
    for lake in (data / "lake", twin / "lake"):
        land(lake, new, rest)
    run_batch(settings_for(data, str(config)), date(2026, 12, 2))
    live = read_current(data / "lake")
    assert (live.as_of, live.inputs["mode"]) == ("2026-12-02", "incremental")
    got, want = published(data), expected(twin, new, date(2026, 12, 2))
    assert set(got) == set(want)
    for key, rows in want.items():
        assert got[key] == rows, f"window {key} differs from the full recompute"
    kept = {(r["board"], r["window_id"]): r["path"] for r in before}
    now = {(r["board"], r["window_id"]): r["path"]
           for r in live.standings(data / "lake").to_pylist()}
    assert now[("global", "daily:2026-11-29")] == kept[("global", "daily:2026-11-29")]
    assert now[("best", "daily:2026-11-29")] != kept[("best", "daily:2026-11-29")]


def test_the_job_entry_point_refuses_a_night_not_ended(tmp_path, monkeypatch, capsys):
    """`python -m jobs.batch --as-of <today>` exits 2 with the reason and the last night
    that may run, publishing nothing; with --allow-open-day it publishes."""
    from jobs.batch import main

    land(tmp_path / "lake", load_registry(), random_stream(7, start=day("2026-12-01"), days=1))
    monkeypatch.setenv("LEADERBOARD_NOW", "2026-12-01T23:00:00Z")
    monkeypatch.delenv("LEADERBOARD_CONFIG", raising=False)
    assert main(["--as-of", "2026-12-01", "--data", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "has not ended" in err
    assert "last night that may run is 2026-11-30" in err
    assert read_current(tmp_path / "lake") is None
    assert main(["--as-of", "2026-12-01", "--data", str(tmp_path), "--allow-open-day"]) == 0
    assert read_current(tmp_path / "lake").watermark == "2026-12-01T23:00:00Z"
