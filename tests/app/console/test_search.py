"""The console's player search by display name (profiles), through the app on a real lake
and Redis: a name naming one player opens their page, several are listed, an id still
works and lists the players whose name starts with it."""

from __future__ import annotations

import json
from html import escape

import pytest

pytestmark = pytest.mark.redis


@pytest.fixture
def console(console, console_keys):
    """The shared console app (conftest), three players named."""
    for player, name in (("p001", "South Korea"), ("p002", "South Africa"),
                         ("p003", "Brazil")):
        answer = console.put(f"/v1/players/{player}/profile",
                             content=json.dumps({"display_name": name}),
                             headers={"X-API-Key": console_keys.key})
        assert answer.status_code == 200, answer.text
    return console


def _player_of(html: str) -> str:
    return html.split('data-player="', 1)[1].split('"', 1)[0]


def test_a_name_naming_one_player_opens_their_page(console):
    html = console.get("/console/players", params={"player": "brazil"}).text
    assert _player_of(html) == "p003"
    assert 'id="player-card"' in html


def test_a_name_naming_several_lists_them(console):
    html = console.get("/console/players", params={"player": "south "}).text
    assert _player_of(html) == ""
    assert "Players named “south…”" in html
    assert html.index("South Africa") < html.index("South Korea")  # by name
    assert "player=p001" in html
    assert 'id="player-card"' not in html


def test_an_id_still_opens_its_page(console):
    html = console.get("/console/players", params={"player": "p002"}).text
    assert _player_of(html) == "p002"
    assert 'id="name-matches"' not in html  # no one's name starts with "p002"


def test_no_match_says_so_and_is_escaped(console):
    html = console.get("/console/players", params={"player": "<b>nobody here"}).text
    assert f"No player named “{escape('<b>nobody here')}…”" in html
    assert "<b>nobody" not in html
