"""Per-player rate plausibility (issue 12 part 5): more than `player_events_per_minute`
events of one player in one landing minute go to quarantine (`implausible_rate`), decided
once at landing and recorded in the lake, so that the batch and the speed layer agree."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from contextlib import suppress
from datetime import UTC, date, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from strategies import rate_deliveries

from jobs.batch import run_batch
from leaderboard import faults
from leaderboard.lake import LandingWriter, landed_files
from leaderboard.registry import RegistryError, load_registry, parse_registry
from leaderboard.schema import TIMESTAMP
from leaderboard.settings import Settings
from serving.service import Leaderboards
from speed_layer.ingest import Ingestor, IngestReport
from speed_layer.rate import rate_key
from speed_layer.service import SpeedLayer

pytestmark = pytest.mark.redis

NOW = datetime(2026, 12, 1, 12, 0, 10, tzinfo=UTC)
PLAYED = datetime(2026, 12, 1, 11, tzinfo=UTC)


def _settings(tmp_path: Path, limit: int = 3) -> Settings:
    text = (resources.files("leaderboard") / "registries" / "default.toml").read_text()
    text = text.replace("# player_events_per_minute = 120",
                        f"player_events_per_minute = {limit}")
    (tmp_path / "registry.toml").write_text(text)
    return Settings.from_env({"LEADERBOARD_DATA": str(tmp_path / "data"),
                              "LEADERBOARD_CONFIG": str(tmp_path / "registry.toml")})


def _table(rows: list[tuple[str, str, int]]) -> pa.Table:
    return pa.table({
        "match_id": [m for m, _, _ in rows], "player_id": [p for _, p, _ in rows],
        "points": pa.array([x for _, _, x in rows], pa.int64()),
        "event_time": pa.array([PLAYED] * len(rows), TIMESTAMP),
        "region": ["na"] * len(rows), "mode": ["ranked"] * len(rows),
        "server_id": ["s1"] * len(rows)})


def _ingest(settings: Settings, speed: SpeedLayer, rows: list[tuple[str, str, int]],
            now: datetime = NOW, writer: str = "w", **options: Any) -> IngestReport:
    with LandingWriter(settings.lake_dir, writer) as landing:
        return Ingestor(settings.registry, landing, speed).ingest(
            _table(rows), now=now, source="test", **options)


def _rows(lake: Path, kind: str) -> list[dict[str, Any]]:
    return [row for f in landed_files(lake, kind=kind)
            for row in pq.read_table(f.path).to_pylist()]


def test_the_registry_takes_the_limit():
    assert load_registry().player_events_per_minute is None  # shipped: no limit
    raw = {"regions": ["na"], "modes": ["ranked"], "limits": {"player_events_per_minute": 0},
           "boards": [{"scope": "global"}]}
    with pytest.raises(RegistryError, match=r"limits\.player_events_per_minute.*>= 1"):
        parse_registry(raw)


def test_events_past_the_limit_are_held_and_a_retry_of_them_is_a_retry(tmp_path,
                                                                        redis_client):
    settings = _settings(tmp_path)
    speed = SpeedLayer(redis_client, settings.registry, settings.lake_dir)
    rows = [(f"m{n}", "alice", 10) for n in range(5)] + [("m0", "bob", 1)]
    report = _ingest(settings, speed, rows, row_reasons=True)
    assert (report.accepted, report.rejected) == (4, 2)
    assert report.reasons == {"implausible_rate": 2}
    # Batch order decides: alice's first three count, m3 and m4 are held.
    assert [(row, reason) for row, reason, _ in report.rejections] == [
        (3, "implausible_rate"), (4, "implausible_rate")]
    held = _rows(settings.lake_dir, "quarantine")
    assert [(r["match_id"], r["player_id"], r["reason"]) for r in held] == [
        ("m3", "alice", "implausible_rate"), ("m4", "alice", "implausible_rate")]
    assert "limits.player_events_per_minute = 3" in held[0]["detail"]
    assert held[0]["event_time"] == "2026-12-01T11:00:00Z"
    assert sorted((r["match_id"], r["player_id"]) for r in _rows(settings.lake_dir, "events")
                  ) == [("m0", "alice"), ("m0", "bob"), ("m1", "alice"), ("m2", "alice")]
    # The counters hold a hash of the player id, never the id (erasure: nothing in Redis).
    assert [k for k in redis_client.keys("lb:rate:*") if b"alice" in k] == []
    assert redis_client.keys("lb:rate:*")
    # The same batch again: every row is a retry, held ones included; nothing new anywhere.
    again = _ingest(settings, speed, rows)
    assert (again.accepted, again.retries, again.rejected) == (0, 6, 0)
    assert len(_rows(settings.lake_dir, "quarantine")) == 2
    # Later in the same minute, from another writer: alice is still over; next minute she
    # is not.
    later = _ingest(settings, speed, [("m5", "alice", 1)], NOW + timedelta(seconds=30), "v")
    assert later.reasons == {"implausible_rate": 1}
    fresh = _ingest(settings, speed, [("m6", "alice", 1)], NOW + timedelta(minutes=1), "v")
    assert (fresh.accepted, fresh.rejected) == (1, 0)


def test_backfills_are_not_held(tmp_path, redis_client):
    settings = _settings(tmp_path, limit=1)
    speed = SpeedLayer(redis_client, settings.registry, settings.lake_dir)
    report = _ingest(settings, speed, [(f"h{n}", "carol", 1) for n in range(4)], backfill=True)
    assert (report.accepted, report.rejected) == (4, 0)


def test_a_failed_landing_keeps_the_held_rows_and_gives_back_the_rest(tmp_path, redis_client,
                                                                      monkeypatch):
    """A crash after the held rows reached the quarantine and before the others landed: the
    held ids stay claimed (their retry is a retry), the others are released and their count
    given back, so the retry of the batch lands them."""
    settings = _settings(tmp_path, limit=2)
    speed = SpeedLayer(redis_client, settings.registry, settings.lake_dir)
    rows = [(f"m{n}", "dave", 1) for n in range(3)]

    def fail(*_args: object, **_kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(LandingWriter, "land", fail)
    with pytest.raises(OSError, match="disk full"):
        _ingest(settings, speed, rows)
    monkeypatch.undo()
    assert [r["match_id"] for r in _rows(settings.lake_dir, "quarantine")] == ["m2"]
    assert _rows(settings.lake_dir, "events") == []
    retry = _ingest(settings, speed, rows)
    assert (retry.accepted, retry.retries, retry.rejected) == (2, 1, 0)
    assert sorted(r["match_id"] for r in _rows(settings.lake_dir, "events")) == ["m0", "m1"]


def test_a_failed_landing_of_thousands_of_one_players_rows_gives_all_of_them_back(
        redis_client):
    """Regression (review): the give-back removed a player's identities with one
    `HDEL key unpack(ARGV)`, and Lua refuses to unpack about 8,000 values: a failed landing
    of 9,000 rows of one player (a request may carry 10,000) gave none back (the error was
    swallowed), and the minute stayed full until it expired."""
    from speed_layer.rate import PlayerRate, rate_key

    rate = PlayerRate(redis_client, per_minute=10_000)
    rows = [(f"m{n}", "flood", 1) for n in range(9_000)]
    held = rate.split(_table(rows), NOW, "test")
    assert held.kept.num_rows == 9_000
    key = rate_key("flood", held.minute)
    assert int(redis_client.hget(key, "#")) == 9_000
    rate.give_back(held)
    assert int(redis_client.hget(key, "#")) == int(redis_client.hget(key, "+")) == 0
    assert redis_client.hlen(key) == 2  # only the counts are left
    again = rate.split(_table(rows[:10]), NOW, "test")  # the room is back: numbered afresh
    assert again.kept.num_rows == 10
    assert int(redis_client.hget(key, "#")) == 10


def test_a_retry_after_a_writer_was_killed_between_counting_and_landing_counts_once(
        tmp_path, redis_server, redis_client):
    """Writer a (a real process) counts a batch against the players' minute and is killed
    (SIGKILL, the fault seam at `ingest.after_claim`) before anything lands; the client's
    retry of the same events reaches writer b in the same minute. The count was a counter
    the dead writer never gave back, so the retry counted twice: under a limit of 3, all
    three genuine events were held for review. Now a minute counts identities: the retry
    gets the numbers the dead attempt took, lands all three, holds nothing; a fourth
    event of the minute is still held."""
    settings = _settings(tmp_path, limit=3)
    rows = [(f"k{n}", "kim", 1) for n in range(3)]
    code = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
sys.path.insert(0, {str(Path(__file__).parents[1])!r})
import redis
from pathlib import Path
from test_rate import NOW, _ingest, _settings
from speed_layer.service import SpeedLayer
settings = _settings(Path({str(tmp_path)!r}), limit=3)
client = redis.Redis.from_url({redis_server.url!r}, protocol=2)
_ingest(settings, SpeedLayer(client, settings.registry, settings.lake_dir), {rows!r},
        writer="a")
"""
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=300,
                           env=dict(os.environ, LEADERBOARD_FAULTS="ingest.after_claim=kill"))
    assert child.returncode == -9, child.stderr.decode()[-2000:]
    assert _rows(settings.lake_dir, "events") == []
    speed = SpeedLayer(redis_client, settings.registry, settings.lake_dir)
    retry = _ingest(settings, speed, rows, NOW + timedelta(seconds=5), writer="b")
    assert (retry.accepted, retry.rejected) == (3, 0)
    assert sorted(r["match_id"] for r in _rows(settings.lake_dir, "events")) == ["k0", "k1",
                                                                                "k2"]
    assert _rows(settings.lake_dir, "quarantine") == []
    fourth = _ingest(settings, speed, [("k3", "kim", 1)], NOW + timedelta(seconds=6),
                     writer="b")
    assert (fourth.accepted, fourth.rejected) == (0, 1)
    assert [r["match_id"] for r in _rows(settings.lake_dir, "quarantine")] == ["k3"]


