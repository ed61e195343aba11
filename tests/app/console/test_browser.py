"""The console in a real browser: headless Chromium (Debian's, driven by selenium) against
`leaderboard serve` on a free port, over a real lake and a real Redis, with a keys file so
ingest is open. Screenshots of each page are kept in test-artifacts/console/ (git-ignored).

Chromium and chromedriver come from scripts/ensure_browser.sh (`make install`); without them
these tests skip, unless LEADERBOARD_REQUIRE_BROWSER=1 (CI) makes that a failure.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from serve import serving

from speed_layer.service import SpeedLayer

pytestmark = [pytest.mark.redis, pytest.mark.browser, pytest.mark.slow]

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts" / "console"


@pytest.fixture
def browser() -> Iterator[object]:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        message = (f"{' and '.join(missing)} missing: run scripts/ensure_browser.sh as root "
                   "(make install does) to get Debian's chromium and chromium-driver")
        if os.environ.get("LEADERBOARD_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    # Never let Selenium Manager fetch a browser or driver: both binaries are given.
    os.environ["SE_OFFLINE"] = "true"
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1280,1100", "--lang=en-US"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)),
                              options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def server(console_data, console_keys, redis_server, redis_client) -> Iterator[SimpleNamespace]:
    """`leaderboard serve` (uvicorn) on a free port, the speed layer rebuilt in Redis."""
    SpeedLayer(redis_client, console_data.registry, console_data.lake_dir).rebuild(
        console_data.now())
    env = {"REDIS_URL": redis_server.url, "LEADERBOARD_NOW": console_keys.now,
           "LEADERBOARD_API_KEYS": str(console_keys.path), "LEADERBOARD_TOP_TTL": "1"}
    with serving(console_data.data_dir, env) as base:
        yield SimpleNamespace(base=base, keys=console_keys, client=redis_client)


def _wait(driver, condition, timeout: float, what: str):
    """Poll the DOM every 50 ms until `condition(driver)` is truthy; fail with `what`. The
    script replaces rows as it polls: an element gone stale is looked up again."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05, ignored_exceptions=(
        NoSuchElementException, StaleElementReferenceException)).until(condition, message=what)


def _text(driver, selector: str) -> str:
    from selenium.webdriver.common.by import By

    found = driver.find_elements(By.CSS_SELECTOR, selector)
    return found[0].text if found else ""


def _shot(driver, name: str, capsys) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    driver.save_screenshot(str(path))
    with capsys.disabled():
        print(f"\nscreenshot: {path}")
    return path


