"""The whole product on a three-node Redis Cluster, through the `leaderboard` command and the
HTTP app, with REDIS_URL=redis+cluster://...: ingest (CLI and HTTP, retries dropped by the
door), batch (and the rebase it runs), merged reads, bans (CLI and HTTP), a lost state
rebuilt, status, and a second batch. At every step the merged answers equal a batch of
everything landed so far (run on a copy of the lake, no Redis)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from lakes import random_stream

from app.http import HttpConfig, create_app
from jobs.batch import run_batch
from leaderboard.batch_view import open_current
from leaderboard.settings import Settings

with warnings.catch_warnings():  # starlette suggests httpx2; httpx is what is installed
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

pytestmark = pytest.mark.redis

#: (board, window_id) -> [(player, score, rank)] ordered by rank, then player.
Standings = dict[tuple[str, str], list[tuple[str, int, int]]]

REPO = Path(__file__).resolve().parents[2]
START = datetime(2026, 11, 28, tzinfo=UTC)
KEY = "eu-1-key-0123456789abcdef"
ADMIN = "admin-key-0123456789abcdef"


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def _wire(event: dict[str, Any]) -> dict[str, Any]:
    return {"match_id": event["match_id"], "player_id": event["player_id"],
            "points": event["points"], "event_time": _stamp(event["event_time"]),
            "region": event["region"], "mode": event["mode"]}


class Product:
    """The data dir, the cluster's REDIS_URL, and the two ways in: the CLI and HTTP."""

    def __init__(self, root: Path, url: str) -> None:
        self.root = root
        self.data = root / "data"
        self.keys = root / "keys.toml"
        self.keys.write_text(f'admin_key = "{ADMIN}"\n[servers]\n"eu-1" = "{KEY}"\n')
        self.env = {**os.environ, "REDIS_URL": url, "LEADERBOARD_DATA": str(self.data),
                    "LEADERBOARD_API_KEYS": str(self.keys),
                    "PYTHONPATH": os.pathsep.join(filter(None, [
                        str(REPO), os.environ.get("PYTHONPATH")]))}
        self.env.pop("LEADERBOARD_CONFIG", None)
        script = Path(sys.executable).with_name("leaderboard")
        self.command = [str(script)] if script.exists() else [sys.executable, "-m", "app.cli"]

    def cli(self, now: datetime, *argv: str) -> Any:
        """`leaderboard ARGV --json` at `now`: its JSON answer (the exit code must be 0)."""
        done = subprocess.run([*self.command, *argv, "--json"], capture_output=True, text=True,
                              env={**self.env, "LEADERBOARD_NOW": _stamp(now)}, timeout=300)
        assert done.returncode == 0, f"{argv}: {done.stdout}\n{done.stderr}"
        return json.loads(done.stdout)

    def http(self, now: datetime) -> TestClient:
        """A fresh app (so no top-N cache of an earlier step) whose Redis client is the one
        `connect` builds from REDIS_URL: the cluster client."""
        env = {k: v for k, v in self.env.items() if k.startswith(("LEADERBOARD_", "REDIS_"))}
        settings = Settings.from_env({**env, "LEADERBOARD_NOW": _stamp(now)})
        return TestClient(create_app(settings, HttpConfig.from_env(env)))

    def everything(self, now: datetime, as_of: date) -> Standings:
        """The standings of a full batch, on a copy of the lake, of every event landed and
        every ban tombstone so far (`as_of`'s watermark is past all of them)."""
        copy = self.root / f"reference-{now:%Y%m%d%H%M}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(self.data / "lake", copy / "lake", symlinks=True)
        settings = Settings.from_env({"LEADERBOARD_DATA": str(copy),
                                      "LEADERBOARD_NOW": _stamp(now)})
        run_batch(settings, as_of, full=True)
        view = open_current(copy / "lake")
        assert view is not None
        found: Standings = {}
        for board, window_id in view.windows():
            table = view.standings(board, window_id)
            assert table is not None
            found[(board, window_id)] = _rows([(r["player_id"], r["score"], r["rank"])
                                               for r in table.to_pylist()])
        return found


def _merged(http: TestClient, reference: Standings) -> Standings:
    """Every board-window of the reference as the HTTP app serves it merged."""
    found: Standings = {}
    for board, window_id in reference:
        answer = http.get(f"/v1/boards/{board}/top", params={"window": window_id, "n": 1000})
        assert answer.status_code == 200, answer.text
        found[(board, window_id)] = [(e["player_id"], e["score"], e["rank"])
                                     for e in answer.json()["entries"]]
        assert answer.json()["total"] == len(reference[(board, window_id)])
    return found