def test_two_writers_share_the_limit(tmp_path, redis_client):
    settings = _settings(tmp_path, limit=4)
    speed = SpeedLayer(redis_client, settings.registry, settings.lake_dir)
    kept = 0
    for n in range(6):
        report = _ingest(settings, speed, [(f"x{n}", "erin", 1)], writer="ab"[n % 2])
        kept += report.accepted
    assert kept == 4
    assert len(_rows(settings.lake_dir, "quarantine")) == 2


def test_batch_and_speed_agree_on_what_was_held(tmp_path, redis_client):
    """The merged answers (speed layer, before any batch holds these events) equal the
    batch of everything: both read the one decision the lake records."""
    settings = _settings(tmp_path, limit=2)
    speed = SpeedLayer(redis_client, settings.registry, settings.lake_dir)
    _ingest(settings, speed, [(f"a{n}", "alice", 5) for n in range(4)]
            + [("a0", "bob", 7), ("a1", "bob", 1)])
    _ingest(settings, speed, [("a9", "alice", 100), ("b2", "bob", 3)],
            NOW + timedelta(seconds=20))
    boards = Leaderboards(settings.lake_dir, settings.registry, redis_client,
                          now=lambda: NOW + timedelta(days=1))
    merged = boards.top("global", 10, window="all-time")["entries"]
    assert [(e["player_id"], e["score"]) for e in merged] == [("alice", 10), ("bob", 8)]
    speed.rebase(run_batch(settings, date(2026, 12, 1)).manifest)
    after = Leaderboards(settings.lake_dir, settings.registry, redis_client,
                         now=lambda: NOW + timedelta(days=1))
    assert [(e["player_id"], e["score"]) for e in
            after.top("global", 10, window="all-time")["entries"]] == [("alice", 10),
                                                                      ("bob", 8)]


