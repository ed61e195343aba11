"""The admin quarantine routes (issue 12 part 5): a held batch answered per row, listed by
reason with paging, released once over HTTP, and the released event on the board."""

from __future__ import annotations

import warnings
from importlib import resources

import pytest

from app.http import ApiKeys, HttpConfig, create_app
from leaderboard.settings import Settings

with warnings.catch_warnings():  # starlette suggests httpx2; httpx is what is installed
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

pytestmark = pytest.mark.redis

NOW = "2026-12-01T18:00:10Z"
KEY = "server-key-0123456789abcdef"
ADMIN = "admin-key-0123456789abcdef"


def _event(match: str, player: str, points: int) -> dict[str, object]:
    return {"match_id": match, "player_id": player, "points": points,
            "event_time": "2026-12-01T17:00:00Z", "region": "na", "mode": "ranked"}


@pytest.fixture
def http(tmp_path, redis_client):
    text = (resources.files("leaderboard") / "registries" / "default.toml").read_text()
    (tmp_path / "registry.toml").write_text(
        text.replace("# player_events_per_minute = 120", "player_events_per_minute = 2"))
    settings = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path / "data"),
                                  "LEADERBOARD_NOW": NOW,
                                  "LEADERBOARD_CONFIG": str(tmp_path / "registry.toml")})
    keys = ApiKeys.parse({"servers": {"s1": KEY}, "admin_key": ADMIN})
    with TestClient(create_app(settings, HttpConfig(keys=keys), client=redis_client)) as client:
        yield client


def test_hold_list_page_and_release_once(http):
    posted = http.post("/v1/events", headers={"X-API-Key": KEY}, json={"events": [
        _event("m1", "alice", 5), _event("m2", "alice", 5), _event("m3", "alice", 40),
        _event("m4", "alice", 1), _event("m1", "bob", 7)]})
    assert posted.status_code == 207, posted.text
    assert [(r["row"], r["reason"]) for r in posted.json()["rejected"]] == [
        (2, "implausible_rate"), (3, "implausible_rate")]

    assert http.get("/v1/admin/quarantine").status_code == 401
    assert http.get("/v1/admin/quarantine", headers={"X-Admin-Key": KEY}).status_code == 403
    admin = {"X-Admin-Key": ADMIN}
    first = http.get("/v1/admin/quarantine", headers=admin,
                     params={"reason": "implausible_rate", "limit": 1}).json()
    assert first["count"] == 1
    assert first["rows"][0]["match_id"] == "m3"
    assert first["rows"][0]["released"] is False
    assert first["next_cursor"] == first["rows"][0]["id"]
    second = http.get("/v1/admin/quarantine", headers=admin,
                      params={"limit": 1, "cursor": first["next_cursor"]}).json()
    assert [r["match_id"] for r in second["rows"]] == ["m4"]
    assert second["next_cursor"] is None  # the last page says so; no empty page after it
    assert http.get("/v1/admin/quarantine", headers=admin,
                    params={"since": "2026-12-02"}).json()["rows"] == []
    since = http.get("/v1/admin/quarantine", headers=admin, params={"since": "soon"})
    assert since.status_code == 422
    assert since.json()["message"].startswith("since: `soon` is not a date")  # not a repr
    bad = http.get("/v1/admin/quarantine", headers=admin, params={"reason": "bogus"})
    assert bad.status_code == 422
    assert set(bad.json()) >= {"error", "message"}

    held = first["rows"][0]["id"]
    assert http.post("/v1/admin/quarantine/release", json={"ids": [held]}).status_code == 401
    done = http.post("/v1/admin/quarantine/release", headers=admin, json={"ids": [held]})
    assert done.status_code == 200, done.text
    assert done.json() == {"released": 1, "results": [{
        "id": held, "status": "released",
        "detail": "landed now: it counts on every board it belongs to"}]}
    top = http.get("/v1/boards/global/top", params={"n": 2}).json()["entries"]
    assert [(e["player_id"], e["score"]) for e in top] == [("alice", 50), ("bob", 7)]
    again = http.post("/v1/admin/quarantine/release", headers=admin, json={"ids": [held]})
    assert again.status_code == 200
    assert again.json()["released"] == 0
    assert again.json()["results"][0]["status"] == "already_released"
    listed = http.get("/v1/admin/quarantine", headers=admin).json()["rows"]
    assert [(r["match_id"], r["released"]) for r in listed] == [("m3", True), ("m4", False)]
    top = http.get("/v1/boards/global/top", params={"n": 2}).json()["entries"]
    assert [(e["player_id"], e["score"]) for e in top] == [("alice", 50), ("bob", 7)]
    malformed = http.post("/v1/admin/quarantine/release", headers=admin,
                          json={"ids": ["not-an-id"]})
    assert malformed.status_code == 422


