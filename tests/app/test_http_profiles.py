"""Profiles over HTTP against a real Redis and lake: PUT with a game server's credential,
GET, each bad field answered 422 with its own error code, display names in every listing
route, and the top-N page of the worker that took a rename showing it at once."""

from __future__ import annotations

import json
import warnings
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from signing import signed_headers

from app.http import ApiKeys, HttpConfig, create_app
from app.http.replay import request_key
from leaderboard.lake import LandingWriter
from leaderboard.profiles import history_of
from leaderboard.schema import TIMESTAMP
from leaderboard.settings import Settings
from speed_layer.ingest import Ingestor
from speed_layer.service import SpeedLayer

with warnings.catch_warnings():  # starlette suggests httpx2; httpx is what is installed
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

pytestmark = pytest.mark.redis

NOW = datetime(2026, 12, 1, 18, tzinfo=UTC)
KEY = "eu-1-key-0123456789abcdef"
SECRET = "na-1-secret-0123456789abcdef"
ADMIN = "admin-key-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {KEY}"}
STAMP = int(NOW.timestamp())


@pytest.fixture
def http(tmp_path, redis_client):
    """ann 9, bob 5, carol 3 on region:na in the speed layer; the app with a 5 s top TTL."""
    settings = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path / "data"),
                                  "LEADERBOARD_NOW": NOW.isoformat()})
    speed = SpeedLayer(redis_client, settings.registry, settings.lake_dir)
    players = [("ann", 9), ("bob", 5), ("carol", 3)]
    table = pa.table({
        "match_id": ["m1"] * 3, "player_id": [p for p, _ in players],
        "points": pa.array([n for _, n in players], pa.int64()),
        "event_time": pa.array([NOW - timedelta(hours=2)] * 3, TIMESTAMP),
        "region": ["na"] * 3, "mode": ["ranked"] * 3, "server_id": ["s1"] * 3})
    with LandingWriter(settings.lake_dir, "t") as writer:
        Ingestor(settings.registry, writer, speed).ingest(table, now=NOW - timedelta(hours=1),
                                                          source="t")
    keys = ApiKeys.parse({"servers": {"eu-1": KEY, "na-1": {"secret": SECRET}},
                          "admin_key": ADMIN})
    app = create_app(settings, HttpConfig(keys=keys, top_ttl=5.0), client=redis_client)
    with TestClient(app) as client:
        client.lake = settings.lake_dir
        yield client


def _put(http, player, body, headers=AUTH):
    return http.put(f"/v1/players/{player}/profile", content=json.dumps(body).encode(),
                    headers=headers)


def test_put_then_get_a_profile(http):
    answer = _put(http, "ann", {"display_name": "Ann\u0301e", "country": "KR",
                                "avatar_url": "https://cdn.example/ann.png"})
    assert answer.status_code == 200, answer.text
    stored = {"player_id": "ann", "display_name": "Ann\u0301e", "country": "KR",
              "avatar_url": "https://cdn.example/ann.png", "updated_at": "2026-12-01T18:00:00Z"}
    stored["display_name"] = "An\u0144e"  # NFC: n + combining acute is one character
    assert answer.json() == stored
    assert http.get("/v1/players/ann/profile").json() == stored
    # Latest write wins; the lake keeps both.
    assert _put(http, "ann", {"display_name": "Ann"}).json()["country"] is None
    assert http.get("/v1/players/ann/profile").json()["display_name"] == "Ann"
    assert [p.display_name for p in history_of(http.lake, "ann")] == ["An\u0144e", "Ann"]
    missing = http.get("/v1/players/zed/profile")
    assert missing.status_code == 404
    assert missing.json()["error"] == "profile_not_found"
    assert "PUT /v1/players/zed/profile" in missing.json()["message"]


def _signed_put(player: str, body: bytes, timestamp: int = STAMP) -> dict[str, str]:
    return signed_headers(SECRET, "PUT", f"/v1/players/{player}/profile", body, timestamp,
                          "na-1")



def test_a_signed_put_is_accepted(http):
    body = json.dumps({"display_name": "Bob"}).encode()
    headers = _signed_put("bob", body)
    answer = http.put("/v1/players/bob/profile", content=body, headers=headers)
    assert answer.status_code == 200, answer.text
    tampered = http.put("/v1/players/bob/profile", content=body.replace(b"Bob", b"Eve"),
                        headers=headers)
    assert tampered.status_code == 403
    assert http.get("/v1/players/bob/profile").json()["display_name"] == "Bob"


