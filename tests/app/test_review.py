"""`leaderboard quarantine list|release`: tables for people, --json for scripts."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from app.cli import main

pytestmark = pytest.mark.redis


@pytest.fixture
def data(tmp_path, monkeypatch, redis_server, redis_client):
    text = (resources.files("leaderboard") / "registries" / "default.toml").read_text()
    (tmp_path / "registry.toml").write_text(
        text.replace("# player_events_per_minute = 120", "player_events_per_minute = 1"))
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    monkeypatch.setenv("LEADERBOARD_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("LEADERBOARD_NOW", "2026-12-01T18:00:00Z")
    monkeypatch.setenv("LEADERBOARD_CONFIG", str(tmp_path / "registry.toml"))
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps(
        {"match_id": f"m{n}", "player_id": "zoe", "points": n, "event_time":
         "2026-12-01T17:00:00Z", "region": "eu", "mode": "casual"}) + "\n" for n in (1, 2)))
    assert main(["ingest", str(events)]) == 0
    return tmp_path / "data"


def test_list_and_release(data, capsys):
    capsys.readouterr()
    assert main(["quarantine", "list", "--reason", "implausible_rate", "--json"]) == 0
    page = json.loads(capsys.readouterr().out)
    [row] = page["rows"]
    assert (row["match_id"], row["reason"], row["released"]) == ("m2", "implausible_rate",
                                                                 False)
    # Counted, not landed: the held event never landed (it said "landed 2 events" before
    # the audit of issue 12).
    assert row["detail"].startswith("player zoe sent 2 events in the minute from "), row
    assert main(["quarantine", "list"]) == 0
    table = capsys.readouterr().out
    assert row["id"] in table
    assert "implausible_rate" in table
    assert main(["quarantine", "release", row["id"], "2026-12-01.cli.9.9.00000000", "--json"]) == 1
    answer = json.loads(capsys.readouterr().out)
    assert [r["status"] for r in answer["results"]] == ["released", "not_found"]
    assert main(["quarantine", "release", row["id"]]) == 0
    assert "already_released" in capsys.readouterr().out
    assert main(["rank", "global", "zoe", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["score"] == 3
    assert main(["quarantine", "release"]) == 2
    assert "needs the ids" in capsys.readouterr().err


def test_a_held_score_is_released_from_the_cli(data, capsys):
    """Regression: a score submitted with `leaderboard score submit` past the player's
    minute (zoe's events filled it) was landed, not held; now it is held with its board and
    `leaderboard quarantine release` lands it there."""
    assert main(["score", "submit", "best-lap", "zoe", "800", "--match", "lap-1",
                 "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["error"] == "implausible_rate"
    assert main(["quarantine", "list", "--reason", "implausible_rate", "--json"]) == 0
    row = next(r for r in json.loads(capsys.readouterr().out)["rows"] if r["board"])
    assert (row["board"], row["match_id"]) == ("best-lap", "lap-1")
    # The table shows the board too (regression: it had no board column).
    assert main(["quarantine", "list", "--reason", "implausible_rate"]) == 0
    assert "best-lap" in capsys.readouterr().out
    assert main(["quarantine", "release", row["id"], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["results"][0]["status"] == "released"
    assert main(["rank", "best-lap", "zoe", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["score"] == 800


def test_a_stale_cursor_is_refused_with_what_to_do(data, capsys):
    """The CLI's side of the stale cursor (an erasure removed the cursor's row): exit 2 and
    the way on, no traceback."""
    moon = data.parent / "moon.jsonl"
    moon.write_text("".join(json.dumps(
        {"match_id": "m9", "player_id": player, "points": 1, "event_time":
         "2026-12-01T17:00:00Z", "region": "moon", "mode": "casual"}) + "\n"
        for player in ("ann", "ben")))
    assert main(["ingest", str(moon)]) == 0
    capsys.readouterr()
    assert main(["quarantine", "list", "--reason", "unknown_region", "--limit", "1",
                 "--json"]) == 0
    cursor = json.loads(capsys.readouterr().out)["next_cursor"]
    assert main(["erase", "ann", "--yes"]) == 0
    capsys.readouterr()
    assert main(["quarantine", "list", "--cursor", cursor]) == 2
    assert "list again without a cursor" in capsys.readouterr().err


def test_every_reason_is_in_the_readme_the_openapi_and_the_cli(data, capsys):
    """One list of reasons (leaderboard.validation.REASONS): the README's table, the OpenAPI
    enum of `reason=` and the CLI's `--reason` choices are exactly it (regression: the
    README listed none, and `unknown_board` and the score route's codes were no choice)."""
    import re
    import typing
    from pathlib import Path

    from app.http.routers.quarantine import Reason
    from leaderboard.validation import REASONS

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    table = readme.split("**Quarantine reasons.**", 1)[1].split("\n\n", 2)[1]
    assert re.findall(r"^\| `([a-z_]+)` \|", table, re.MULTILINE) == list(REASONS)
    assert set(typing.get_args(Reason)) == set(REASONS)
    for reason in ("unknown_board", "score_expected", "implausible_rate", "erased"):
        assert main(["quarantine", "list", "--reason", reason, "--json"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["quarantine", "list", "--reason", "no_such_reason"])
    assert "unknown_board" in capsys.readouterr().err  # the choices are listed


def test_a_row_quarantined_again_is_listed_with_its_new_id(tmp_path, redis_client, capsys):
    """A score released after its board left the registry is quarantined again (reason
    `unknown_board`) and nothing lands. The listing showed the old row `released: true`
    without the new id, as if it counted; now it shows `released: false` and `moved_to`
    the new row's id (the CLI table: "moved to <id>"), and the new row as neither."""
    from datetime import UTC, datetime, timedelta

    import pyarrow as pa
    from rich.console import Console

    from app.review import quarantine_page, render_page
    from leaderboard.lake import LandingWriter
    from leaderboard.schema import TIMESTAMP
    from leaderboard.settings import Settings
    from speed_layer.ingest import Ingestor
    from speed_layer.review import release_rows
    from speed_layer.service import SpeedLayer

    now = datetime(2026, 12, 1, 12, tzinfo=UTC)
    text = (resources.files("leaderboard") / "registries" / "default.toml").read_text()
    (tmp_path / "with.toml").write_text(text)
    (tmp_path / "without.toml").write_text(text.replace('name = "best-lap"',
                                                        'name = "best-lap-2"'))
    settings, gone = (Settings.from_env({"LEADERBOARD_DATA": str(tmp_path / "data"),
                                         "LEADERBOARD_CONFIG": str(tmp_path / name)})
                      for name in ("with.toml", "without.toml"))
    speed = SpeedLayer(redis_client, settings.registry, settings.lake_dir)
    table = pa.table({"match_id": ["lap-7"], "player_id": ["cy"],
                      "points": pa.array([640], pa.int64()),
                      "event_time": pa.array([now + timedelta(hours=1)], TIMESTAMP),
                      "server_id": ["s1"]})
    with LandingWriter(settings.lake_dir, "w") as writer:  # ahead of the clock: held
        Ingestor(settings.registry, writer, speed).ingest(
            table, now=now, source="test", board=settings.registry.board("best-lap"))
    [old] = quarantine_page(settings.lake_dir)["rows"]
    assert (old["released"], old["moved_to"]) == (False, None)
    [outcome], _ = release_rows(SpeedLayer(redis_client, gone.registry, gone.lake_dir),
                                [old["id"]], now + timedelta(hours=2))
    assert outcome.status == "requarantined"
    page = quarantine_page(settings.lake_dir)
    listed = {row["reason"]: row for row in page["rows"]}
    new = listed["unknown_board"]
    assert (listed["event_time_in_future"]["released"],
            listed["event_time_in_future"]["moved_to"]) == (False, new["id"])
    assert (new["released"], new["moved_to"]) == (False, None)
    console = Console(width=400)
    with console.capture() as shown:
        console.print(render_page(page))
    assert f"moved to {new['id']}" in shown.get()


def test_the_listing_table_is_readable_on_an_80_column_terminal():
    """Regression (audit of issue 12): at 80 columns (a piped or small terminal) the id,
    reason and board columns took the width and the values were folded one character a
    line ("p", "0", "0", ...). Each row's id, reason, player, match, points, board and what
    a release did are now whole on the page."""
    from rich.console import Console

    from app.review import render_page

    rows = [
        {"id": "2026-11-29.gen.5.0.1903155e", "reason": "points_out_of_bounds",
         "board": None, "player_id": "p0000098", "match_id": "m3-0054", "points": "1000143",
         "released": False, "moved_to": None},
        {"id": "2026-12-03.http.12.0.6681bcfa", "reason": "implausible_rate",
         "board": "best-lap", "player_id": "p0000161", "match_id": "race-5",
         "points": "5000", "released": True, "moved_to": None},
        {"id": "2026-12-03.cli.4.0.a69a5911", "reason": "event_time_in_future",
         "board": "best-lap", "player_id": "zoe", "match_id": "lap-7", "points": "640",
         "released": False, "moved_to": "2026-12-03.release.0.0.0b1c2d3e"},
    ]
    console = Console(width=80)
    with console.capture() as shown:
        console.print(render_page({"count": 3, "next_cursor": rows[-1]["id"], "rows": rows}))
    lines = shown.get().splitlines()
    assert max(len(line) for line in lines) <= 80
    for row in rows:
        values = [row["id"], row["reason"], row["player_id"], row["match_id"], row["points"]]
        assert all(any(value in line for line in lines) for value in values), (row, lines)
    text = shown.get()
    assert "on best-lap" in text
    assert "released" in text
    assert "moved to 2026-12-03.release.0.0.0b1c2d3e" in text
