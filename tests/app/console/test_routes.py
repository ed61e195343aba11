"""The console's pages and assets through the app (TestClient) on a real lake and Redis:
what each page renders server-side, escaping, 404s, and the operations JSON."""

from __future__ import annotations

from html import escape

import pytest

from app.console.routes import CONTENT_SECURITY_POLICY, STATIC_FILES
from serving.service import Leaderboards

pytestmark = pytest.mark.redis


def test_home_lists_every_board_with_its_windows_and_next_resets(console, console_data,
                                                                 redis_client):
    page = console.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    boards = Leaderboards(console_data.lake_dir, console_data.registry, redis_client,
                          now=console_data.now).boards()
    assert len(boards) == len(console_data.registry.boards)
    for board in boards:
        assert f'data-board="{escape(board["board"])}"' in page.text
        for window in board["windows"]:
            assert escape(window["window"]) in page.text
            if window["next_reset"] is not None:
                assert f'datetime="{window["next_reset"]}"' in page.text
    assert '<script src="/console/static/console.js" defer>' in page.text
    assert "https://" not in page.text  # nothing from a CDN


def test_board_page_offers_each_window_of_the_board(console, console_data):
    board = console_data.registry.board("region:na")
    page = console.get("/console/boards/region:na", params={"window": "weekly", "n": "10"})
    assert page.status_code == 200
    for kind in board.windows:
        assert f"window={kind}" in page.text
    assert 'data-window="weekly"' in page.text
    assert 'data-n="10"' in page.text
    assert 'class=active>weekly<' in page.text


def test_unknown_board_is_a_404_page_listing_the_boards(console, console_data):
    page = console.get("/console/boards/nope")
    assert page.status_code == 404
    assert "unknown board" in page.text
    for board in console_data.registry.boards:
        assert f">{escape(board.name)}</a>" in page.text


def test_a_page_size_outside_the_choices_falls_back_to_25(console):
    assert 'data-n="25"' in console.get("/console/boards/global", params={"n": "99999"}).text


def test_query_text_echoed_into_pages_is_escaped(console):
    hostile = '"><script>alert(1)</script>'
    page = console.get("/console/players", params={"player": hostile, "friends": hostile,
                                                    "window": hostile})
    assert page.status_code == 200
    assert "<script>alert(1)</script>" not in page.text
    assert escape(hostile) in page.text


def test_assets_are_served_from_the_package(console):
    for name, media in STATIC_FILES.items():
        answer = console.get(f"/console/static/{name}")
        assert answer.status_code == 200
        assert answer.headers["content-type"] == media
        assert len(answer.content) > 1000
    missing = console.get("/console/static/nope.js")
    assert missing.status_code == 404
    assert missing.json()["message"].startswith("no console asset 'nope.js'")
    for name in ("..%2Fpages.py", "../routes.py", "..%2F..%2Fhttp.py"):
        assert console.get(f"/console/static/{name}").status_code == 404


def test_console_routes_stay_out_of_the_api_schema(console):
    paths = console.get("/openapi.json").json()["paths"]
    assert "/v1/boards" in paths
    assert not [p for p in paths if p == "/" or p.startswith("/console")]


def test_ops_json_reports_batch_speed_and_quarantine(console, console_keys):
    ops = console.get("/console/api/ops", headers={"X-Admin-Key": console_keys.admin})
    assert ops.status_code == 200
    body = ops.json()
    assert body["batch"]["as_of"] == "2026-11-30"
    assert body["batch"]["duration_seconds"] > 0
    assert body["speed"]["version"] == body["batch"]["version"]
    assert body["speed"]["lag_files"] == 0
    assert body["quarantine"]["rows"] == 10
    assert {r["reason"] for r in body["quarantine"]["reasons"]} == {
        "unknown_region", "points_out_of_bounds"}


@pytest.mark.parametrize(("headers", "status"), [
    ({}, 401), ({"X-Admin-Key": "not-the-admin-key-0123"}, 403),
    ({"X-Admin-Key": "console-test-key-0123456789"}, 403),  # a game server's key
    ({"Authorization": "Bearer console-admin-key-0123456789"}, 200),
])
def test_ops_json_is_for_the_admin_key_only(console, headers, status):
    """The operations summary names writers, versions and quarantine counts: without the
    admin key it is a JSON 401/403 that says what to send, and none of it is in the
    answer; the boards' reads stay public."""
    ops = console.get("/console/api/ops", headers=headers)
    assert ops.status_code == status, ops.text
    if status != 200:
        assert set(ops.json()) == {"error", "message"}
        assert "admin key" in ops.json()["message"]
        assert "quarantine" not in ops.text
    assert console.get("/v1/boards/global/top?n=3").status_code == 200
    assert console.get("/console/boards/global").status_code == 200


@pytest.mark.parametrize("path", ["/", "/console/boards/global", "/console/players",
                                  "/console/distribution", "/console/ops",
                                  "/console/boards/nope"])
def test_every_page_renders_under_a_same_origin_policy(console, path):
    page = console.get(path)
    assert page.status_code == (404 if path.endswith("nope") else 200)
    assert "<main>" in page.text
    assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "style=" not in page.text  # the policy refuses inline styles
    assert "<script>" not in page.text  # and inline scripts


def test_every_asset_is_package_data(console):
    """A wheel ships app/console/static only as far as pyproject's package-data globs say."""
    import tomllib
    from fnmatch import fnmatch
    from pathlib import Path

    pyproject = Path(__file__).resolve().parents[3] / "pyproject.toml"
    globs = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-data"][
        "app.console"]
    for name in STATIC_FILES:
        assert any(fnmatch(f"static/{name}", pattern) for pattern in globs), name
