"""The fold into real Redis: merged keys equal the reference, exactly once under replays."""

from __future__ import annotations

import os
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lakes import EXOTIC, day, land, random_stream, registry_from, write_registry
from oracle import reference_standings
from strategies import saturating_folds

from jobs.batch import run_batch
from leaderboard.batch_view import BatchView
from leaderboard.lake import LandingWriter, landed_files
from leaderboard.manifest import read_current, watermark_for
from leaderboard.registry import Registry, load_registry
from leaderboard.settings import Settings
from leaderboard.speed_keys import BoardWindowKeys, SpeedVersion
from speed_layer.fold import BaseKeys, Folder

pytestmark = pytest.mark.redis
START = day("2026-11-28")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def merged(client, registry, tag: str) -> dict[tuple[str, str], dict[str, int]]:
    """Every board-window's M as {player: key}."""
    found = {}
    for raw in client.scan_iter(match=f"lb:{{*}}:{tag}:M"):
        name = raw.decode()
        inner = name[name.index("{") + 1:name.index("}")]
        board, window_id = inner.split("|", 1)
        found[(board, window_id)] = {p.decode(): int(s) for p, s in
                                     client.zrange(raw, 0, -1, withscores=True)}
    return found


@pytest.fixture(params=["default", "exotic"])
def world(request, tmp_path):
    if request.param == "default":
        config, registry = None, load_registry()
        # No re-deliveries here: they are the door's business (test_ingest), and past the
        # door the speed layer counts what lands.
        stream = random_stream(5, start=START, regions=("na", "eu"), modes=("ranked", "casual"),
                               duplicate_share=0.0)
    else:
        config = str(tmp_path / "exotic.toml")
        write_registry(Path(config), EXOTIC)
        registry = registry_from(EXOTIC)
        stream = random_stream(6, start=START, points=(-5, 0, 3, 3, 7, 20, 20),
                               duplicate_share=0.0)
    land(tmp_path / "lake", registry, stream)
    return tmp_path / "lake", registry, config


def test_speed_only_state_equals_reference(redis_client, world):
    lake, registry, _config = world
    version = SpeedVersion(None, None)
    folder = Folder(redis_client, registry, lake)
    assert folder.catch_up(version) == len(landed_files(lake))
    want = reference_standings(lake, registry, None)
    got = merged(redis_client, registry, version.tag)
    assert got == {k: {r.player_id: r.sort_key for r in rows} for k, rows in want.items() if rows}


def test_folding_everything_again_changes_nothing(redis_client, world):
    lake, registry, _config = world
    version = SpeedVersion(None, None)
    folder = Folder(redis_client, registry, lake)
    folder.catch_up(version)
    before = merged(redis_client, registry, version.tag)
    files = landed_files(lake)
    for _ in range(3):  # duplicate delivery of every file, x3
        for landed in files:
            assert folder.fold(version, landed.writer, landed.seq,
                               pq.read_table(landed.path)) == 0
    assert merged(redis_client, registry, version.tag) == before


def test_base_plus_speed_equals_reference(redis_client, world, tmp_path):
    lake, registry, config = world
    env = {"LEADERBOARD_DATA": str(lake.parent)}
    if config:
        env["LEADERBOARD_CONFIG"] = config
    settings = Settings.from_env(env)
    manifest = run_batch(settings, date(2026, 11, 29)).manifest
    version = SpeedVersion(manifest.version, watermark_for(manifest.as_of_date))
    Folder(redis_client, registry, lake).catch_up(version)
    want = reference_standings(lake, registry, None)
    view = read_current(lake)
    assert view is not None
    got = merged(redis_client, registry, version.tag)
    for (board, window_id), rows in want.items():
        touched = got.get((board, window_id), {})
        for row in rows:
            if row.player_id in touched:
                assert touched[row.player_id] == row.sort_key, (board, window_id, row)
    keys = BoardWindowKeys("global", "all-time", version.tag)
    touched = redis_client.zcard(keys.touched)
    assert 0 < touched <= redis_client.zcard(keys.merged)