def _post(server, player: str, points: int, match: str) -> dict:
    event = {"match_id": match, "player_id": player, "points": points,
             "event_time": "2026-12-01T17:30:00Z", "region": "eu", "mode": "ranked"}
    answer = httpx.post(f"{server.base}/v1/events", content=json.dumps({"events": [event]}),
                        headers={"X-API-Key": server.keys.key,
                                 "Content-Type": "application/json"}, timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _unlock(driver, key: str) -> None:
    """Answer the operations page's question for the admin key."""
    from selenium.webdriver.common.by import By

    _wait(driver, lambda d: d.find_element(By.ID, "ops-gate").is_displayed(), 10,
          "the page asking for the admin key")
    field = driver.find_element(By.ID, "ops-key")
    field.clear()
    field.send_keys(key)
    driver.find_element(By.CSS_SELECTOR, "#ops-unlock button[type='submit']").click()


def _severe(driver, *, expected: str | None = None) -> list[str]:
    """Script errors and failed requests the page logged (but the one `expected`)."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"
            and not (expected and expected in e["message"])]


def test_a_new_score_moves_the_searched_player_within_two_seconds(server, browser, capsys):
    from selenium.webdriver.common.by import By

    top = httpx.get(f"{server.base}/v1/boards/global/top", params={"n": 1000}).json()
    player = top["entries"][len(top["entries"]) // 2]["player_id"]
    browser.get(f"{server.base}/")
    _wait(browser, lambda d: _text(d, "tr[data-board='global'] .players").replace(",", "")
          == str(top["total"]), 10, "the boards page shows the global board's player count")
    browser.find_element(By.LINK_TEXT, "Players").click()
    box = _wait(browser, lambda d: d.find_element(By.ID, "player-input"), 10, "a search box")
    box.send_keys(player)
    browser.find_element(By.ID, "player-search").click()
    before = httpx.get(f"{server.base}/v1/boards/global/players/{player}").json()
    _wait(browser, lambda d: _text(d, "#player-rank") == f"#{before['rank']:,}", 10,
          f"the page shows {player}'s rank {before['rank']}")
    assert _text(browser, "#player-score") == f"{before['score']:,}"
    assert _text(browser, "#player-yesterday") == f"#{before['as_of_yesterday']['rank']:,}"

    _post(server, player, 1000, "console-browser-1")
    after = httpx.get(f"{server.base}/v1/boards/global/players/{player}").json()
    assert after["rank"] < before["rank"]
    posted = time.monotonic()
    _wait(browser, lambda d: _text(d, "#player-rank") == f"#{after['rank']:,}", 2.0,
          f"the new rank #{after['rank']} within 2 s of the ingest")
    seen = time.monotonic() - posted
    assert _text(browser, "#player-score") == f"{after['score']:,}"
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#around-rows tr.me"), 2.0,
          "the player highlighted among the players around")
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#history-chart svg"), 5.0,
          "the rank-history chart")
    with capsys.disabled():
        print(f"new rank on the page {seen:.2f} s after the ingest answered")

    friends = [e["player_id"] for e in top["entries"][:3]] + ["nobody-here"]
    browser.find_element(By.ID, "friends-input").send_keys("\n".join(friends))
    browser.find_element(By.CSS_SELECTOR, "form.friends button").click()
    _wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#friends-rows tr")) == 3,
          10, "three friends ranked together")
    assert "nobody-here" in _text(browser, "#friends-unranked")
    assert _text(browser, "#player-rank") == f"#{after['rank']:,}"  # the search is kept
    _shot(browser, "player", capsys)
    assert _severe(browser) == []


def test_board_page_shows_the_mover_and_pages(server, browser, capsys):
    from selenium.webdriver.common.by import By

    top = httpx.get(f"{server.base}/v1/boards/global/top", params={"n": 1000}).json()
    last = top["entries"][-1]["player_id"]
    browser.get(f"{server.base}/console/boards/global?n=10")
    _wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#top-rows tr")) == 10, 10,
          "ten rows of the top")
    assert _text(browser, "#top-rows tr:first-child td:nth-child(2)") == top["entries"][0][
        "player_id"]
    _post(server, last, 1000, "console-browser-2")
    # The top N is cached for LEADERBOARD_TOP_TTL (1 s here) and polled every second.
    _wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, "#top-rows tr:first-child")
          .get_attribute("data-player") == last, 5.0, f"{last} moved to the top")
    _wait(browser, lambda d: "▲" in _text(d, "#top-rows tr:first-child td:nth-child(4)")
          or "new" in _text(d, "#top-rows tr:first-child td:nth-child(4)"), 2.0,
          "the move marked on the row")
    _shot(browser, "board", capsys)
    browser.find_element(By.ID, "top-next").click()
    _wait(browser, lambda d: _text(d, "#top-rows tr:first-child td:first-child") == "11", 5.0,
          "the second page starts at rank 11")
    browser.find_element(By.LINK_TEXT, "weekly").click()
    _wait(browser, lambda d: _text(d, "#top-window").startswith("weekly:"), 10,
          "the weekly window")
    assert _severe(browser) == []
    browser.get(f"{server.base}/console/boards/global?window=hourly")
    _wait(browser, lambda d: "hourly" in _text(d, "#problem"), 10,
          "the API's message about the unknown window on the page")


def test_ops_asks_for_the_admin_key_once(server, browser, capsys):
    """The operations summary is the admin key's: its JSON refuses a request without it
    (401) or with another (403); the page asks for the key, shows nothing of the summary
    before, asks again after a wrong one, shows the summary with the right one and keeps
    it for the tab (a reload does not ask again). The boards stay public: their page and
    JSON answer without any key."""
    from selenium.webdriver.common.by import By

    base = server.base
    refused = httpx.get(f"{base}/console/api/ops")
    assert refused.status_code == 401
    assert refused.json()["error"] == "unauthenticated"
    wrong = httpx.get(f"{base}/console/api/ops", headers={"X-Admin-Key": server.keys.key})
    assert (wrong.status_code, wrong.json()["error"]) == (403, "forbidden")
    browser.get(f"{base}/console/ops")
    _wait(browser, lambda d: d.find_element(By.ID, "ops-gate").is_displayed(), 10,
          "the page asking for the admin key")
    assert "needs the admin key" in _text(browser, "#ops-gate-note")
    assert _text(browser, "#ops-batch") == ""
    assert _text(browser, "#ops-quarantine") == ""
    _shot(browser, "ops-key-asked", capsys)
    _unlock(browser, "not-the-admin-key-0123")
    _wait(browser, lambda d: "wrong admin key" in _text(d, "#ops-gate-note"), 10,
          "the refusal, and the question again")
    assert _text(browser, "#ops-batch") == ""
    _unlock(browser, server.keys.admin)
    _wait(browser, lambda d: "2026-11-30" in _text(d, "#ops-batch"), 10, "the batch as_of")
    assert not browser.find_element(By.ID, "ops-gate").is_displayed()
    assert "points_out_of_bounds" in _text(browser, "#ops-quarantine")
    assert browser.execute_script(
        "return sessionStorage.getItem('leaderboard-admin-key')") == server.keys.admin
    browser.refresh()
    _wait(browser, lambda d: "2026-11-30" in _text(d, "#ops-batch"), 10,
          "the summary after a reload, without asking")
    assert not browser.find_element(By.ID, "ops-gate").is_displayed()
    # A new tab's session has no key; the boards need none.
    browser.execute_script("sessionStorage.clear()")
    assert httpx.get(f"{base}/v1/boards/global/top", params={"n": 3}).status_code == 200
    browser.get(f"{base}/console/boards/global")
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#top-rows tr"), 10,
          "the board's rows, without a key")
    assert _severe(browser, expected="/console/api/ops - Failed to load resource: the server "
                                     "responded with a status of 403") == []


def test_distribution_ops_and_a_ban(server, browser, capsys):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.get(f"{server.base}/console/distribution?board=global")
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#dist-histogram svg rect"), 10,
          "the histogram bars")
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#dist-quantiles svg polyline"),
          10, "the quantile curve")
    assert "top 1%" in browser.find_element(By.ID, "dist-quantiles").text
    _shot(browser, "distribution", capsys)

    browser.get(f"{server.base}/console/ops")
    _unlock(browser, server.keys.admin)
    _wait(browser, lambda d: "2026-11-30" in _text(d, "#ops-batch"), 10, "the batch as_of")
    _wait(browser, lambda d: "unknown_region" in _text(d, "#ops-quarantine")
          and "points_out_of_bounds" in _text(d, "#ops-quarantine"), 10, "quarantine reasons")
    assert _text(browser, "#ops-health-status") == "ok"
    top = httpx.get(f"{server.base}/v1/boards/global/top", params={"n": 1}).json()
    leader = top["entries"][0]["player_id"]
    browser.find_element(By.ID, "admin-key").clear()
    browser.find_element(By.ID, "admin-key").send_keys("wrong-key-0123456789")
    browser.find_element(By.ID, "admin-player").send_keys(leader)
    browser.find_element(By.CSS_SELECTOR, "button[data-action='bans']").click()
    _wait(browser, lambda d: "wrong admin key" in _text(d, "#admin-result"), 5,
          "the API's refusal shown")
    key = browser.find_element(By.ID, "admin-key")
    key.clear()
    key.send_keys(server.keys.admin)
    browser.find_element(By.CSS_SELECTOR, "button[data-action='bans']").click()
    _wait(browser, lambda d: f"{leader}: banned" in _text(d, "#admin-result"), 5,
          "the ban confirmed")
    after = httpx.get(f"{server.base}/v1/boards/global/players/{leader}").json()
    assert after["status"] == "unranked"
    # Quarantine review: list by reason, tick a row, release it; its reason still holds.
    Select(browser.find_element(By.ID, "review-reason")).select_by_value("unknown_region")
    browser.find_element(By.CSS_SELECTOR, "#review button[type='submit']").click()
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#review-rows tbody input"), 5,
          "the quarantined rows listed")
    assert "points_out_of_bounds" not in _text(browser, "#review-rows")
    browser.find_element(By.CSS_SELECTOR, "#review-rows tbody input").click()
    browser.find_element(By.ID, "review-release").click()
    _wait(browser, lambda d: "rejected (unknown_region)" in _text(d, "#review-result"), 5,
          "the release's answer per row")
    # Regression (issue 12): the table showed no board, and the reasons decided outside
    # validation (a score route's shape, a release's unknown_board) were no filter choice.
    # A match event's row has no board; a direct score's names it.
    assert [c.text for c in browser.find_elements(By.CSS_SELECTOR, "#review-rows th")][2:4] \
        == ["REASON", "BOARD"]  # as shown (CSS upper-cases the headers)
    assert _text(browser, "#review-rows tbody td.board") == "—"
    refused = httpx.post(f"{server.base}/v1/boards/best-lap/scores", headers={
        "X-API-Key": server.keys.key}, json={"player_id": "p7", "match_id": "lap-x", "delta": 5})
    assert refused.json()["error"] == "score_expected", refused.text
    reasons = Select(browser.find_element(By.ID, "review-reason"))
    assert {"unknown_board", "implausible_rate", "score_expected", "erased"} <= {
        o.get_attribute("value") for o in reasons.options}
    reasons.select_by_value("score_expected")
    browser.find_element(By.CSS_SELECTOR, "#review button[type='submit']").click()
    _wait(browser, lambda d: _text(d, "#review-rows tbody td.board") == "best-lap", 5,
          "the refused score listed with its board")
    assert "unknown_region" not in _text(browser, "#review-rows")
    _shot(browser, "ops", capsys)
    assert _severe(browser, expected="/v1/admin/bans - Failed to load resource: the server "
                                     "responded with a status of 403") == []


def test_void_and_erase_ask_to_confirm_first(server, browser, capsys):
    """The operations page's void and erase (issue 12 gaps): each form only arms a confirm
    step that says what will happen; Cancel sends nothing; the erasure's button stays
    disabled until the id is typed again; confirmed, the API's answer is shown and the
    boards change."""
    from selenium.webdriver.common.by import By

    base = server.base
    browser.get(f"{base}/console/ops")
    _unlock(browser, server.keys.admin)
    _wait(browser, lambda d: "2026-11-30" in _text(d, "#ops-batch"), 10, "the batch as_of")
    assert browser.find_element(By.ID, "admin-key").get_attribute("value") == server.keys.admin
    # Void: armed, cancelled (nothing sent), armed again and confirmed.
    browser.find_element(By.ID, "void-match").send_keys("m5-0")
    browser.find_element(By.ID, "void-reason").send_keys("exploit")
    browser.find_element(By.CSS_SELECTOR, "#void button[type='submit']").click()
    assert "every result of match m5-0" in _text(browser, "#void-confirm-text")
    browser.find_element(By.ID, "void-no").click()
    assert not browser.find_element(By.ID, "void-confirm").is_displayed()
    assert "nothing was sent" in _text(browser, "#void-result")
    voids = httpx.get(f"{base}/v1/admin/voids", headers={"X-Admin-Key": server.keys.admin})
    assert voids.json()["total"] == 0
    browser.find_element(By.CSS_SELECTOR, "#void button[type='submit']").click()
    browser.find_element(By.ID, "void-yes").click()
    _wait(browser, lambda d: "m5-0: voided" in _text(d, "#void-result"), 20, "the void done")
    voids = httpx.get(f"{base}/v1/admin/voids", headers={"X-Admin-Key": server.keys.admin})
    assert [v["match_id"] for v in voids.json()["voids"]] == ["m5-0"]
    # The same void again: the answer says it stood already; nothing new is recorded.
    browser.find_element(By.CSS_SELECTOR, "#void button[type='submit']").click()
    browser.find_element(By.ID, "void-yes").click()
    _wait(browser, lambda d: "m5-0: already voided at" in _text(d, "#void-result"), 20,
          "the second void answered")
    assert "(reason: exploit); nothing changed" in _text(browser, "#void-result")
    voids = httpx.get(f"{base}/v1/admin/voids", headers={"X-Admin-Key": server.keys.admin})
    assert voids.json()["total"] == 1
    # Erase: the confirm button waits for the id typed again.
    top = httpx.get(f"{base}/v1/boards/global/top", params={"n": 1}).json()
    leader = top["entries"][0]["player_id"]
    browser.find_element(By.ID, "erase-player").send_keys(leader)
    browser.find_element(By.CSS_SELECTOR, "#erase button[type='submit']").click()
    assert f"Erase player {leader} everywhere" in _text(browser, "#erase-confirm-text")
    yes = browser.find_element(By.ID, "erase-yes")
    assert not yes.is_enabled()
    again = browser.find_element(By.ID, "erase-again")
    again.send_keys(leader + "x")
    assert not yes.is_enabled()
    again.clear()
    again.send_keys(leader)
    assert yes.is_enabled()
    _shot(browser, "ops-erase-confirm", capsys)
    yes.click()
    _wait(browser, lambda d: f"{leader}: erased" in _text(d, "#erase-result"), 60,
          "the erasure done")
    after = httpx.get(f"{base}/v1/boards/global/players/{leader}").json()
    assert after["status"] == "unranked"
    assert _severe(browser) == []
