"""The synthetic season generator: deterministic, realistic in shape, and fully accounted for.

Small specs (a few thousand players, ~20k events) so the whole module runs in seconds; the
seasons that several tests read are generated once per module.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from app.generate import GenerateSpec, generate_events
from app.season import GenerateReport, generate_season
from leaderboard.lake import landed_files
from leaderboard.registry import load_registry, parse_registry
from leaderboard.schema import INPUT_FIELDS, LANDED_SCHEMA
from leaderboard.validation import REASONS

REGISTRY = load_registry()
#: 20k clean events over 10 days (so late events can be past the 7-day grace), 2-hour batches.
DIRTY = GenerateSpec(players=3_000, days=10, events_per_day=2_000, seed=11, dirty=0.1,
                     batch_minutes=120)
CLEAN = replace(DIRTY, dirty=0.0)


def _start(spec: GenerateSpec) -> datetime:
    return datetime.combine(spec.start, datetime.min.time(), UTC)


def _read(lake: Path, kind: str = "events") -> list[tuple[str, pa.Table]]:
    """Every landed file of the lake, by (writer, seq), with its name."""
    return [(f.path.relative_to(lake).as_posix(), pq.read_table(f.path))
            for f in landed_files(lake, kind=kind)]


def _all(lake: Path, kind: str = "events") -> pa.Table:
    return pa.concat_tables(table for _, table in _read(lake, kind))


def _span(later: pa.ChunkedArray, earlier: pa.ChunkedArray) -> tuple[timedelta, timedelta]:
    """The smallest and largest `later - earlier`, row by row."""
    micros = pc.subtract(pc.cast(later, pa.int64()), pc.cast(earlier, pa.int64()))
    bounds = pc.min_max(micros)
    return (timedelta(microseconds=bounds["min"].as_py()),
            timedelta(microseconds=bounds["max"].as_py()))


def _raw(spec: GenerateSpec) -> pa.Table:
    return pa.concat_tables(batch for _, batch in generate_events(spec, REGISTRY))


@pytest.fixture(scope="module")
def dirty_season(tmp_path_factory: pytest.TempPathFactory) -> tuple[GenerateReport, Path]:
    lake = tmp_path_factory.mktemp("dirty") / "lake"
    return generate_season(DIRTY, REGISTRY, lake), lake


@pytest.fixture(scope="module")
def clean_season(tmp_path_factory: pytest.TempPathFactory) -> tuple[GenerateReport, Path]:
    lake = tmp_path_factory.mktemp("clean") / "lake"
    return generate_season(CLEAN, REGISTRY, lake), lake


@pytest.fixture(scope="module")
def clean_events() -> pa.Table:
    return _raw(CLEAN)


# -- determinism -------------------------------------------------------------------------------


def test_same_seed_lands_identical_files(tmp_path: Path) -> None:
    spec = replace(DIRTY, days=3, batch_minutes=360)
    first = _read_both(spec, tmp_path / "a")
    second = _read_both(spec, tmp_path / "b")
    assert [name for name, _ in first] == [name for name, _ in second]
    for (name, left), (_, right) in zip(first, second, strict=True):
        assert left.equals(right), name


def _read_both(spec: GenerateSpec, root: Path) -> list[tuple[str, pa.Table]]:
    generate_season(spec, REGISTRY, root / "lake")
    return _read(root / "lake") + _read(root / "lake", "quarantine")


def test_generate_events_is_pure_and_seeded() -> None:
    spec = replace(DIRTY, days=2)
    first = list(generate_events(spec, REGISTRY))
    second = list(generate_events(spec, REGISTRY))
    assert [t for t, _ in first] == [t for t, _ in second]
    assert all(a.equals(b) for (_, a), (_, b) in zip(first, second, strict=True))
    other = pa.concat_tables(b for _, b in generate_events(replace(spec, seed=12), REGISTRY))
    assert not pa.concat_tables(b for _, b in first).equals(other)


def test_batches_come_in_landing_order_with_the_input_columns() -> None:
    spec = replace(DIRTY, days=2)
    times = []
    for landing_time, batch in generate_events(spec, REGISTRY):
        assert batch.schema.names == list(INPUT_FIELDS)
        assert batch.num_rows > 0
        assert landing_time.tzinfo is not None
        assert (landing_time - _start(spec)) % timedelta(minutes=spec.batch_minutes) == timedelta()
        times.append(landing_time)
    assert times == sorted(set(times))


# -- accounting --------------------------------------------------------------------------------


def test_clean_season_lands_every_event(clean_season: tuple[GenerateReport, Path]) -> None:
    report, lake = clean_season
    assert report.events == CLEAN.days * CLEAN.events_per_day
    assert report.rows == report.accepted == report.events
    assert report.rejected == report.duplicates_in_batch == 0
    assert report.duplicates == report.late == report.malformed == 0
    assert report.quarantine_files == 0
    assert report.reasons == {}
    every = _all(lake)
    assert every.schema.equals(LANDED_SCHEMA, check_metadata=False)
    landed = every.filter(pc.is_null(every["board"]))
    assert landed.num_rows == report.events
    assert report.files == len(landed_files(lake))
    # Laps for the default registry's direct board, by the season's players, in bounds.
    laps = every.filter(pc.is_valid(every["board"]))
    assert laps.num_rows == report.scores == CLEAN.days * CLEAN.events_per_day // 50
    assert set(laps["board"].to_pylist()) == {"best-lap"}
    assert set(laps["region"].to_pylist()) == set(laps["mode"].to_pylist()) == {""}
    assert {p[:1] + str(len(p)) for p in laps["player_id"].to_pylist()} == {"p8"}
    assert max(int(p[1:]) for p in laps["player_id"].to_pylist()) < CLEAN.players
    assert 1 <= pc.min(laps["points"]).as_py() <= pc.max(laps["points"]).as_py() <= 1_000_000
    identities = pc.binary_join_element_wise(landed["match_id"], landed["player_id"], "|")
    assert len(pc.unique(identities)) == report.events


def test_dirty_shares_and_every_row_accounted(
    dirty_season: tuple[GenerateReport, Path],
) -> None:
    report, _ = dirty_season
    dirt = DIRTY.dirty * report.events
    assert report.duplicates == pytest.approx(0.4 * dirt, rel=0.05)
    assert report.late == pytest.approx(0.3 * dirt, rel=0.05)
    assert report.malformed == pytest.approx(0.3 * dirt, rel=0.05)
    assert report.rows == report.events + report.duplicates + report.late + report.malformed
    assert report.rows == report.accepted + report.rejected + report.duplicates_in_batch
    # Some retries land in their original's batch and are dropped there, the others later.
    assert 0 < report.duplicates_in_batch < report.duplicates


def test_malformed_rows_all_end_in_quarantine(dirty_season: tuple[GenerateReport, Path]) -> None:
    report, lake = dirty_season
    # The default registry has all-time boards, so no late row is ever too late to count.
    assert report.rejected == report.malformed
    assert set(report.reasons) <= set(REASONS)
    assert "too_late" not in report.reasons
    assert sum(report.reasons.values()) == report.malformed
    assert len(report.reasons) >= 5  # ids, regions, modes, points, future times, missing fields
    quarantined = _all(lake, "quarantine")
    assert quarantined.num_rows == report.malformed
    assert set(quarantined["reason"].to_pylist()) == set(report.reasons)
    assert report.quarantine_files == len(landed_files(lake, kind="quarantine"))


def test_retries_are_exact_copies_landing_later(dirty_season: tuple[GenerateReport, Path]) -> None:
    report, lake = dirty_season
    landed = _all(lake)
    landed = landed.filter(pc.is_null(landed["board"]))  # match events (not laps)
    keys = pc.binary_join_element_wise(landed["match_id"], landed["player_id"], "|")
    counts = pc.value_counts(keys)
    repeated = counts.filter(pc.greater(counts.field("counts"), 1))
    # Every repeated identity was re-delivered in a later batch, with identical event fields.
    assert pc.sum(repeated.field("counts")).as_py() - len(repeated) == (
        report.duplicates - report.duplicates_in_batch)
    repeats = landed.filter(pc.is_in(keys, value_set=repeated.field("values")))
    fields = [name for name in LANDED_SCHEMA.names if name != "ingested_at"]
    assert repeats.group_by(fields).aggregate([]).num_rows == len(repeated)
    stamps = repeats.group_by(["match_id", "player_id"]).aggregate(
        [("ingested_at", "count_distinct")])
    assert pc.min(stamps["ingested_at_count_distinct"]).as_py() >= 2


# -- time --------------------------------------------------------------------------------------


def test_event_times_fall_within_the_days(clean_season: tuple[GenerateReport, Path]) -> None:
    _, lake = clean_season
    landed = _all(lake)
    start = _start(CLEAN)
    end = start + timedelta(days=CLEAN.days)
    assert pc.min(landed["event_time"]).as_py() >= start
    assert pc.max(landed["event_time"]).as_py() < end
    shortest, longest = _span(landed["ingested_at"], landed["event_time"])
    assert shortest > timedelta(0)
    # Lands in the batch after the event plus a delay of seconds to minutes (30 min at most).
    assert longest <= timedelta(minutes=CLEAN.batch_minutes + 30)
    # The last batch may land a little after the last day.
    assert pc.max(landed["ingested_at"]).as_py() <= end + timedelta(hours=3)


def test_ingested_at_never_precedes_event_time(dirty_season: tuple[GenerateReport, Path]) -> None:
    _, lake = dirty_season
    landed = _all(lake)
    assert _span(landed["ingested_at"], landed["event_time"])[0] >= timedelta(0)


def test_late_events_include_some_past_the_grace(
    dirty_season: tuple[GenerateReport, Path],
) -> None:
    _, lake = dirty_season
    landed = _all(lake)
    lateness = pc.subtract(landed["ingested_at"], landed["event_time"])
    late = landed.filter(pc.greater_equal(lateness, pa.scalar(timedelta(hours=1))))
    assert late.num_rows > 0
    # Past the daily window's end + 7 days: counts only for the longer windows and all-time.
    day_end = pc.add(pc.floor_temporal(late["event_time"], unit="day"),
                     pa.scalar(timedelta(days=1)))
    grace = REGISTRY.board("global").grace
    past = pc.greater(late["ingested_at"], pc.add(day_end, pa.scalar(grace)))
    assert 0 < pc.sum(past).as_py() < late.num_rows
    assert _span(landed["ingested_at"], landed["event_time"])[1] <= timedelta(days=10, hours=2)


def test_evening_is_busier_than_the_small_hours(clean_events: pa.Table) -> None:
    na = clean_events.filter(pc.equal(clean_events["region"], "na"))
    local_hour = pc.hour(pc.subtract(na["event_time"], pa.scalar(timedelta(hours=5))))
    per_hour = np.bincount(np.asarray(local_hour), minlength=24)
    assert per_hour[19:22].sum() > 3 * per_hour[3:6].sum()


# -- shape -------------------------------------------------------------------------------------


def test_matches_have_two_to_eight_players_sharing_time_mode_region(
    clean_events: pa.Table,
) -> None:
    matches = clean_events.group_by("match_id").aggregate([
        ("player_id", "count"), ("player_id", "count_distinct"),
        ("event_time", "count_distinct"), ("mode", "count_distinct"),
        ("region", "count_distinct"), ("server_id", "count_distinct"),
    ])
    sizes = matches["player_id_count"]
    assert pc.min(sizes).as_py() >= 2
    assert pc.max(sizes).as_py() <= 8
    assert matches["player_id_count_distinct"].equals(sizes)
    for column in ("event_time", "mode", "region", "server_id"):
        assert pc.max(matches[f"{column}_count_distinct"]).as_py() == 1, column


def test_player_activity_is_heavy_tailed(clean_events: pa.Table) -> None:
    counts = np.sort(np.asarray(pc.value_counts(clean_events["player_id"]).field("counts")))[::-1]
    top = max(1, CLEAN.players // 100)
    share = counts[:top].sum() / counts.sum()
    assert share > 0.10  # the keenest 1% play well over 1% of the seats
    assert np.median(counts) < counts.mean()  # and most players play less than average


def test_ids_regions_and_modes_are_valid_and_mixed(clean_events: pa.Table) -> None:
    assert pc.all(pc.match_substring_regex(clean_events["player_id"], r"^p\d{7}$")).as_py()
    assert pc.all(pc.match_substring_regex(clean_events["match_id"], r"^m11-\d+$")).as_py()
    n = clean_events.num_rows
    regions = dict(zip(*_counts(clean_events["region"]), strict=True))
    for name, share in {"na": 0.35, "eu": 0.30, "asia": 0.25, "sa": 0.10}.items():
        assert regions[name] / n == pytest.approx(share, abs=0.04), name
    modes = dict(zip(*_counts(clean_events["mode"]), strict=True))
    for name, share in {"casual": 0.55, "ranked": 0.35, "tournament": 0.10}.items():
        assert modes[name] / n == pytest.approx(share, abs=0.04), name


def _counts(column: pa.ChunkedArray) -> tuple[list[Any], list[int]]:
    counted = pc.value_counts(column)
    return counted.field("values").to_pylist(), counted.field("counts").to_pylist()


def test_players_keep_a_home_region(clean_events: pa.Table) -> None:
    homes = clean_events.group_by("player_id").aggregate([("region", "count_distinct")])
    assert pc.max(homes["region_count_distinct"]).as_py() == 1


def test_points_are_tie_heavy_and_within_bounds(clean_events: pa.Table) -> None:
    values, counts = _counts(clean_events["points"])
    assert set(values) <= {0, 1, 2, 3, 5, 10, 15, 20, 25, 50, 100}
    by_value = dict(zip(values, counts, strict=True))
    assert by_value[1] > by_value[100] * 5  # weighted toward small scores


def test_points_respect_a_registry_with_narrow_bounds(tmp_path: Path) -> None:
    registry = parse_registry({
        "regions": ["world"], "modes": ["friendly", "finals"],
        "board_defaults": {"min_points": 1, "max_points": 3},
        "boards": [{"scope": "global"}, {"scope": "mode:finals", "max_points": 2}],
    })
    spec = GenerateSpec(players=50, days=2, events_per_day=500, dirty=0.1, batch_minutes=720)
    events = pa.concat_tables(b for _, b in generate_events(spec, registry))
    report = generate_season(spec, registry, tmp_path / "lake")
    landed = _all(tmp_path / "lake")
    finals = pc.equal(landed["mode"], "finals")
    assert set(pc.unique(landed["points"]).to_pylist()) <= {1, 2, 3}
    assert pc.max(landed.filter(finals)["points"]).as_py() <= 2
    assert set(pc.unique(events["region"]).to_pylist()) >= {"world"}
    assert report.rows == report.accepted + report.rejected + report.duplicates_in_batch


# -- the interface -----------------------------------------------------------------------------


def test_progress_reports_rows_until_done(tmp_path: Path) -> None:
    calls: list[tuple[int, int]] = []
    spec = replace(DIRTY, days=1, batch_minutes=360)
    report = generate_season(spec, REGISTRY, tmp_path / "lake",
                             progress=lambda done, total: calls.append((done, total)))
    assert calls
    assert calls[-1] == (report.rows, report.rows)
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)


@pytest.mark.parametrize(("change", "word"), [
    ({"players": 10}, "players"),
    ({"dirty": 0.6}, "dirty"),
    ({"days": 0}, "days"),
    ({"batch_minutes": 0}, "batch_minutes"),
    ({"writer": "Bad Writer"}, "writer"),
])
def test_bad_specs_are_refused_by_name(change: dict[str, object], word: str,
                                       tmp_path: Path) -> None:
    spec = replace(CLEAN, **change)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=word):
        next(iter(generate_events(spec, REGISTRY)))
    with pytest.raises(ValueError, match=word):
        generate_season(spec, REGISTRY, tmp_path / "lake")


def test_an_error_mid_season_stops_every_stage(tmp_path: Path) -> None:
    before = threading.active_count()

    def fail(done: int, total: int) -> None:
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        generate_season(replace(CLEAN, days=2), REGISTRY, tmp_path / "lake", progress=fail)
    assert threading.active_count() == before
    # The writer was released: the same writer id lands again.
    report = generate_season(replace(CLEAN, days=1), REGISTRY, tmp_path / "lake")
    assert report.accepted == CLEAN.events_per_day