def _strip_last_match_id(lake: Path) -> None:
    """Rewrite the live version's standings files as a release before the column wrote
    them."""
    index = read_current(lake).standings(lake)
    for path in sorted(set(index.column("path").to_pylist())):
        table = pq.read_table(lake / path)
        pq.write_table(table.drop_columns(["last_match_id"]), lake / path)


def test_base_marks_of_last_boards_are_the_latest_event_and_its_match(tmp_path):
    """BaseKeys marks a `last` board's base score 'us|match' (us: last_event_at, 20 digits),
    the speed events' format; a version published before last_match_id gives 'us|'."""
    config = tmp_path / "exotic.toml"
    write_registry(config, EXOTIC)
    registry = registry_from(EXOTIC)
    lake = tmp_path / "lake"
    land(lake, registry, random_stream(6, start=START, points=(-5, 0, 3, 3, 7, 20, 20)))
    run_batch(Settings.from_env({"LEADERBOARD_DATA": str(tmp_path),
                                 "LEADERBOARD_CONFIG": str(config)}), date(2026, 11, 30))
    want = reference_standings(lake, registry, date(2026, 11, 30))

    def marks(view) -> dict[tuple[str, str], dict[str, tuple[str, str]]]:
        keys = BaseKeys(view)
        return {(b, w): keys.lookup(registry.board(b), w) for b, w in want
                if registry.board(b).aggregation == "last"}

    def us(at) -> str:
        return f"{(at - _EPOCH) // timedelta(microseconds=1):020d}"

    got = marks(BatchView(lake, read_current(lake)))
    assert sum(len(v) for v in got.values()) > 20
    assert got == {k: {r.player_id: (str(r.sort_key), f"{us(r.reached_at)}|{r.last_match_id}")
                       for r in rows} for k, rows in want.items() if k in got}
    _strip_last_match_id(lake)
    old = marks(BatchView(lake, read_current(lake)))
    assert old == {k: {p: (key, mark.split("|")[0] + "|") for p, (key, mark) in v.items()}
                   for k, v in got.items()}


@given(st.lists(st.integers(-62_135_596_800_000_000, 253_402_300_799_999_999), min_size=1,
                max_size=50))
def test_last_marks_order_as_text_like_the_times(times):
    """Regression (issue 11.2): `last` marks were zero-padded text, so before 1970 ('-...')
    a 1964 event compared as later than a 1965 one. Marks of any times in years 1-9999
    order as text exactly as the times do, and all have one length."""
    from speed_layer.fold import mark_time

    marks = mark_time(pa.array(times, pa.int64())).to_pylist()
    assert {len(m) for m in marks} == {20}
    assert sorted(marks) == [marks[i] for i in sorted(range(len(times)), key=times.__getitem__)]
    assert len(set(marks)) == len(set(times))


def test_a_folder_keeps_the_base_keys_of_two_versions_only(redis_client, tmp_path):
    """`Folder._bases` kept every version's base keys for the life of the process (a server
    running for months held one per night); now the two used last (live, and a rebase's
    next)."""
    settings = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path / "data")})
    land(settings.lake_dir, settings.registry,
         random_stream(54, start=START, days=3, matches=6, late_share=0.0))
    folder = Folder(redis_client, settings.registry, settings.lake_dir)
    versions = []
    for as_of in (date(2026, 11, 28), date(2026, 11, 29), date(2026, 11, 30)):
        manifest = run_batch(settings, as_of).manifest
        versions.append(SpeedVersion(manifest.version, watermark_for(manifest.as_of_date)))
        folder.base(versions[-1])
    assert list(folder._bases) == [v.tag for v in versions[1:]]
    folder.base(versions[1])  # used again: the newest is now the one to drop next
    folder.base(versions[0])
    assert list(folder._bases) == [versions[1].tag, versions[0].tag]


#: Examples of the saturation property (each folds up to ~2M generated events; ~0.3 s).
SATURATION_EXAMPLES = int(os.environ.get("SATURATION_EXAMPLES", "25"))
_AT = datetime(2026, 11, 28, 12, tzinfo=UTC)


