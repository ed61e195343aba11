"""Per-server rate limits (issue 12 part 5): the keys file's `events_per_second` and
`burst`, one token bucket in Redis shared by every worker, a refused request refused whole.

Refill is set to 0.001 events a second, so a token comes back every 1,000 s: the counts
below do not depend on how fast the machine runs the test."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest
from serve import serving

from app.http import ApiKeys, HttpConfig, create_app
from app.http.ratelimit import admit, bucket_key
from leaderboard.lake import landed_files
from leaderboard.settings import Settings, SettingsError

with warnings.catch_warnings():  # starlette suggests httpx2; httpx is what is installed
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

pytestmark = pytest.mark.redis

NOW = "2026-12-01T18:00:00Z"
KEY = "limited-key-0123456789abcdef"
FREE = "unlimited-key-0123456789abcdef"
KEYS = {"servers": {"s1": {"key": KEY, "events_per_second": 0.001, "burst": 4},
                    "s2": FREE}}


def _event(n: int) -> dict[str, object]:
    return {"match_id": f"m{n}", "player_id": f"p{n % 3}", "points": 5,
            "event_time": "2026-12-01T17:00:00Z", "region": "na", "mode": "ranked"}


def _landed(lake: Path, kind: str = "events") -> list[str]:
    return sorted(row["match_id"] for f in landed_files(lake, kind=kind)
                  for row in pq.read_table(f.path, columns=["match_id"]).to_pylist())


def test_the_keys_file_states_each_servers_limit():
    keys = ApiKeys.parse({"servers": {"a": {"key": KEY, "events_per_second": 50},
                                      "b": {"key": FREE, "events_per_second": 0.5,
                                            "burst": 20}}})
    assert keys.limit_of("a") == (50.0, 50)  # burst defaults to one second's worth
    assert keys.limit_of("b") == (0.5, 20)
    assert keys.limit_of("nobody") is None
    with pytest.raises(SettingsError, match=r"servers\.a\.events_per_second.*above 0"):
        ApiKeys.parse({"servers": {"a": {"key": KEY, "events_per_second": 0}}})
    with pytest.raises(SettingsError, match=r"servers\.a\.burst.*needs `events_per_second`"):
        ApiKeys.parse({"servers": {"a": {"key": KEY, "burst": 5}}})
    with pytest.raises(SettingsError, match=r"servers\.a\.burst.*whole number"):
        ApiKeys.parse({"servers": {"a": {"key": KEY, "events_per_second": 1, "burst": 2.5}}})
    with pytest.raises(SettingsError, match=r"servers\.a` must be a key string"):
        ApiKeys.parse({"servers": {"a": {"events_per_second": 1}}})  # a limit needs a key


def test_the_bucket_refills_and_never_overdraws(redis_client):
    """Direct script calls: a burst, then refusals that say how long to wait."""
    redis_client.delete(bucket_key("x"))
    assert admit(redis_client, "x", 0.001, 3, 2).allowed
    assert admit(redis_client, "x", 0.001, 3, 1).allowed
    refused = admit(redis_client, "x", 0.001, 3, 1)
    assert not refused.allowed
    assert 900 < refused.retry_after <= 1000  # one token: ~1000 s at 0.001/s
    fast = admit(redis_client, "y", 1_000_000.0, 3, 3)  # refills within microseconds
    assert fast.allowed


@pytest.fixture
def two_apps(tmp_path, redis_client):
    """Two apps (two processes' worth: each its own Service and landing writer) on one
    Redis and one lake, as two workers are."""
    settings = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path / "data"),
                                  "LEADERBOARD_NOW": NOW})
    config = HttpConfig(keys=ApiKeys.parse(KEYS))
    with TestClient(create_app(settings, config, client=redis_client)) as a, \
            TestClient(create_app(settings, config, client=redis_client)) as b:
        yield a, b, settings.lake_dir


def _post(client: TestClient, events: list[dict[str, object]], key: str = KEY) -> httpx.Response:
    return client.post("/v1/events", json={"events": events},
                       headers={"Authorization": f"Bearer {key}"})


def test_the_limit_holds_across_apps_and_a_refused_batch_lands_nothing(two_apps):
    a, b, lake = two_apps
    assert _post(a, [_event(1), _event(2)]).status_code == 200
    assert _post(b, [_event(3)]).status_code == 200
    # One token left in the shared bucket: a batch of two is refused whole, at either app.
    refused = _post(a, [_event(4), _event(5)])
    assert refused.status_code == 429, refused.text
    body = refused.json()
    assert body["error"] == "rate_limited"
    assert "nothing of it landed" in body["message"]
    assert int(refused.headers["Retry-After"]) == body["retry_after"] >= 1
    assert _post(b, [_event(4), _event(5)]).status_code == 429
    # Nothing of the refused batches is anywhere in the lake: not landed, not quarantined.
    assert _landed(lake) == ["m1", "m2", "m3"]
    assert _landed(lake, "quarantine") == []
    # The last token is still there for a batch of one; then the bucket is empty.
    assert _post(b, [_event(6)]).status_code == 200
    one = _post(a, [_event(7)])
    assert one.status_code == 429
    assert one.json()["message"].startswith(  # "1 events" before the audit of issue 12
        "server s1 may send 0.001 events a second (bursts of 4); this request of 1 event "
        "was refused whole")
    # A server without a limit is not held back; a batch over the burst could never pass.
    assert _post(a, [_event(n) for n in range(10, 20)], key=FREE).status_code == 200
    too_big = _post(a, [_event(n) for n in range(30, 35)])
    assert too_big.status_code == 413
    assert too_big.json()["error"] == "batch_exceeds_burst"
    assert "m30" not in _landed(lake)


def test_serve_with_two_workers_shares_one_bucket(tmp_path, redis_server, redis_client):
    """`leaderboard serve --workers 2`: ten requests of one event, each on a new connection
    (the kernel spreads them over both workers), and exactly the burst of 4 is admitted.
    Per-worker buckets would admit up to 8."""
    data = tmp_path / "data"
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps(KEYS))
    redis_client.delete(bucket_key("s1"))
    env = {"REDIS_URL": redis_server.url, "LEADERBOARD_NOW": NOW,
           "LEADERBOARD_API_KEYS": str(keys)}
    with serving(data, env, "--workers", "2") as base:
        statuses = []
        for n in range(10):
            answer = httpx.post(f"{base}/v1/events", json={"events": [_event(n)]},
                                headers={"X-API-Key": KEY, "Connection": "close"}, timeout=10)
            statuses.append(answer.status_code)
    assert sorted(statuses) == [200] * 4 + [429] * 6, statuses
    assert len(_landed(data / "lake")) == 4


def test_profile_writes_take_the_same_bucket(two_apps):
    """Regression: PUT /v1/players/{id}/profile had no rate limit. A write is one event of
    the server's bucket (shared with its events, across apps): past it, 429 with
    Retry-After and nothing saved."""
    a, b, _ = two_apps
    headers = {"Authorization": f"Bearer {KEY}"}
    assert _post(a, [_event(1), _event(2)]).status_code == 200
    for n, app in enumerate((a, b)):
        put = app.put(f"/v1/players/p{n}/profile", headers=headers,
                      json={"display_name": f"Player {n}"})
        assert put.status_code == 200, put.text
    refused = b.put("/v1/players/p9/profile", headers=headers, json={"display_name": "Nine"})
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"] == "rate_limited"
    assert "a profile write counts as one and was refused: nothing was saved" in (
        refused.json()["message"])
    assert int(refused.headers["Retry-After"]) >= 1
    assert a.get("/v1/players/p9/profile").status_code == 404
    assert _post(a, [_event(3)]).status_code == 429  # the events share the empty bucket
    free = a.put("/v1/players/p9/profile", headers={"Authorization": f"Bearer {FREE}"},
                 json={"display_name": "Nine"})
    assert free.status_code == 200