def test_a_captured_signed_put_is_refused_on_another_players_path(http):
    """The signature covers the path: a signed PUT of ann's profile, sent with the same
    headers and body to bob's path within the window, is refused and saves nothing."""
    body = json.dumps({"display_name": "Ann"}).encode()
    captured = _signed_put("ann", body)
    assert http.put("/v1/players/ann/profile", content=body,
                    headers=captured).status_code == 200
    moved = http.put("/v1/players/bob/profile", content=body, headers=captured)
    assert moved.status_code == 403, moved.text
    assert moved.json()["error"] == "forbidden"
    assert http.get("/v1/players/bob/profile").status_code == 404
    assert not history_of(http.lake, "bob")


def test_a_replayed_signed_put_does_not_undo_a_later_rename(http):
    """A signed write is applied once per signature: the same request sent again within the
    window, after a later rename, saves nothing and answers the profile as it is now
    (`Idempotent-Replayed: true`), so the rename stands."""
    body = json.dumps({"display_name": "Ann"}).encode()
    captured = _signed_put("ann", body)
    first = http.put("/v1/players/ann/profile", content=body, headers=captured)
    assert first.status_code == 200, first.text
    assert "idempotent-replayed" not in first.headers
    assert _put(http, "ann", {"display_name": "Annie"}).status_code == 200
    again = http.put("/v1/players/ann/profile", content=body, headers=captured)
    assert again.status_code == 200, again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["display_name"] == "Annie"
    assert http.get("/v1/players/ann/profile").json()["display_name"] == "Annie"
    assert [p.display_name for p in history_of(http.lake, "ann")] == ["Ann", "Annie"]
    # A new signature (another second) is another write: it is applied.
    later = http.put("/v1/players/ann/profile", content=body,
                     headers=_signed_put("ann", body, STAMP + 1))
    assert later.status_code == 200
    assert http.get("/v1/players/ann/profile").json()["display_name"] == "Ann"


def test_a_signed_put_refused_for_a_bad_field_may_be_sent_again(http, redis_client):
    """A write that saved nothing (422) leaves its id free: the same request is judged
    again, not answered as a repeat, and the stored request ids name no player."""
    body = json.dumps({"display_name": " bad "}).encode()
    headers = _signed_put("ann", body)
    for _ in range(2):
        answer = http.put("/v1/players/ann/profile", content=body, headers=headers)
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"] == "invalid_display_name"
    good = json.dumps({"display_name": "Ann"}).encode()
    assert http.put("/v1/players/ann/profile", content=good,
                    headers=_signed_put("ann", good)).status_code == 200
    keys = [k.decode() for k in redis_client.scan_iter("lb:request:*")]
    assert len(keys) == 1
    assert "ann" not in keys[0]


def test_a_repeat_while_the_first_is_being_applied_is_a_409(http, redis_client):
    """While another worker applies a request (its id claimed, not yet done), the same
    request is answered 409 in_flight_elsewhere with Retry-After and saves nothing; once
    the claim lapses (that worker died), the request is applied."""
    body = json.dumps({"display_name": "Ann"}).encode()
    headers = _signed_put("ann", body)
    claim = request_key("na-1", "sig:" + headers["X-Signature"].removeprefix("sha256="))
    redis_client.set(claim, b"pending", ex=30)
    busy = http.put("/v1/players/ann/profile", content=body, headers=headers)
    assert busy.status_code == 409, busy.text
    assert busy.json()["error"] == "in_flight_elsewhere"
    assert busy.headers["retry-after"] == "1"
    assert not history_of(http.lake, "ann")
    redis_client.delete(claim)  # the claim's 30 s ran out
    assert http.put("/v1/players/ann/profile", content=body,
                    headers=headers).status_code == 200