def _mixed_sum_registry(ties: str, order: str) -> tuple[Registry, int, int]:
    """(registry, the all-time key limit L, the largest |points| P): one global `sum` board
    of both signs with the least room the registry allows, 65,536 events of P past L."""
    points = 1
    while True:
        registry = registry_from({"regions": ["na"], "modes": ["ranked"], "boards": [
            {"scope": "global", "windows": ["all-time"], "ties": ties, "order": order,
             "min_points": -points, "max_points": points}]})
        limit = registry.layout(registry.board("global"), "all-time").limit
        if (limit + 1) // 65_536 == points:
            return registry, limit, points
        points = (limit + 1) // 65_536


def _saturating_file(runs: list[tuple[str, str, int]], points: int) -> pa.Table:
    """One landed file of runs (player, kind, count) as events at _AT."""
    value = {"+L": points, "-L": -points, "+1": 1, "-1": -1}
    counts = [count for _, _, count in runs]
    n = sum(counts)
    return pa.table({
        "match_id": pa.array(np.full(n, "m", dtype=object), pa.string()),
        "player_id": pa.array(np.repeat(np.array([p for p, _, _ in runs], dtype=object),
                                        counts), pa.string()),
        "points": pa.array(np.repeat(np.array([value[k] for _, k, _ in runs], dtype=np.int64),
                                     counts)),
        "event_time": pa.array(np.full(n, _AT), pa.timestamp("us", tz="UTC")),
        "region": pa.array(np.full(n, "na", dtype=object), pa.string()),
        "mode": pa.array(np.full(n, "ranked", dtype=object), pa.string()),
        "server_id": pa.array(np.full(n, "s1", dtype=object), pa.string()),
        "ingested_at": pa.array(np.full(n, _AT + timedelta(minutes=1)),
                                pa.timestamp("us", tz="UTC")),
    })


