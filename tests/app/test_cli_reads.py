"""The `leaderboard` reads added for parity with the HTTP API (friends, history, boards,
top --cursor) and player profiles (profile set|get), each as JSON and as tables for people,
on a real Redis and a real lake."""

from __future__ import annotations

import json

import pytest
import redis

from app.cli import main
from leaderboard.profiles import history_of

NOW = "2026-12-01T12:00:00Z"
GOOD = {"match_id": "m1", "player_id": "alice", "points": 5,
        "event_time": "2026-12-01T10:00:00Z", "region": "na", "mode": "ranked"}

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def served(tmp_path_factory, redis_server, publish_cli_lake):
    """The shared CLI lake (tests/app/conftest.py), published as of 2026-11-29 and
    2026-11-30. Built once for the module (two batches): the tests read it, and the profile
    tests each write a player of their own."""
    client = redis.Redis.from_url(redis_server.url, protocol=2)
    client.flushall()
    tmp_path = tmp_path_factory.mktemp("cli-reads")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("REDIS_URL", redis_server.url)
        env.setenv("LEADERBOARD_DATA", str(tmp_path / "data"))
        env.setenv("LEADERBOARD_NOW", NOW)
        env.delenv("LEADERBOARD_CONFIG", raising=False)
        yield publish_cli_lake(tmp_path, nights=2)
    client.flushall()
    client.close()


@pytest.fixture(autouse=True)
def _quiet(capsys):
    capsys.readouterr()  # what the module's fixture printed


def run_json(capsys, *argv: str) -> tuple[int, dict]:
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_help_lists_every_command(capsys):
    """`leaderboard --help` crashed: a help text held "x% of", which argparse formats."""
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for command in ("friends", "history", "boards", "profile", "percentiles", "top"):
        assert f"    {command} " in out, command


def test_friends(served, capsys):
    code, answer = run_json(capsys, "friends", "global", "erin", "zed", "dave", "bob")
    assert code == 0
    assert [(e["friend_rank"], e["player_id"], e["rank"], e["score"])
            for e in answer["entries"]] == [(1, "dave", 1, 11), (2, "bob", 3, 8),
                                            (3, "erin", 4, 7)]
    assert answer["unranked"] == ["zed"]
    assert main(["friends", "global", "erin", "zed", "dave"]) == 0
    out = capsys.readouterr().out
    assert "global all-time: 2 friends ranked together" in out
    assert "unranked: zed" in out
    assert main(["friends", "global", "bad id!"]) == 2
    assert "player id 'bad id!'" in capsys.readouterr().err


def test_history(served, capsys):
    code, answer = run_json(capsys, "history", "region:eu", "erin")
    assert code == 0
    assert [(r["as_of"], r["window"], r["rank"], r["score"]) for r in answer["history"]] == [
        ("2026-11-29", "all-time", 2, 2), ("2026-11-30", "all-time", 1, 7)]
    code, answer = run_json(capsys, "history", "region:eu", "erin", "--window", "daily",
                            "--from", "2026-11-30")
    assert [(r["window"], r["rank"]) for r in answer["history"]] == [("daily:2026-11-30", 1)]
    assert main(["history", "region:eu", "erin"]) == 0
    out = capsys.readouterr().out
    assert "erin on region:eu (all-time windows): rank on each published day" in out
    assert "2026-11-30" in out
    assert main(["history", "global", "erin", "--from", "2026-12-02", "--to", "2026-12-01"]) == 2
    assert "--from 2026-12-02 is after --to 2026-12-01" in capsys.readouterr().err
    assert main(["history", "global", "erin", "--from", "yesterday"]) == 2
    assert "not a calendar date" in capsys.readouterr().err