def test_an_api_key_write_with_a_request_id_is_applied_once(http):
    """With an API key, X-Request-Id names the write: a repeat within the window saves
    nothing and answers the profile as it is; another id is another write; an id that is
    not visible ASCII of 1-128 characters is a 422."""
    first = _put(http, "bob", {"display_name": "Bobby"}, dict(AUTH, **{"X-Request-Id": "r-1"}))
    assert first.status_code == 200, first.text
    assert _put(http, "bob", {"display_name": "Rob"}, dict(AUTH, **{"X-Request-Id": "r-2"})
                ).status_code == 200
    repeat = _put(http, "bob", {"display_name": "Bobby"}, dict(AUTH, **{"X-Request-Id": "r-1"}))
    assert (repeat.status_code, repeat.json()["display_name"]) == (200, "Rob")
    assert repeat.headers["idempotent-replayed"] == "true"
    assert [p.display_name for p in history_of(http.lake, "bob")] == ["Bobby", "Rob"]
    bad = _put(http, "bob", {"display_name": "Bobby"}, dict(AUTH, **{"X-Request-Id": "a b"}))
    assert bad.status_code == 422
    assert bad.json()["error"] == "bad_request_id"


def test_a_request_id_sent_with_another_request_is_refused(http):
    """X-Request-Id names one request: sent again within the window with another player or
    another body, it is a 422 request_id_reused and saves nothing (not a 200 or 404 as if
    the write had been applied); the first request sent again is still a repeat."""
    with_id = dict(AUTH, **{"X-Request-Id": "r-1"})
    assert _put(http, "bob", {"display_name": "Bobby"}, with_id).status_code == 200
    for player, body in (("ann", {"display_name": "Annie"}),
                         ("bob", {"display_name": "Robert"})):
        answer = _put(http, player, body, with_id)
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"] == "request_id_reused"
        assert "new id" in answer.json()["message"]
    assert not history_of(http.lake, "ann")
    assert [p.display_name for p in history_of(http.lake, "bob")] == ["Bobby"]
    repeat = _put(http, "bob", {"display_name": "Bobby"}, with_id)
    assert (repeat.status_code, repeat.headers["idempotent-replayed"]) == (200, "true")


@pytest.mark.parametrize(("headers", "status"), [
    ({}, 401), ({"Authorization": "Bearer not-a-key-0123456789"}, 403),
    ({"X-API-Key": ADMIN}, 403),  # the admin key is not a game server's
])
def test_a_put_needs_a_game_servers_credential(http, headers, status):
    answer = _put(http, "ann", {"display_name": "Mallory"}, headers)
    assert answer.status_code == status
    assert set(answer.json()) >= {"error", "message"}
    assert not history_of(http.lake, "ann")


