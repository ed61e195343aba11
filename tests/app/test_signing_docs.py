"""docs/signing.md's worked example is what the server computes and accepts: its Python
and its curl+openssl snippets print the documented signature, and the documented request,
sent at the documented time with that signature, is a 200 (so the page cannot drift from
the scheme)."""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest

from app.http import ApiKeys, HttpConfig, create_app
from leaderboard.settings import Settings

with warnings.catch_warnings():  # starlette suggests httpx2; httpx is what is installed
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

PAGE = Path(__file__).resolve().parents[2] / "docs" / "signing.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)


def _documented_signature() -> str:
    (found,) = [b.strip() for b in _blocks("") if re.fullmatch(r"[0-9a-f]{64}", b.strip())]
    return found


def test_the_python_snippet_prints_the_documented_signature():
    (snippet,) = _blocks("python")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(snippet, {})  # the page's own example
    assert printed.getvalue().strip() == _documented_signature()


def test_the_shell_snippet_prints_the_documented_signature():
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    (snippet,) = _blocks("sh")
    # curl is replaced by a function that prints nothing: the test sends no request.
    run = subprocess.run(["bash", "-c", "curl() { :; }\n" + snippet], capture_output=True,
                         text=True, check=True)
    assert run.stdout.strip() == _documented_signature()


@pytest.mark.redis
def test_the_server_accepts_the_documented_request(tmp_path, redis_client):
    (snippet,) = _blocks("python")
    values = dict(re.findall(r'^(secret|timestamp) = "([^"]+)"', snippet, re.M))
    body = re.search(r"^body = b'(.*)'$", snippet, re.M)
    path = re.search(r'"PUT", "(/v1/players/[^"]+)", ""', snippet)
    assert body is not None
    assert path is not None
    now = "2025-12-01T18:00:00Z"
    assert values["timestamp"] == "1764612000"  # the page's date, in Unix seconds
    settings = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path / "data"),
                                  "LEADERBOARD_NOW": now})
    keys = ApiKeys.parse({"servers": {"na-1": {"secret": values["secret"]}}})
    app = create_app(settings, HttpConfig(keys=keys), client=redis_client)
    with TestClient(app) as client:
        answer = client.put(path.group(1), content=body.group(1).encode(), headers={
            "X-Server-Id": "na-1", "X-Timestamp": values["timestamp"],
            "X-Signature": "sha256=" + _documented_signature()})
        assert answer.status_code == 200, answer.text
        assert answer.json()["display_name"] == "Ann"