def test_boards(served, capsys):
    code, answer = run_json(capsys, "boards")
    assert code == 0
    first = answer["boards"][0]
    assert first["board"] == "global"
    assert {"kind": "daily", "window": "daily:2026-12-01",
            "next_reset": "2026-12-02T00:00:00Z"} in first["windows"]
    assert main(["boards"]) == 0
    out = capsys.readouterr().out
    assert "sum desc" in out
    assert "weekly:2026-W49" in out
    assert "2026-12-07 00:00" in out  # the weekly window's next reset
    # Which boards take scores (POST .../scores, `score submit`) rather than match events.
    lap = out[out.index("│ best-lap"):]
    assert "fed by" in lap, out
    assert "scores" in lap, out
    assert "fed by" not in out[:out.index("│ best-lap")]


def test_top_pages_by_cursor(served, capsys):
    _, page = run_json(capsys, "top", "global", "-n", "2")
    assert [e["player_id"] for e in page["entries"]] == ["dave", "alice"]
    _, second = run_json(capsys, "top", "global", "-n", "2", "--cursor",
                            page["next_cursor"])
    assert [(e["player_id"], e["rank"]) for e in second["entries"]] == [("bob", 3), ("erin", 4)]
    _, last = run_json(capsys, "top", "global", "-n", "2", "--cursor", second["next_cursor"])
    assert [e["player_id"] for e in last["entries"]] == ["carol"]
    assert last["next_cursor"] is None
    assert main(["top", "global", "-n", "2", "--cursor", page["next_cursor"]]) == 0
    out = capsys.readouterr().out
    assert "global all-time: 2 from rank 3 of 5" in out
    assert f"next page: --cursor {second['next_cursor']}" in out
    assert main(["top", "global", "--cursor", "!!"]) == 2
    said = capsys.readouterr().err
    assert "is not one this API returned" in said
    assert "next_cursor of the previous page" in said  # what to do (audit of issue 12)


def test_profile_set_get_and_names_in_every_listing(served, capsys):
    code, answer = run_json(capsys, "profile", "set", "dave", "--name", "Dave\u0301",
                            "--country", "KR", "--avatar", "https://cdn.example/d.png")
    assert code == 0
    assert answer["profile"] == {
        "player_id": "dave", "display_name": "Dav\u00e9", "country": "KR",
        "avatar_url": "https://cdn.example/d.png", "updated_at": "2026-12-01T12:00:00Z"}
    assert main(["profile", "set", "dave", "--name", "Big Dave"]) == 0
    capsys.readouterr()
    code, got = run_json(capsys, "profile", "get", "dave", "--history")
    assert got["profile"]["display_name"] == "Big Dave"
    assert [w["display_name"] for w in got["history"]] == ["Dav\u00e9", "Big Dave"]
    # The serving cache has the latest name: every listing shows it.
    code, top = run_json(capsys, "top", "global", "-n", "2")
    assert [(e["player_id"], e["display_name"]) for e in top["entries"]] == [
        ("dave", "Big Dave"), ("alice", None)]
    code, rank = run_json(capsys, "rank", "global", "dave")
    assert rank["display_name"] == "Big Dave"
    code, around = run_json(capsys, "around", "global", "alice", "-k", "1")
    assert around["above"][0]["display_name"] == "Big Dave"
    code, friends = run_json(capsys, "friends", "global", "dave")
    assert friends["entries"][0]["display_name"] == "Big Dave"
    assert main(["top", "global", "-n", "2"]) == 0
    assert "Big Dave" in capsys.readouterr().out
    # The one-line rank names the player too (the audit of issue 12 found it without).
    assert main(["rank", "global", "dave"]) == 0
    assert capsys.readouterr().out.startswith("dave (Big Dave) on global all-time: rank 1")
    assert main(["profile", "get", "dave"]) == 0
    assert "Big Dave" in capsys.readouterr().out
    assert main(["profile", "get", "zed"]) == 0
    assert "zed has no profile" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "says"), [
    (["profile", "set", "dave"], "needs --name"),
    (["profile", "set", "dave", "--name", "x" * 33], "33 characters"),
    (["profile", "set", "dave", "--name", "ok", "--country", "Korea"], "not an ISO 3166-1"),
    (["profile", "set", "dave", "--name", "ok", "--avatar", "http://x.example/a"],
     "http and other schemes are refused"),
    (["profile", "get", "bad id!"], "player id 'bad id!'"),
])
def test_bad_profile_input_exits_2_and_lands_nothing(served, capsys, argv, says):
    before = history_of(served / "lake", "dave")
    assert main(argv) == 2
    assert says in capsys.readouterr().err
    assert history_of(served / "lake", "dave") == before


