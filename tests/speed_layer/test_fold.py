"""The fold into real Redis: merged keys equal the reference, exactly once under replays."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st
from lakes import EXOTIC, day, land, random_stream, registry_from, write_registry
from oracle import reference_standings

from jobs.batch import run_batch
from leaderboard.batch_view import BatchView
from leaderboard.lake import landed_files
from leaderboard.manifest import read_current, watermark_for
from leaderboard.registry import load_registry
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