def _rows(rows: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    return sorted(rows, key=lambda r: (r[2], r[0]))


def _assert_merged_equals(http: TestClient, reference: Standings) -> None:
    served = _merged(http, reference)
    assert {k: _rows(v) for k, v in served.items()} == reference
    assert any(reference.values())


def test_the_whole_path_on_a_redis_cluster(redis_cluster, tmp_path):
    product = Product(tmp_path, redis_cluster.url)
    events = random_stream(41, start=START, days=3, matches=70, players=20, late_share=0.0,
                           duplicate_share=0.0)
    first_cut = datetime(2026, 11, 29, 22, tzinfo=UTC)
    second_cut = datetime(2026, 11, 30, 10, tzinfo=UTC)
    third_cut = datetime(2026, 11, 30, 14, tzinfo=UTC)
    first = [e for e in events if e["event_time"] < first_cut]
    second = [e for e in events if first_cut <= e["event_time"] < second_cut]
    third = [e for e in events if second_cut <= e["event_time"] < third_cut]
    assert first
    assert second
    assert third

    # 1. The CLI lands the first two days before any batch (no base: all speed).
    source = tmp_path / "first.jsonl"
    source.write_text("".join(json.dumps(_wire(e)) + "\n" for e in first))
    landed = product.cli(first_cut, "ingest", str(source))
    assert landed["total"]["accepted"] == len(first)

    # 2. The nightly batch publishes 11-29 and rebases the speed layer on the cluster.
    night = datetime(2026, 11, 30, 1, tzinfo=UTC)
    published = product.cli(night, "batch", "--as-of", "2026-11-29")
    assert published["speed_rebased_to"] == published["version"]

    # 3. More through the CLI, with a re-delivery of the first file's rows: the door (its
    # id buckets spread over the nodes) drops them as retries.
    source = tmp_path / "second.jsonl"
    source.write_text("".join(json.dumps(_wire(e)) + "\n" for e in second + first[:10]))
    landed = product.cli(second_cut, "ingest", str(source))
    assert landed["total"]["accepted"] == len(second)

    # 4. HTTP ingest, the same batch twice: the second answer is all retries.
    body = json.dumps({"events": [_wire(e) for e in third]}).encode()
    with product.http(third_cut) as http:
        for retries in (0, len(third)):
            answer = http.post("/v1/events", content=body,
                               headers={"Authorization": f"Bearer {KEY}"})
            assert answer.status_code == 200, answer.text
            assert answer.json()["retries"] == retries
            assert answer.json()["folded"] is True

    # 5. Bans: one through the CLI, two through HTTP (admin), and one of those undone (the
    # unban replays the player's folded rows in one MULTI per board-window).
    players = sorted({e["player_id"] for e in events})
    ban_at = third_cut + timedelta(minutes=30)
    subprocess.run([*product.command, "ban", players[0], "--reason", "cheating"], check=True,
                   env={**product.env, "LEADERBOARD_NOW": _stamp(ban_at)}, capture_output=True)
    with product.http(ban_at) as http:
        for action, player in (("bans", players[1]), ("bans", players[2]),
                               ("unbans", players[2])):
            answer = http.post(f"/v1/admin/{action}", json={"player_id": player},
                               headers={"X-Admin-Key": ADMIN})
            assert answer.status_code == 200, answer.text

    # The merged answers (CLI and HTTP) equal a batch of everything landed and banned.
    read_at = ban_at + timedelta(minutes=5)
    reference = product.everything(read_at, date(2026, 11, 30))
    assert all(p not in {players[0], players[1]} for rows in reference.values() for p, *_ in rows)
    with product.http(read_at) as http:
        _assert_merged_equals(http, reference)
        assert http.get("/healthz").json()["status"] == "ok"
        listing = reference[("global", "all-time")]
        middle = listing[len(listing) // 2]
        around = http.get(f"/v1/boards/global/players/{middle[0]}/around",
                          params={"k": 2}).json()
        assert (around["player"]["score"], around["player"]["rank"]) == middle[1:]
        assert http.get("/v1/boards/global/percentiles").status_code == 200
        assert "leaderboard_redis_up 1.0" in http.get("/metrics").text
    top = product.cli(read_at, "top", "global", "--window", "daily:2026-11-30", "-n", "1000")
    assert _rows([(e["player_id"], e["score"], e["rank"]) for e in top["entries"]]
                 ) == reference[("global", "daily:2026-11-30")]
    leader = reference[("global", "all-time")][0]
    rank = product.cli(read_at, "rank", "global", leader[0])
    assert (rank["player_id"], rank["score"], rank["rank"]) == leader
    status = product.cli(read_at, "speed", "status")
    assert status["state"].startswith("ok")
    assert status["lag_files"] == 0
    assert status["banned"] == 2
    assert status["keys"] > 0

    # 6. Redis loses everything (every node flushed): status says so, `speed rebuild`
    # recreates the state from the lake alone, and the answers are the same.
    for node in redis_cluster.nodes:
        node.flushall()
    assert product.cli(read_at, "speed", "status")["state"].startswith("lost")
    product.cli(read_at, "speed", "rebuild")
    with product.http(read_at) as http:
        _assert_merged_equals(http, reference)

    # 7. The next night's batch holds everything; after its rebase the answers still agree.
    next_night = datetime(2026, 12, 1, 1, tzinfo=UTC)
    published = product.cli(next_night, "batch", "--as-of", "2026-11-30")
    assert published["speed_rebased_to"] == published["version"]
    with product.http(next_night) as http:
        _assert_merged_equals(http, reference)
    status = product.cli(next_night, "speed", "status")
    assert status["version"] == published["version"]
    assert status["lag_files"] == 0