@settings(max_examples=SATURATION_EXAMPLES,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # flushed below
@given(case=saturating_folds())
def test_a_sum_of_both_signs_is_its_exact_total_clamped_once_whatever_the_files(
        redis_client, case):
    """The batch's score of a `sum` board is the exact total clamped once at the key's
    limit (docs/design.md section 3; docs/architecture.md, limits of the sort key). The fold
    clamped each file's sum and then after each add, so on a board of both signs a total that
    passed the limit and came back (+L x 65,536, then -L) was L - P live where the batch
    serves the exact total: the layers disagreed until the next batch. Now, for any files
    near the limit, each player's live score is this model's: plain integers, clamped once."""
    registry, limit, points = _mixed_sum_registry(case["ties"], case["order"])
    redis_client.flushall()
    version = SpeedVersion(None, None)
    folder = Folder(redis_client, registry, Path("/nonexistent"))
    value = {"+L": points, "-L": -points, "+1": 1, "-1": -1}
    totals: dict[str, int] = {}
    for seq, runs in enumerate(case["files"]):
        assert folder.fold(version, "w", seq, _saturating_file(runs, points), prev=seq - 1) == 1
        for player, kind, count in runs:
            totals[player] = totals.get(player, 0) + value[kind] * count
    sign = 1 if case["order"] == "desc" else -1
    span = 1 << registry.layout(registry.board("global"), "all-time").time_bits
    keys = BoardWindowKeys("global", "all-time", version.tag)
    live = {p.decode(): int(k) for p, k in redis_client.zrange(keys.merged, 0, -1,
                                                                withscores=True)}
    scores = {p: sign * (k // span if case["ties"] == "earliest" else k)
              for p, k in live.items()}
    assert scores == {p: max(-limit, min(limit, t)) for p, t in totals.items()}


def test_a_live_total_over_a_saturated_base_is_the_batchs(redis_client, tmp_path):
    """The base key of a player whose absorbed total passed the limit is the limit: the
    fold started from it, so L x 65,541 absorbed then -L x 10 live served L - 10 P where
    the batch of everything serves the exact total clamped once, L x 65,531. Now the fold
    starts such a player from the version's rollup rows (the batch's exact total), on
    both tie policies; the other player, off the limit, is unchanged."""
    start = datetime(2026, 11, 28, 10, tzinfo=UTC)
    for ties in ("shared", "earliest"):
        registry, limit, points = _mixed_sum_registry(ties, "desc")
        raw = {"regions": ["na"], "modes": ["ranked"], "boards": [
            {"scope": "global", "windows": ["daily", "all-time"], "ties": ties,
             "min_points": -points, "max_points": points}]}
        config = tmp_path / f"{ties}.toml"
        write_registry(config, raw)
        registry = registry_from(raw)
        root = tmp_path / ties
        settings = Settings.from_env({"LEADERBOARD_DATA": str(root),
                                      "LEADERBOARD_CONFIG": str(config)})
        lake = settings.lake_dir
        absorbed = [("ann", points)] * 65_541 + [("bob", 3)]
        live = [("ann", -points)] * 10 + [("bob", -1)]
        with LandingWriter(lake, "w") as writer:
            for name, rows, at in (("a", absorbed, start), ("b", live,
                                                              start + timedelta(days=1))):
                n = len(rows)
                writer.land(pa.table({
                    "match_id": [f"{name}{i}" for i in range(n)],
                    "player_id": [p for p, _ in rows],
                    "points": pa.array([x for _, x in rows], pa.int64()),
                    "event_time": pa.array([at] * n, pa.timestamp("us", tz="UTC")),
                    "region": ["na"] * n, "mode": ["ranked"] * n, "server_id": ["s1"] * n,
                }), at + timedelta(minutes=5))
        manifest = run_batch(settings, date(2026, 11, 28)).manifest
        version = SpeedVersion(manifest.version, watermark_for(manifest.as_of_date))
        Folder(redis_client, registry, lake).catch_up(version)
        span = 1 << registry.layout(registry.board("global"), "all-time").time_bits
        keys = BoardWindowKeys("global", "all-time", version.tag)
        live_scores = {p.decode(): int(k) // (span if ties == "earliest" else 1)
                       for p, k in redis_client.zrange(keys.merged, 0, -1, withscores=True)}
        assert live_scores == {"ann": min(limit, 65_531 * points), "bob": 2}, ties
        want = {r.player_id: r.sort_key for r in
                reference_standings(lake, registry, None)[("global", "all-time")]}
        assert {p.decode(): int(k) for p, k in redis_client.zrange(
            keys.merged, 0, -1, withscores=True)} == want, ties


_LAST_ONLY = {"regions": ["na"], "modes": ["ranked"],
              "boards": [{"scope": "global", "name": "latest", "aggregation": "last",
                          "windows": ["all-time"], "min_points": 0, "max_points": 100}]}


@pytest.mark.parametrize("first", ["B-7", "a-7"])
def test_last_events_at_one_instant_order_match_ids_as_bytes_on_an_en_us_server(
        non_c_redis, tmp_path, first):
    """Two `last` events of one player at the same instant, in two landed files: the later
    is the one with the greater match_id byte by byte ('a-7' after 'B-7'), as the batch
    orders them. On a Redis started under en_US.UTF-8, whose collation puts 'a-7' first,
    the live score is still the batch's (20, the points of 'a-7'), in either landing order."""
    registry = registry_from(_LAST_ONLY)
    config = tmp_path / "registry.toml"
    write_registry(config, _LAST_ONLY)
    at = day("2026-11-28") + timedelta(hours=9)
    points = {"B-7": 10, "a-7": 20}
    second = "a-7" if first == "B-7" else "B-7"
    land(tmp_path / "lake", registry, [
        {"match_id": match, "player_id": "p1", "points": points[match], "event_time": at,
         "region": "na", "mode": "ranked", "server_id": "s1",
         "ingested_at": at + timedelta(hours=hours)}
        for match, hours in ((first, 1), (second, 3))])
    assert len(landed_files(tmp_path / "lake")) == 2
    folder = Folder(non_c_redis, registry, tmp_path / "lake")
    assert folder.catch_up(SpeedVersion(None, None)) == 2
    live = merged(non_c_redis, registry, SpeedVersion(None, None).tag)

    run_batch(Settings.from_env({"LEADERBOARD_DATA": str(tmp_path),
                                 "LEADERBOARD_CONFIG": str(config)}), date(2026, 11, 29))
    batch = BaseKeys(BatchView(tmp_path / "lake", read_current(tmp_path / "lake")))
    key, mark = batch.lookup(registry.board("latest"), "all-time")["p1"]
    assert mark.endswith("|a-7")
    assert live == {("latest", "all-time"): {"p1": int(key)}}
    assert int(key) == 20