def test_limits_and_a_release_on_a_cluster(tmp_path, redis_cluster):
    """On a three-node Redis Cluster: the players' counters spread over the nodes, the
    server's token bucket (one key, one slot) holds, and a held event is released once."""
    from app.http.ratelimit import admit
    from leaderboard.quarantine import list_quarantine
    from speed_layer.review import release_rows

    cluster = redis_cluster.client
    settings = _settings(tmp_path, limit=1)
    speed = SpeedLayer(cluster, settings.registry, settings.lake_dir)
    players = [f"p{n}" for n in range(12)]
    report = _ingest(settings, speed, [(f"m{k}", p, 1) for p in players for k in range(2)])
    assert (report.accepted, report.rejected) == (12, 12)
    holders = {node.name for node in cluster.get_primaries()
               if next(node.redis_connection.scan_iter(match="lb:rate:*"), None) is not None}
    assert len(holders) > 1
    assert [admit(cluster, "s1", 0.001, 2, 1).allowed for _ in range(3)] == [True, True, False]
    held, _ = list_quarantine(settings.lake_dir, limit=1)
    outcomes, fold_error = release_rows(speed, [held[0].id, held[0].id], NOW + timedelta(hours=1))
    assert ([o.status for o in outcomes], fold_error) == (["released"], None)
    again, _ = release_rows(speed, [held[0].id], NOW + timedelta(hours=1))
    assert again[0].status == "already_released"
    assert sum(1 for r in _rows(settings.lake_dir, "events")
               if (r["match_id"], r["player_id"]) == (held[0].values["match_id"],
                                                      held[0].values["player_id"])) == 1


