"""What the demo prints next: its keys file, and `curl` lines that work as printed.

Regression: the demo served with ingest closed (no keys: every POST was 403) and printed no
way to write; `leaderboard` was not on PATH after `make demo`.
"""

from __future__ import annotations

import json
import shlex
import stat
import sys
import warnings
from datetime import UTC, datetime
from pathlib import Path

import pytest

from app.demo import demo_keys, next_steps
from app.http import HttpConfig, create_app
from leaderboard.settings import Settings, SettingsError

with warnings.catch_warnings():  # starlette suggests httpx2; httpx is what is installed
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

NOW = datetime(2026, 12, 1, 18, 0, tzinfo=UTC)
URL = "http://127.0.0.1:8000"


def curls(text: str) -> list[list[str]]:
    """The printed curl commands, as argument lists (continuation lines joined)."""
    joined = text.replace("\\\n", " ")
    return [shlex.split(line.strip()) for line in joined.splitlines()
            if line.strip().startswith("curl ")]


def as_request(argv: list[str]) -> tuple[str, str, dict[str, str], bytes | None]:
    method, path, headers, body = "GET", "", {}, None
    args = iter(argv[1:])
    for arg in args:
        if arg == "-X":
            method = next(args)
        elif arg == "-H":
            name, _, value = next(args).partition(": ")
            headers[name] = value
        elif arg == "-d":
            body = next(args).encode()
        elif arg.startswith("http"):
            path = arg.removeprefix(URL)
    return method, path, headers, body


def test_demo_keys_are_made_once_private_and_valid(tmp_path):
    keys = demo_keys(tmp_path)
    assert stat.S_IMODE(keys.path.stat().st_mode) == 0o600
    assert demo_keys(tmp_path) == keys  # reused: a key printed earlier stays valid
    loaded = HttpConfig.from_env({"LEADERBOARD_API_KEYS": str(keys.path)}).keys
    assert loaded.server_for_key(keys.server_key) == "demo"
    assert loaded.is_admin(keys.admin_key)
    assert keys.server_key != keys.admin_key


def test_a_keys_file_without_the_demo_server_says_what_to_do(tmp_path):
    (tmp_path / "demo-keys.toml").write_text('[servers]\nother = "0123456789abcdefXYZ"\n')
    with pytest.raises(SettingsError, match="delete the file"):
        demo_keys(tmp_path)


@pytest.mark.redis
def test_the_printed_curls_work_as_printed(tmp_path, redis_client):
    keys = demo_keys(tmp_path)
    printed = next_steps(URL, keys, NOW)
    assert "X-Admin-Key" in printed
    commands = curls(printed)
    assert len(commands) == 4
    settings = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path),
                                  "LEADERBOARD_NOW": NOW.isoformat()})
    config = HttpConfig.from_env({"LEADERBOARD_API_KEYS": str(keys.path)})
    with TestClient(create_app(settings, config, client=redis_client)) as client:
        answers = []
        for argv in commands:
            method, path, headers, body = as_request(argv)
            answer = client.request(method, path, headers=headers, content=body)
            answers.append(answer)
            assert answer.status_code == 200, (path, answer.text)
    posted, player, banned, _top = (a.json() for a in answers)
    assert posted["accepted"] == 1
    assert (player["player_id"], player["status"], player["score"]) == ("you", "ranked", 500)
    assert json.dumps(banned)


def test_without_the_api_only_the_cli_is_suggested(tmp_path):
    printed = next_steps(None, None, NOW)
    assert "curl" not in printed
    assert "leaderboard top global" in printed


def test_the_activation_line_is_printed_when_leaderboard_is_not_on_path(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    printed = next_steps(None, None, NOW)
    scripts = Path(sys.executable).parent
    assert any(line.strip().startswith((". ", "export PATH=")) and
               ("activate" in line or str(scripts) in line)
               for line in printed.splitlines())