def test_a_release_whose_fold_failed_is_folded_by_the_next_ingest(http, monkeypatch):
    """Redis fails while folding a release (it landed durably): the answer warns, and the
    worker's next ingest repairs first, so the merged board counts the released event
    without an operator's `speed repair`. Before, the next ingest folded only its own
    writer's files and the released points stayed out of the speed layer."""
    import redis

    from speed_layer.service import SpeedLayer

    assert http.post("/v1/events", headers={"X-API-Key": KEY}, json={"events": [
        _event("m1", "alice", 5), _event("m2", "alice", 5),
        _event("m3", "alice", 40)]}).status_code == 207
    admin = {"X-Admin-Key": ADMIN}
    [held] = http.get("/v1/admin/quarantine", headers=admin).json()["rows"]
    real = SpeedLayer.after_land

    def fold_fails_for_the_release(self, files, **kwargs):
        if any(f.writer == "release" for f in files):
            raise redis.ConnectionError("injected: Redis went away mid-fold")
        return real(self, files, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(SpeedLayer, "after_land", fold_fails_for_the_release)
        done = http.post("/v1/admin/quarantine/release", headers=admin,
                         json={"ids": [held["id"]]}).json()
    assert done["released"] == 1
    assert "speed repair" in done["warning"]
    assert http.post("/v1/events", headers={"X-API-Key": KEY},
                     json={"events": [_event("m9", "bob", 1)]}).status_code == 200
    top = http.get("/v1/boards/global/top", params={"n": 2}).json()["entries"]
    assert [(e["player_id"], e["score"]) for e in top] == [("alice", 50), ("bob", 1)]


def test_scores_are_held_for_rate_and_released_once_over_http(http):
    """Regression: direct scores had no per-player rate hold and could not be released.
    A score past the player's minute answers 422 `implausible_rate` and lies in the
    quarantine with its board; a release lands it on that board once."""
    server, admin = {"X-API-Key": KEY}, {"X-Admin-Key": ADMIN}
    assert http.post("/v1/events", headers=server,
                     json={"events": [_event("m1", "alice", 5)]}).status_code == 200
    first = http.post("/v1/boards/best-lap/scores", headers=server,
                      json={"player_id": "alice", "match_id": "lap-1", "score": 900})
    assert first.status_code == 200, first.text
    held = http.post("/v1/boards/best-lap/scores", headers=server,
                     json={"player_id": "alice", "match_id": "lap-2", "score": 700})
    assert held.status_code == 422, held.text
    assert (held.json()["error"], held.json()["accepted"]) == ("implausible_rate", False)
    assert "quarantine release" in held.json()["message"]
    [row] = http.get("/v1/admin/quarantine", headers=admin,
                     params={"reason": "implausible_rate"}).json()["rows"]
    assert (row["board"], row["match_id"], row["points"]) == ("best-lap", "lap-2", "700")
    done = http.post("/v1/admin/quarantine/release", headers=admin, json={"ids": [row["id"]]})
    assert done.json()["results"][0]["status"] == "released", done.text
    again = http.post("/v1/admin/quarantine/release", headers=admin, json={"ids": [row["id"]]})
    assert again.json()["results"][0]["status"] == "already_released"
    top = http.get("/v1/boards/best-lap/top", params={"n": 2}).json()["entries"]
    assert [(e["player_id"], e["score"]) for e in top] == [("alice", 700)]


def test_the_cursor_survives_an_erasure_between_pages(http):
    """Regression: an erasure (DELETE /v1/admin/players/{id}) rewrites the quarantine files
    without the player's rows; the next page resumed at the cursor's old row number and
    skipped the rows that moved up. Now it resumes after the cursor's row; a cursor whose
    row was erased answers 409 `stale_cursor` saying to list again."""
    server, admin = {"X-API-Key": KEY}, {"X-Admin-Key": ADMIN}
    refused = http.post("/v1/events", headers=server, json={"events": [
        {**_event(f"m{n}", player, 1), "region": "moon"}
        for n, player in enumerate(["ann", "ben", "cat", "dan"])]})
    assert refused.status_code == 422, refused.text
    first = http.get("/v1/admin/quarantine", headers=admin, params={"limit": 2}).json()
    assert [r["player_id"] for r in first["rows"]] == ["ann", "ben"]
    assert http.delete("/v1/admin/players/ann", headers=admin).status_code == 200
    rest = http.get("/v1/admin/quarantine", headers=admin,
                    params={"cursor": first["next_cursor"]}).json()
    assert [r["player_id"] for r in rest["rows"]] == ["cat", "dan"]
    assert http.delete("/v1/admin/players/ben", headers=admin).status_code == 200
    stale = http.get("/v1/admin/quarantine", headers=admin,
                     params={"cursor": first["next_cursor"]})
    assert stale.status_code == 409
    assert stale.json()["error"] == "stale_cursor"
    assert "list again without a cursor" in stale.json()["message"]