def test_a_held_event_stays_a_retry_after_redis_loses_its_data(tmp_path, redis_client):
    """The rebuild restores the door's record of held ids from the quarantine: without it,
    the retry of a held event after a FLUSHALL landed and counted."""
    settings = _settings(tmp_path, limit=1)
    speed = SpeedLayer(redis_client, settings.registry, settings.lake_dir)
    _ingest(settings, speed, [("m1", "fay", 1), ("m2", "fay", 50)])
    redis_client.flushall()
    speed.rebuild(NOW + timedelta(minutes=5))
    retry = _ingest(settings, speed, [("m2", "fay", 50)], NOW + timedelta(minutes=5))
    assert (retry.accepted, retry.retries) == (0, 1)
    assert [r["match_id"] for r in _rows(settings.lake_dir, "events")] == ["m1"]


#: Drawn cases of the rate model (~0.3 s each on a busy box); .ci/run sets RATE_EXAMPLES.
RATE_EXAMPLES = int(os.environ.get("RATE_EXAMPLES", "15"))


@given(case=rate_deliveries())
@settings(max_examples=RATE_EXAMPLES)
def test_held_and_landed_match_a_model_of_the_rule(case, redis_server, tmp_path_factory):
    """Any deliveries, by two writers over three minutes, with retries and repeats, some of
    whose landings fail part-way (one file per row, the disk full after `fail` files): the
    landing zone and the quarantine hold exactly what a model of the rule (door first, then
    a player's new event counts iff fewer than `limit` count in its landing minute, in
    order; the rows of a failed landing that did not land are forgotten, by the door and by
    the minute, and a held row takes no room) says,
    so no player lands more than the limit in a minute and none is held while the minute
    has room; and the merged board counts exactly the landed events."""
    import redis as redis_module

    from leaderboard import lake as lake_module

    client = redis_module.Redis.from_url(redis_server.url, protocol=2)
    client.flushall()
    settings_ = _settings(tmp_path_factory.mktemp("model"), limit=case["limit"])
    lake = settings_.lake_dir
    speed = SpeedLayer(client, settings_.registry, settings_.lake_dir)
    seen: set[tuple[str, str]] = set()
    per_minute: Counter[tuple[str, int]] = Counter()
    landed: list[tuple[str, str, int]] = []
    held: list[tuple[str, str]] = []
    real = lake_module.atomic_write_parquet
    for writer, minute, second, rows, fail in case["deliveries"]:
        at = NOW.replace(second=0) + timedelta(minutes=minute, seconds=second)
        written: list[Path] = []

        def disk_full(part, target, fail=fail, written=written, **kwargs):  # type: ignore[no-untyped-def]
            if "events" in target.parts and fail is not None:
                if len(written) == fail:
                    raise OSError(28, "No space left on device")
                written.append(target)
            return real(part, target, **kwargs)

        before = {(r["match_id"], r["player_id"]) for r in _rows(lake, "events")}
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(lake_module, "BACKFILL_FILE_ROWS", 1)
            patch.setattr(lake_module, "atomic_write_parquet", disk_full)
            with suppress(OSError):  # the model below says what a failed landing left
                _ingest(settings_, speed, rows, at, writer)
        now_landed = {(r["match_id"], r["player_id"]) for r in _rows(lake, "events")} - before
        kept: list[tuple[str, str, int]] = []
        for match, player, points in rows:  # the model
            if (match, player) in seen:
                continue
            seen.add((match, player))
            if per_minute[(player, minute)] < case["limit"]:  # the minute counts kept rows
                per_minute[(player, minute)] += 1
                kept.append((match, player, points))
            else:
                held.append((match, player))
        if fail is not None and len(kept) > fail:  # which `fail` landed: the lake says
            assert len(now_landed) == fail
            for match, player, _ in kept:
                if (match, player) not in now_landed:
                    seen.discard((match, player))
                    per_minute[(player, minute)] -= 1
            kept = [k for k in kept if (k[0], k[1]) in now_landed]
        landed += kept
    assert sorted((r["match_id"], r["player_id"], r["points"]) for r in _rows(lake, "events")
                  ) == sorted(landed)
    quarantined = _rows(lake, "quarantine")
    assert {r["reason"] for r in quarantined} <= {"implausible_rate"}
    assert sorted((r["match_id"], r["player_id"]) for r in quarantined) == sorted(held)
    boards = Leaderboards(lake, settings_.registry, client, now=lambda: NOW + timedelta(hours=1))
    totals: Counter[str] = Counter()
    for _, player, points in landed:
        totals[player] += points
    assert {e["player_id"]: e["score"] for e in
            boards.top("global", 10, window="all-time")["entries"]} == {
        p: total for p, total in totals.items()}
    client.close()