def test_profile_import_lands_the_good_rows_in_one_file(served, capsys, tmp_path):
    source = tmp_path / "names.csv"
    source.write_text("player_id,display_name,country,avatar_url\n"
                      "alice,Alice A.,US,\n"
                      "bob,,,\n"
                      "erin,Erin,Moon,\n"
                      "bad id!,Bad,,\n")
    before = len(list((served / "lake" / "profiles").glob("*.parquet")))
    code, answer = run_json(capsys, "profile", "import", str(source))
    assert code == 0
    assert answer["imported"] == 1
    assert [(r["row"], r["player_id"]) for r in answer["rejected"]] == [
        (2, "bob"), (3, "erin"), (4, "bad id!")]
    assert "display_name is required" in answer["rejected"][0]["problem"]
    assert len(list((served / "lake" / "profiles").glob("*.parquet"))) == before + 1
    _, rank = run_json(capsys, "rank", "global", "alice")
    assert rank["display_name"] == "Alice A."


def test_profile_import_names_a_bad_row_instead_of_crashing(served, capsys, tmp_path):
    """A CSV row with more cells than its header (csv keys them by None) and an unknown
    column are rejected by row with a plain message; before, sorting the None key beside a
    column name raised TypeError out of the CLI."""
    source = tmp_path / "ragged.csv"
    source.write_text("player_id,display_name,nick\n"
                      "alice,Alice,ace\n"
                      "bob,Bob,b,extra cell\n")
    code, answer = run_json(capsys, "profile", "import", str(source))
    assert code == 0
    assert answer["imported"] == 0
    assert answer["rejected"] == [
        {"row": 1, "player_id": "alice",
         "problem": "unknown field `nick`; a profile has display_name, country and "
                    "avatar_url"},
        {"row": 2, "player_id": "bob",
         "problem": "the row has more cells than the header has columns"}]


def test_football_import_names_every_team(served, tmp_path, capsys, football_results):
    """The walkthrough's step: the results file gives each team id its readable name."""
    from app.football import team_profiles

    teams = {pid: (name, country) for pid, name, country in team_profiles(football_results)}
    assert teams["South_Korea"] == ("South Korea", "KR")
    assert teams["Ivory_Coast"] == ("Ivory Coast", "CI")
    assert teams["England"] == ("England", None)  # no ISO 3166-1 code of its own
    assert len(teams) == 337
    assert main(["--data", str(tmp_path / "fb"), "--config", "football", "profile", "import",
                 str(football_results), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["imported"] == 337
    _, got = run_json(capsys, "--data", str(tmp_path / "fb"), "--config", "football",
                      "profile", "get", "South_Korea")
    assert got["profile"]["display_name"] == "South Korea"


def test_speed_rebuild_reloads_the_profile_cache(served, capsys, redis_server):
    from leaderboard.profiles import PROFILES_KEY

    client = redis.Redis.from_url(redis_server.url, protocol=2)
    assert main(["profile", "set", "carol", "--name", "Carol C."]) == 0
    client.flushall()  # Redis lost its data: the speed state and the profiles
    assert main(["speed", "rebuild"]) == 0
    assert client.hget(PROFILES_KEY, "carol") is not None  # back before any read
    capsys.readouterr()
    _, friends = run_json(capsys, "friends", "global", "carol")
    assert friends["entries"][0]["display_name"] == "Carol C."
    client.close()