@pytest.mark.parametrize(("body", "code"), [
    ({"display_name": "x" * 33}, "invalid_display_name"),
    ({"display_name": "a\u202eb"}, "invalid_display_name"),
    ({"country": "KR"}, "invalid_display_name"),
    ({"display_name": "ann", "country": "Korea"}, "invalid_country"),
    ({"display_name": "ann", "avatar_url": "http://cdn.example/a.png"}, "invalid_avatar_url"),
    ({"display_name": "ann", "level": 3}, "invalid_profile"),
    (["ann"], "invalid_profile"),
])
def test_bad_input_is_a_422_with_a_specific_code(http, body, code):
    answer = _put(http, "ann", body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"] == code
    assert answer.json()["message"]
    assert not history_of(http.lake, "ann")  # nothing landed


def test_bad_json_and_bad_ids(http):
    answer = http.put("/v1/players/ann/profile", content=b"{nope", headers=AUTH)
    assert (answer.status_code, answer.json()["error"]) == (400, "bad_json")
    assert _put(http, "bad id!", {"display_name": "x"}).status_code == 422
    assert http.get("/v1/players/bad%20id!/profile").status_code == 422


def test_every_listing_route_carries_display_names(http):
    assert _put(http, "ann", {"display_name": "Ann Lee"}).status_code == 200
    top = http.get("/v1/boards/region:na/top").json()["entries"]
    assert [(e["player_id"], e["display_name"]) for e in top] == [
        ("ann", "Ann Lee"), ("bob", None), ("carol", None)]
    around = http.get("/v1/boards/region:na/players/bob/around", params={"k": 1}).json()
    assert around["above"][0]["display_name"] == "Ann Lee"
    assert around["player"]["display_name"] is None
    friends = http.get("/v1/boards/region:na/friends", params={"ids": "carol,ann"}).json()
    assert [e["display_name"] for e in friends["entries"]] == ["Ann Lee", None]
    assert http.get("/v1/boards/region:na/players/ann").json()["display_name"] == "Ann Lee"


def test_a_rename_shows_in_the_cached_top_at_once(http):
    """The top-N page is cached for 5 s; the worker that took the rename forgets it."""
    first = http.get("/v1/boards/region:na/top").json()["entries"]
    assert first[1]["display_name"] is None
    assert _put(http, "bob", {"display_name": "Robert"}).status_code == 200
    again = http.get("/v1/boards/region:na/top").json()["entries"]
    assert [(e["player_id"], e["display_name"]) for e in again][1] == ("bob", "Robert")


def test_a_405_allows_every_method_of_the_path(http):
    """GET and PUT are two routes on one path: Starlette's 405 named the first one only."""
    answer = http.delete("/v1/players/ann/profile")
    assert answer.status_code == 405
    assert answer.headers["allow"] == "GET, PUT"
    assert answer.json()["error"] == "method_not_allowed"


def test_a_body_over_16_kib_is_refused_unread(http):
    answer = http.put("/v1/players/ann/profile", headers=AUTH,
                      content=b'{"display_name": "' + b"x" * 20_000 + b'"}')
    assert (answer.status_code, answer.json()["error"]) == (413, "body_too_large")

    def chunks():
        yield b'{"display_name": "'
        for _ in range(40):
            yield b"x" * 1000  # no Content-Length: refused while streaming
        yield b'"}'

    streamed = http.put("/v1/players/ann/profile", headers=AUTH, content=chunks())
    assert streamed.status_code == 413
    assert not history_of(http.lake, "ann")


def test_after_redis_loss_the_app_reloads_profiles_with_the_speed_state(http, redis_client):
    """The background rebuild reloads the profile cache too, so the first read after it
    does not block on a reload."""
    from leaderboard.profiles import PROFILES_KEY

    assert _put(http, "ann", {"display_name": "Ann Lee"}).status_code == 200
    redis_client.flushall()
    assert http.get("/v1/boards/region:na/top").status_code == 503  # starts the rebuild
    service = http.app.state.service
    service.rebuild_thread.join(60)
    assert redis_client.hexists(PROFILES_KEY, "")  # loaded before any read asked
    top = http.get("/v1/boards/region:na/top").json()["entries"]
    assert top[0]["display_name"] == "Ann Lee"


def test_a_profile_of_an_erased_player_is_refused(http):
    """After an erasure a game server's PUT of the id is a 422 `erased` and writes nothing,
    as its events are refused. Before, the write landed the id in the profile log again."""
    from leaderboard.erasure import record_erasure
    from leaderboard.profiles import profiles_dir

    record_erasure(http.lake, "bob", NOW)
    refused = _put(http, "bob", {"display_name": "Bob"})
    assert (refused.status_code, refused.json()["error"]) == (422, "erased")
    assert "erased" in refused.json()["message"]
    assert not list(profiles_dir(http.lake).glob("*.parquet"))
    assert _put(http, "ann", {"display_name": "Ann"}).status_code == 200


def test_a_profile_write_during_an_erasure_answers_503_and_saves_nothing(http, monkeypatch):
    """Regression (review s9, finding 1): a profile write waited at the erasure barrier for
    the whole erasure, holding a thread of the pool ingest shares; about 40 of them stalled
    `POST /v1/events` and `/healthz` until the erasure ended. It now waits a moment, then
    answers 503 `erasure_running` with Retry-After, having saved nothing."""
    import app.http.routers.profiles as profiles_module
    from leaderboard.erasure import erasure_barrier

    monkeypatch.setattr(profiles_module, "PROFILE_ERASURE_WAIT", 0.1)
    with erasure_barrier(http.lake, exclusive=True):  # as a running erasure holds it
        answer = _put(http, "ann", {"display_name": "Ann"})
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"] == "erasure_running"
        assert answer.headers["Retry-After"] == "5"
        assert history_of(http.lake, "ann") == []
    assert _put(http, "ann", {"display_name": "Ann"}).status_code == 200
    assert [p.display_name for p in history_of(http.lake, "ann")] == ["Ann"]