def _minute_rows(lake: Path, player: str) -> tuple[list[str], list[str]]:
    """The player's landed and held match ids (sorted)."""
    return (sorted(r["match_id"] for r in _rows(lake, "events") if r["player_id"] == player),
            sorted(r["match_id"] for r in _rows(lake, "quarantine")
                   if r["player_id"] == player))


def test_a_landing_failed_part_way_gives_back_only_the_rows_that_did_not_land(
        tmp_path, redis_client, monkeypatch):
    """A landing over several files fails at the second events file (the disk fills): the
    first file's rows landed and count. The give-back returned the numbers of every row of
    the batch, so the resend and two new events of the minute all counted: 5 events landed
    under a limit of 3. Only what did not land is given back now."""
    from leaderboard import lake as lake_module

    settings = _settings(tmp_path, limit=3)
    speed = SpeedLayer(redis_client, settings.registry, settings.lake_dir)
    batch = [(f"g{n}", "gil", 1) for n in range(4)]  # g0-g2 kept (two files), g3 held
    monkeypatch.setattr(lake_module, "BACKFILL_FILE_ROWS", 2)
    real = lake_module.atomic_write_parquet
    events_files: list[Path] = []

    def disk_full(part, target, **kwargs):  # type: ignore[no-untyped-def]
        if "events" in target.parts:
            events_files.append(target)
            if len(events_files) == 2:
                raise OSError(28, "No space left on device")
        return real(part, target, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(lake_module, "atomic_write_parquet", disk_full)
        with pytest.raises(OSError, match="No space left"):
            _ingest(settings, speed, batch)
    assert _minute_rows(settings.lake_dir, "gil") == (["g0", "g1"], ["g3"])
    resend = _ingest(settings, speed, batch, NOW + timedelta(seconds=5), writer="v")
    assert (resend.accepted, resend.retries, resend.rejected) == (1, 3, 0)
    more = _ingest(settings, speed, [("g4", "gil", 1), ("g5", "gil", 1)],
                   NOW + timedelta(seconds=6), writer="v")
    assert (more.accepted, more.rejected) == (0, 2)
    assert _minute_rows(settings.lake_dir, "gil") == (["g0", "g1", "g2"], ["g3", "g4", "g5"])


def test_after_a_give_back_a_new_event_is_held_only_when_the_minute_is_full(
        tmp_path, redis_client):
    """Writer w numbers hal's x0 and x1; meanwhile writer v lands y0 (3rd) and holds y1
    (4th); then w's landing fails and gives x0, x1 back. The minute then holds one landed
    event of three: two more must count. The give-back lowered the count of numbers while
    y1 kept its number 4 (and y0 its 3), so the next event was numbered 3 again and the one
    after 4, held: one event held that the limit allows."""
    settings = _settings(tmp_path, limit=3)
    speed = SpeedLayer(redis_client, settings.registry, settings.lake_dir)
    calls: list[str] = []

    def meanwhile(_name: str) -> None:
        calls.append(_name)
        if len(calls) == 1:  # in w's landing, after it numbered x0 and x1
            other = _ingest(settings, speed, [("y0", "hal", 1), ("y1", "hal", 1)],
                            NOW + timedelta(seconds=1), writer="v")
            assert (other.accepted, other.rejected) == (1, 1)
            raise OSError(28, "No space left on device")

    with faults.injected("ingest.after_claim", meanwhile), \
            pytest.raises(OSError, match="No space left"):
        _ingest(settings, speed, [("x0", "hal", 1), ("x1", "hal", 1)])
    after = _ingest(settings, speed, [("z0", "hal", 1), ("z1", "hal", 1), ("z2", "hal", 1)],
                    NOW + timedelta(seconds=2), writer="v")
    assert (after.accepted, after.rejected) == (2, 1)
    assert _minute_rows(settings.lake_dir, "hal") == (["y0", "z0", "z1"], ["y1", "z2"])


def test_a_minute_counted_by_the_previous_release_keeps_its_limit(tmp_path, redis_client):
    """Review s8: a minute numbered by the release before the within-limit count ('#' and
    the identities only: an upgrade in the minute, or a rolling deploy) read that count as
    0 and admitted a whole limit more. Its identities within the limit are seeded as
    min('#', limit): full here, so the next event is held."""
    settings = _settings(tmp_path, limit=3)
    speed = SpeedLayer(redis_client, settings.registry, settings.lake_dir)
    first = _ingest(settings, speed, [(f"m{n}", "ivy", 1) for n in range(3)])
    assert (first.accepted, first.rejected) == (3, 0)
    (key,) = redis_client.keys("lb:rate:*")
    redis_client.hdel(key, "+")  # as the previous release left it
    assert key.decode() == rate_key("ivy", int(NOW.timestamp()) // 60)
    later = _ingest(settings, speed, [("m3", "ivy", 1)], NOW + timedelta(seconds=5), "v")
    assert (later.accepted, later.rejected) == (0, 1)
    assert later.reasons == {"implausible_rate": 1}
