"""The `leaderboard` command: ingest of every file format, exit codes, batch and report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from app.cli import main
from leaderboard.lake import landed_files

NOW = "2026-12-01T12:00:00Z"
GOOD = {"match_id": "m1", "player_id": "alice", "points": 5,
        "event_time": "2026-12-01T10:00:00Z", "region": "na", "mode": "ranked"}


@pytest.fixture
def data(tmp_path, monkeypatch, redis_client, redis_server):
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    monkeypatch.setenv("LEADERBOARD_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("LEADERBOARD_NOW", NOW)
    monkeypatch.delenv("LEADERBOARD_CONFIG", raising=False)
    return tmp_path / "data"


def run_json(capsys, *argv: str) -> tuple[int, dict]:
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def landed_rows(data: Path, kind: str = "events") -> list[dict]:
    rows = []
    for landed in landed_files(data / "lake", kind=kind):
        rows.extend(pq.read_table(landed.path).to_pylist())
    return rows


def test_ingest_jsonl_lands_good_rows_and_quarantines_bad_ones(data, tmp_path, capsys):
    """JSONL is typed JSON, as the HTTP body is: `"points": "7"` is refused bad_type (the
    rule POST /v1/events applies), quarantined with its values as sent, the string's quotes
    kept; the good rows beside it land."""
    source = tmp_path / "events.jsonl"
    lines = [json.dumps(GOOD), "{not json", json.dumps(dict(GOOD, match_id="m2", region="moon")),
             json.dumps(dict(GOOD, match_id="m3", player_id="bob", points="7")), "",
             json.dumps([1, 2]), json.dumps(dict(GOOD, match_id="m4", player_id="bob")),
             json.dumps(dict(GOOD, match_id=5, player_id="eve"))]
    source.write_text("\n".join(lines) + "\n")
    code, report = run_json(capsys, "ingest", str(source))
    assert code == 0
    total = report["total"]
    assert (total["rows"], total["accepted"], total["rejected"]) == (7, 2, 5)
    assert total["reasons"] == {"unparseable": 2, "unknown_region": 1, "bad_type": 2}
    events = sorted(landed_rows(data), key=lambda r: r["match_id"])
    assert [(e["match_id"], e["player_id"], e["points"]) for e in events] == [
        ("m1", "alice", 5), ("m4", "bob", 5)]
    assert all(e["server_id"] == "file" for e in events)
    assert {e["ingested_at"].isoformat() for e in events} == {"2026-12-01T12:00:00+00:00"}
    quarantined = landed_rows(data, "quarantine")
    assert sorted(q["reason"] for q in quarantined) == ["bad_type", "bad_type",
                                                         "unknown_region", "unparseable",
                                                         "unparseable"]
    assert any("line 2" in q["detail"] for q in quarantined)
    typed = {q["player_id"]: q for q in quarantined if q["reason"] == "bad_type"}
    assert (typed["bob"]["match_id"], typed["bob"]["points"], typed["bob"]["region"]) == (
        "m3", '"7"', GOOD["region"])
    assert typed["bob"]["detail"] == 'line 4: points must be a JSON integer (e.g. 5), got a ' \
                                     'string "7"'
    assert (typed["eve"]["match_id"], typed["eve"]["detail"]) == (
        "5", "line 8: match_id must be a JSON string, got a number")


def test_a_mistyped_jsonl_row_keeps_the_default_server_and_its_release_says_bad_type(
        data, tmp_path, capsys):
    """A JSONL row refused bad_type without a server_id is quarantined with --server-id's
    default, as the accepted rows beside it; releasing it answers `rejected`, `bad_type`
    (the reason it was refused), never `missing_field`, and lands nothing, also when the
    wrong type was a JSON number in a text field (`"match_id": 7`, `"player_id": 12345`).
    Points of 5000 digits (past what Python converts) are out of range like any beyond
    int64."""
    source = tmp_path / "typed.jsonl"
    rows = [dict(GOOD, match_id="t-str", points="12"), dict(GOOD, match_id="t-float", points=12.0),
            dict(GOOD, match_id=7), dict(GOOD, match_id="t-num", player_id=12345),
            dict(GOOD, match_id="t-long", points=0)]
    source.write_text("".join(json.dumps(row) + "\n" for row in rows).replace(
        '"points": 0', '"points": ' + "9" * 5000))
    code, report = run_json(capsys, "ingest", str(source))
    assert (code, report["total"]["reasons"]) == (0, {"bad_type": 5})
    code, listed = run_json(capsys, "quarantine", "list")
    assert code == 0
    assert sorted((r["match_id"], r["server_id"]) for r in listed["rows"]) == [
        ("7", "file"), ("t-float", "file"), ("t-long", "file"), ("t-num", "file"),
        ("t-str", "file")]
    assert ["10^18" in r["detail"] for r in listed["rows"] if r["match_id"] == "t-long"] == [
        True]
    code, released = run_json(capsys, "quarantine", "release",
                              *[r["id"] for r in listed["rows"]])
    assert code == 1
    assert [(r["status"], r.get("reason")) for r in released["results"]] == [
        ("rejected", "bad_type")] * 5, released
    assert not landed_rows(data)


def test_ingest_csv_with_a_ragged_line(data, tmp_path, capsys):
    source = tmp_path / "events.csv"
    source.write_text("match_id,player_id,points,event_time,region,mode,server_id\n"
                      "m1,alice,5,2026-12-01T10:00:00Z,na,ranked,s9\n"
                      "m2,bob,5,2026-12-01T10:00:00Z\n"
                      "m3,carol,x,2026-12-01T10:00:00Z,eu,casual,s9\n"
                      "m4,dave,3,2026-12-01 09:00:00,eu,casual,\n")
    code, report = run_json(capsys, "ingest", str(source))
    assert code == 0
    assert report["total"]["accepted"] == 2
    assert report["total"]["reasons"] == {"unparseable": 1, "bad_type": 1}
    events = {e["player_id"]: e for e in landed_rows(data)}
    assert events["alice"]["server_id"] == "s9"
    assert events["dave"]["server_id"] == "file"  # empty server_id -> the default
    assert events["dave"]["event_time"].isoformat() == "2026-12-01T09:00:00+00:00"


def test_ingest_parquet_typed_and_mistyped(data, tmp_path, capsys):
    source = tmp_path / "events.parquet"
    pq.write_table(pa.table({
        "match_id": ["m1", "m2"], "player_id": ["alice", "bad id"], "points": [5, 6],
        "event_time": pa.array([1764583200000000, 1764583200000000], pa.timestamp("us")),
        "region": ["na", "na"], "mode": ["ranked", "ranked"],
    }), source)
    code, report = run_json(capsys, "ingest", str(source))
    assert code == 0
    assert report["total"]["accepted"] == 1
    assert report["total"]["reasons"] == {"bad_player_id": 1}


def test_unreadable_file_exits_1_but_lands_the_readable_ones(data, tmp_path, capsys):
    good = tmp_path / "ok.jsonl"
    good.write_text(json.dumps(GOOD) + "\n")
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 this is not parquet")
    code, report = run_json(capsys, "ingest", str(tmp_path / "missing.csv"), str(broken),
                            str(good))
    assert code == 1
    assert report["total"]["accepted"] == 1
    assert len(report["errors"]) == 2
    assert "no such file" in report["errors"][0]
    assert "not a readable Parquet file" in report["errors"][1]


def test_bad_config_exits_2_with_a_clear_message(data, tmp_path, capsys):
    good = tmp_path / "ok.jsonl"
    good.write_text(json.dumps(GOOD) + "\n")
    bad = tmp_path / "bad.toml"
    bad.write_text('regions = ["na"]\nmodes = ["x"]\n[[boards]]\nscope = "global"\n'
                   'aggregation = "median"\n')
    assert main(["--config", str(bad), "ingest", str(good)]) == 2
    err = capsys.readouterr().err
    assert "boards[0].aggregation" in err
    assert "median" in err
    assert not (data / "lake" / "events").exists()


def test_unknown_extension_is_reported(data, tmp_path, capsys):
    odd = tmp_path / "events.xml"
    odd.write_text("<x/>")
    code, report = run_json(capsys, "ingest", str(odd))
    assert code == 1
    assert "unknown format" in report["errors"][0]


def test_backfill_football_then_batch_and_report(data, capsys, football_results):
    code, report = run_json(capsys, "--config", "football", "ingest", "--backfill",
                            str(football_results))
    assert code == 0
    assert report["files"][0]["format"] == "football"
    assert report["total"]["accepted"] == 2 * 49_520 - 2 * report["files"][0]["skipped"]
    assert report["total"]["rejected"] == 0
    # Stamped at landing (NOW): today's open day, read an hour later, absorbs it (the
    # README's football walkthrough).
    code, summary = run_json(capsys, "--config", "football", "--now", "2026-12-01T13:00:00Z",
                             "batch", "--as-of", "2026-12-01", "--allow-open-day")
    assert code == 0
    assert summary["mode"] == "full"
    assert summary["events"] == report["total"]["accepted"]
    out = data / "chart.png"
    assert main(["--config", "football", "report", "global", "--window", "season:2026-S2",
                 "--as-of", "2026-12-01", "--out", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_without_backfill_old_football_matches_would_be_late(data, tmp_path, capsys,
                                                             football_results):
    source = tmp_path / "few.csv"
    lines = football_results.read_text().splitlines()
    source.write_text("\n".join(lines[:4]) + "\n")
    code, report = run_json(capsys, "--config", "football", "ingest", str(source))
    assert code == 0  # all-time still counts them: accepted as live events
    assert report["total"]["accepted"] == 6


def test_console_script_runs(data, tmp_path):
    source = tmp_path / "ok.jsonl"
    source.write_text(json.dumps(GOOD) + "\n")
    done = subprocess.run([sys.executable, "-m", "app.cli", "ingest", str(source)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "1 accepted" in done.stdout


# -- reads through the serving layer ------------------------------------------------------------

@pytest.fixture
def served(data, tmp_path, capsys, publish_cli_lake):
    """The shared CLI lake (tests/app/conftest.py), one night published: dave's live 7
    points today lift him from 4th to 1st."""
    publish_cli_lake(tmp_path)
    capsys.readouterr()
    return data


def test_top_rank_and_around(served, capsys):
    code, top = run_json(capsys, "top", "global")
    assert code == 0
    assert [(e["player_id"], e["score"], e["rank"]) for e in top["entries"]] == [
        ("dave", 11, 1), ("alice", 10, 2), ("bob", 8, 3), ("carol", 6, 4), ("erin", 2, 5)]
    assert (top["window"], top["total"]) == ("all-time", 5)
    code, rank = run_json(capsys, "rank", "global", "dave")
    assert (rank["rank"], rank["score"], rank["change"]) == (1, 11, 3)
    assert rank["as_of_yesterday"] == {"rank": 4, "score": 4, "as_of": "2026-11-30"}
    code, around = run_json(capsys, "around", "global", "bob", "-k", "1")
    assert [e["player_id"] for e in around["above"]] == ["alice"]
    assert [e["player_id"] for e in around["below"]] == ["carol"]
    code, daily = run_json(capsys, "top", "region:na", "--window", "daily")
    assert daily["window"] == "daily:2026-12-01"
    assert [e["player_id"] for e in daily["entries"]] == ["dave"]
    code, unknown = run_json(capsys, "rank", "global", "zed")
    assert (code, unknown["status"]) == (0, "unranked")


def test_void_drops_a_result_from_the_live_board_and_lists_it(served, capsys):
    """alice's history match voided (absorbed by the batch), then dave's live one: both
    leave the merged board at once; `void --list` shows both, newest first."""
    code, voided = run_json(capsys, "void", "h0", "--reason", "exploit")
    assert (code, voided["players"]) == (0, ["alice"])
    code, voided = run_json(capsys, "void", "l1", "--player", "dave", "--reason", "typo")
    assert (code, voided["players"]) == (0, ["dave"])
    # Again: nothing recorded, nothing changed, and the sentence says so (it said "1
    # player(s) recomputed").
    assert main(["void", "l1", "--player", "dave", "--reason", "typo again"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert said.startswith("already voided: dave's result in match l1 at "), said
    assert "(reason: typo); nothing new is recorded, nothing changed" in said, said
    code, top = run_json(capsys, "top", "global")
    assert [(e["player_id"], e["score"]) for e in top["entries"]] == [
        ("bob", 8), ("carol", 6), ("dave", 4), ("erin", 2)]
    code, listed = run_json(capsys, "void", "--list")
    assert [(v["match_id"], v["player_id"], v["reason"]) for v in listed["voids"]] == [
        ("l1", "dave", "typo"), ("h0", None, "exploit")]
    assert main(["void", "--list"]) == 0
    assert "2 void(s), newest first" in capsys.readouterr().out
    assert main(["void", "h1"]) == 2
    assert "--reason" in capsys.readouterr().err


def test_erase_removes_a_player_and_refuses_the_id_after(served, tmp_path, capsys):
    assert main(["erase", "alice"]) == 2
    assert "--yes" in capsys.readouterr().err
    code, erased = run_json(capsys, "erase", "alice", "--yes")
    assert (code, erased["status"]) == (0, "erased")
    assert erased["lake"]["rows"] > 0
    code, top = run_json(capsys, "top", "global")
    assert [(e["player_id"], e["rank"]) for e in top["entries"]] == [
        ("dave", 1), ("bob", 2), ("carol", 3), ("erin", 4)]
    again = tmp_path / "again.jsonl"
    again.write_text(json.dumps(dict(GOOD, match_id="z1", player_id="alice")) + "\n")
    code, report = run_json(capsys, "ingest", str(again))
    assert report["total"]["reasons"] == {"erased": 1}
    assert all(r["player_id"] != "alice" for r in landed_rows(served, "quarantine"))
    # A ban, unban or void naming the erased id is refused: its record would bring the id
    # back into the lake (the audit of issue 12 found them written as asked).
    for argv in (["ban", "alice"], ["unban", "alice"],
                 ["void", "h0", "--player", "alice", "--reason", "late"]):
        assert main(argv) == 2, argv
        assert "was erased" in capsys.readouterr().err
    assert not (served / "lake" / "bans").exists() or all(
        "alice" not in pq.read_table(p).column("player_id").to_pylist()
        for p in (served / "lake" / "bans").glob("*.parquet"))
    assert not list((served / "lake" / "voids").glob("*.parquet"))


def test_reads_print_tables_for_people(served, capsys):
    assert main(["top", "region:na", "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert "region:na all-time: top 2 of 3" in out
    assert "dave" in out
    assert "alice" in out
    assert "bob" not in out
    assert main(["rank", "global", "dave"]) == 0
    out = capsys.readouterr().out
    assert "rank 1 of 5" in out
    assert "up 3" in out
    assert main(["around", "--window", "season", "global", "carol", "-k", "1"]) == 0
    out = capsys.readouterr().out
    assert "season:2026-S4: around carol" in out
    assert "bob" in out
    assert "erin" in out


def test_percentiles_answer_from_the_merged_board(served, capsys):
    """Scores 11 (dave, live), 10, 8, 6, 2: the top 20% is dave's 11, the top 50% needs 8."""
    code, answer = run_json(capsys, "percentiles", "global", "--top", "20", "--top", "50",
                            "--top", "0.1")
    assert code == 0
    assert answer["total"] == 5
    assert [(r["top_percent"], r["score"], r["players"]) for r in answer["top_percent"]] == [
        (20, 11, 1), (50, 8, 3), (0.1, 11, 1)]
    assert main(["percentiles", "region:eu"]) == 0
    out = capsys.readouterr().out
    assert "region:eu all-time: score needed for the top x% of 2 players" in out
    assert main(["percentiles", "global", "--window", "daily:2020-01-01"]) == 0
    assert "has no players yet" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "says"), [
    (["top", "region:moon"], "unknown board 'region:moon'"),
    (["percentiles", "global", "--top", "0"], "top percent 0.0 is outside (0, 100]"),
    (["percentiles", "global", "--top", "101"], "outside (0, 100]"),
    (["top", "global", "--window", "hourly"], "hourly"),
    (["rank", "global", "alice", "--window", "daily:2026-13-01"], "2026-13-01"),
    (["top", "global", "-n", "0"], "-n 0 is out of range"),
    (["around", "global", "alice", "-k", "51"], "-k 51 is out of range"),
    # Ids are checked as the HTTP API checks them: bad usage, not "unranked" and exit 0.
    (["rank", "global", "bad id!"], "player id 'bad id!' must be 1-64 chars"),
    (["rank", "global", ".."], "not . or .."),
    (["around", "global", "x" * 65], "must be 1-64 chars"),
    (["ban", "bad id!"], "player id 'bad id!'"),
    (["void", "m1", "--player", "bad id!", "--reason", "x"], "player id 'bad id!'"),
])
def test_bad_reads_exit_2(data, capsys, argv, says):
    assert main(argv) == 2
    assert says in capsys.readouterr().err


def test_demo_prints_merged_answers_and_a_rerun_changes_nothing(data, capsys):
    argv = ["demo", "--players", "400", "--days", "3", "--events-per-day", "2000",
            "--no-serve"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "global all-time: top 10 of" in printed
    assert "on global all-time: rank" in printed
    assert "global all-time: around" in printed
    assert "console: http://127.0.0.1:8000/" in printed
    code, top = run_json(capsys, "top", "global", "-n", "10")
    assert code == 0
    assert top["total"] > 0
    assert len(top["entries"]) == 10
    for entry in top["entries"][:3]:  # the demo's table shows the serving layer's answers
        assert f"{entry['player_id']} │ {entry['score']:,}" in printed
    assert main(argv) == 0  # the season and today's batches are reused, not folded again
    capsys.readouterr()
    assert run_json(capsys, "top", "global", "-n", "10")[1] == top


def test_speed_status_prints_a_table_for_people(served, capsys):
    """Regression: `speed status` printed Python reprs (`{'cli': 2}`) under bare field names."""
    assert main(["speed", "status"]) == 0
    out = capsys.readouterr().out
    assert "batch version (base)" in out
    assert "Redis memory" in out
    assert " MB" in out
    assert "{" not in out
    assert "'" not in out
    code, status = run_json(capsys, "speed", "status")
    assert code == 0
    assert isinstance(status["newest_landed"], dict)


def test_the_serve_banner_labels_every_value(tmp_path):
    """Regression: the banner read "data data, Redis redis://127.0.0.1:6390" unlabelled."""
    from app.cli import serve_banner
    from leaderboard.settings import Settings

    settings = Settings.from_env({"LEADERBOARD_DATA": "data"})
    banner = serve_banner("http://127.0.0.1:8000", settings, "redis://127.0.0.1:6390", 2,
                          local_redis=True)
    assert "data data" not in banner
    assert f"data dir:  {Path('data').resolve()}" in banner
    assert "Redis:     redis://127.0.0.1:6390 (the local server under" in banner
    assert "API docs:  http://127.0.0.1:8000/docs" in banner
    assert "workers:   2" in banner


# -- one data dir, one registry; the live pointer never moves back by accident ------------------

def test_a_data_dir_refuses_a_second_registry(data, tmp_path, capsys, football_results):
    source = tmp_path / "few.csv"
    source.write_text("\n".join(football_results.read_text().splitlines()[:4]) + "\n")
    good = tmp_path / "ok.jsonl"
    good.write_text(json.dumps(GOOD) + "\n")
    assert main(["ingest", str(good)]) == 0
    capsys.readouterr()
    assert main(["--config", "football", "ingest", "--backfill", str(source)]) == 2
    err = capsys.readouterr().err
    assert "bound to the board registry shipped registry 'default'" in err
    assert "shipped registry 'football'" in err
    assert "--data" in err
    assert len(landed_rows(data)) == 1  # nothing of football landed
    assert main(["--config", "football", "batch", "--as-of", "2026-07-31"]) == 2
    assert not (data / "lake" / "manifests").exists()
    # Its own data dir takes it; an edited registry is rebound on purpose.
    football = tmp_path / "football"
    assert main(["--data", str(football), "--config", "football", "ingest", "--backfill",
                 str(source)]) == 0
    assert main(["--config", "football", "lake", "rebind"]) == 0
    assert main(["ingest", str(good)]) == 2


def test_batch_refuses_to_move_the_live_pointer_back(data, tmp_path, capsys):
    good = tmp_path / "ok.jsonl"
    good.write_text(json.dumps(dict(GOOD, event_time="2026-11-28T10:00:00Z")) + "\n")
    assert main(["--now", "2026-11-28T12:00:00Z", "ingest", str(good)]) == 0
    assert main(["batch", "--as-of", "2026-11-30"]) == 0
    pointer = data / "lake" / "manifests" / "current.json"
    live = pointer.read_bytes()
    capsys.readouterr()
    assert main(["batch", "--as-of", "2026-11-29"]) == 2
    err = capsys.readouterr().err
    assert "as of 2026-11-30" in err
    assert "--allow-rewind" in err
    assert pointer.read_bytes() == live
    assert main(["batch", "--as-of", "2026-11-30"]) == 0  # a rerun of the live night is fine
    capsys.readouterr()
    code, summary = run_json(capsys, "batch", "--as-of", "2026-11-29", "--allow-rewind")
    assert code == 0
    assert json.loads(pointer.read_text())["version"] == summary["version"]


def test_a_batch_failing_its_own_check_says_so_in_a_sentence(data, tmp_path, capsys,
                                                              monkeypatch):
    """A version that fails one of the batch's checks exits 1 with a sentence naming the
    check and the live version readers keep, not a traceback; the pointer is unchanged."""
    import jobs.batch
    from jobs.publish import PublishError

    good = tmp_path / "ok.jsonl"
    good.write_text(json.dumps(dict(GOOD, event_time="2026-11-28T10:00:00Z")) + "\n")
    assert main(["--now", "2026-11-28T12:00:00Z", "ingest", str(good)]) == 0
    assert main(["--now", "2026-11-30T01:00:00Z", "batch", "--as-of", "2026-11-28"]) == 0
    pointer = data / "lake" / "manifests" / "current.json"
    live = pointer.read_bytes()
    version = json.loads(live)["version"]

    def failing_check(*args, **names):
        raise PublishError("rollups count 1 events, expected 2")

    monkeypatch.setattr(jobs.batch, "_checked_manifest", failing_check)
    capsys.readouterr()
    assert main(["--now", "2026-11-30T01:00:00Z", "batch", "--as-of", "2026-11-29"]) == 1
    said = " ".join(capsys.readouterr().err.split())
    assert "the batch as of 2026-11-29 did not publish: rollups count 1 events" in said
    assert f"the live version {version} is unchanged" in said
    assert "Traceback" not in said
    assert pointer.read_bytes() == live
    assert jobs.batch.main(["--data", str(data), "--as-of", "2026-11-29"]) == 1
    said = " ".join(capsys.readouterr().err.split())
    assert "did not publish: rollups count 1 events" in said


def test_batch_of_today_is_refused_unless_allowed_and_then_later_events_stay_live(
        data, tmp_path, capsys):
    """`batch --as-of <today>` exits 2 naming the last night that may run and the flag;
    with --allow-open-day the version absorbs what landed before the batch read the lake
    (its watermark is that instant), and an event ingested afterwards shows on the merged
    boards at once and is absorbed by the next night."""
    morning, noon = tmp_path / "morning.jsonl", tmp_path / "noon.jsonl"
    morning.write_text(json.dumps(GOOD) + "\n")
    noon.write_text(json.dumps(dict(GOOD, match_id="m2", player_id="bob", points=7)) + "\n")
    assert main(["ingest", str(morning)]) == 0  # 12:00
    capsys.readouterr()
    assert main(["--now", "2026-12-01T13:00:00Z", "batch", "--as-of", "2026-12-01"]) == 2
    err = capsys.readouterr().err
    assert "has not ended" in err
    assert "last night that may run is 2026-11-30" in err
    assert "--allow-open-day" in err
    assert not (data / "lake" / "manifests").exists()
    assert main(["--now", "2026-12-01T13:00:00Z", "batch", "--as-of", "2026-12-02",
                 "--allow-open-day"]) == 2
    assert "has not begun" in capsys.readouterr().err
    code, summary = run_json(capsys, "--now", "2026-12-01T13:00:00Z", "batch", "--as-of",
                             "2026-12-01", "--allow-open-day")
    assert (code, summary["new_events"]) == (0, 1)
    manifest = json.loads((data / "lake" / "manifests" / f"{summary['version']}.json")
                          .read_text())
    assert manifest["watermark"] == "2026-12-01T13:00:00Z"
    assert main(["--now", "2026-12-01T14:00:00Z", "ingest", str(noon)]) == 0
    capsys.readouterr()
    code, top = run_json(capsys, "--now", "2026-12-01T15:00:00Z", "top", "global",
                         "--window", "daily")
    assert [(e["player_id"], e["score"]) for e in top["entries"]] == [("bob", 7), ("alice", 5)]
    code, summary = run_json(capsys, "--now", "2026-12-02T01:00:00Z", "batch")
    assert (code, summary["as_of"], summary["events"]) == (0, "2026-12-01", 2)
    code, top = run_json(capsys, "--now", "2026-12-02T01:00:00Z", "top", "global",
                         "--window", "daily:2026-12-01")
    assert [(e["player_id"], e["score"]) for e in top["entries"]] == [("bob", 7), ("alice", 5)]


def test_lake_sweep_removes_what_a_dead_run_left(data, tmp_path, capsys):
    good = tmp_path / "ok.jsonl"
    good.write_text(json.dumps(dict(GOOD, event_time="2026-11-28T10:00:00Z")) + "\n")
    assert main(["--now", "2026-11-28T12:00:00Z", "ingest", str(good)]) == 0
    assert main(["batch", "--as-of", "2026-11-30"]) == 0
    dead = data / "lake" / "rollups" / "run=2026-12-01.20261201T000000.dead00" / "part-0.parquet"
    dead.parent.mkdir(parents=True)
    dead.write_bytes(b"half a file")
    capsys.readouterr()
    code, report = run_json(capsys, "lake", "sweep")
    assert code == 0
    assert report == {"files": 1, "bytes": 11, "runs": ["2026-12-01.20261201T000000.dead00"]}
    assert not dead.parent.exists()
    assert main(["top", "global"]) == 0  # the live version is whole


def test_help_lists_every_command(capsys):
    """`leaderboard --help` formats each command's help (a bare `%` in one used to crash
    argparse's formatting with a TypeError)."""
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    assert "percentiles" in capsys.readouterr().out


# -- direct boards (issue 12 part 2) --------------------------------------------------------

def test_score_submit_sets_a_best_lap_once_and_reads_back_merged(served, capsys):
    """`leaderboard score submit`: the door drops the retry, the best lap shows at once in
    the merged reads, a worse one leaves it; across the batch it stays."""
    code, first = run_json(capsys, "score", "submit", "best-lap", "alice", "65000",
                           "--match", "race-1")
    assert (code, first["accepted"], first["retry"], first["folded"]) == (0, True, False, True)
    code, again = run_json(capsys, "score", "submit", "best-lap", "alice", "64000",
                           "--match", "race-1")
    assert (code, again["accepted"], again["retry"]) == (0, False, True)
    assert main(["score", "submit", "best-lap", "bob", "61000", "--match", "race-1"]) == 0
    assert "accepted" in capsys.readouterr().out
    code, top = run_json(capsys, "top", "best-lap", "--window", "weekly")
    assert [(e["player_id"], e["score"], e["rank"]) for e in top["entries"]] == [
        ("bob", 61000, 1), ("alice", 65000, 2)]
    code, rank = run_json(capsys, "rank", "global", "alice")
    assert rank["score"] == 10, "a lap counts on no match-event board"
    assert main(["--now", "2026-12-02T01:00:00Z", "batch", "--as-of", "2026-12-01"]) == 0
    capsys.readouterr()
    code, top = run_json(capsys, "--now", "2026-12-02T01:00:00Z", "top", "best-lap")
    assert [(e["player_id"], e["score"]) for e in top["entries"]] == [
        ("bob", 61000), ("alice", 65000)]


@pytest.mark.parametrize(("argv", "code", "says"), [
    (["best-lap", "alice", "0", "--match", "r"], 1, "score 0 outside [1, 1000000]"),
    (["global", "alice", "5", "--match", "r"], 2, "fed by match events"),
    (["nope", "alice", "5", "--match", "r"], 2, "unknown board 'nope'"),
    (["best-lap", "a b", "5", "--match", "r"], 2, "player id 'a b'"),
])
def test_a_refused_score_exits_nonzero_and_says_why(data, capsys, argv, code, says):
    assert main(["score", "submit", *argv]) == code
    assert says in capsys.readouterr().err
    assert not [r for r in landed_rows(data) if r["board"]]


def test_a_refused_score_is_not_folded(data, capsys):
    """Regression (audit of issue 12): a score refused by validation answered `folded:
    true` (the fold of nothing had not failed); nothing of it is in the speed layer."""
    code, answer = run_json(capsys, "score", "submit", "best-lap", "alice", "0", "--match", "r")
    assert code == 1
    assert (answer["error"], answer["accepted"], answer["folded"]) == (
        "points_out_of_bounds", False, False)


def test_python_m_app_cli_reports_usage_errors_of_every_command(tmp_path):
    """`python -m app.cli` (how the tests and benchmarks start it): a usage error raised by
    a command living in another module is `error: ...` and exit 2, like the installed
    `leaderboard` script. Before, that module's UsageError was not the __main__ copy's, and
    the command died with a traceback."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("LEADERBOARD_")}
    for args in (["quarantine", "list", "--since", "nope"],
                 ["profile", "set", "p1", "--name", ""]):
        done = subprocess.run([sys.executable, "-m", "app.cli", "--data", str(tmp_path), *args],
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("error: "), done.stderr
        assert "Traceback" not in done.stderr


# -- errors a person reads (issue 12 audit) --------------------------------------------------

def test_a_read_on_a_lost_speed_state_says_what_to_run(served, redis_client, capsys):
    """Regression (audit of issue 12): a read after Redis lost the speed state (a flush, or
    a fresh Redis after `generate` and `batch`) died with a StateLost traceback; it exits 1
    with the message, which names `leaderboard speed rebuild`, and a rebuild serves again."""
    redis_client.flushall()
    for argv in (["top", "global"], ["rank", "global", "dave"],
                 ["friends", "global", "dave", "bob"], ["percentiles", "global"]):
        assert main(argv) == 1, argv
        said = capsys.readouterr().err
        assert said.startswith("error: "), said
        assert "leaderboard speed rebuild" in said, said
    assert main(["speed", "rebuild"]) == 0
    capsys.readouterr()
    code, top = run_json(capsys, "top", "global")
    assert (code, top["entries"][0]["player_id"]) == (0, "dave")


@pytest.mark.parametrize(("argv", "says"), [
    (["batch", "--as-of", "2026-99-01"], "--as-of `2026-99-01` is not a calendar date"),
    (["report", "global", "--as-of", "yesterday"], "--as-of `yesterday` is not a calendar"),
    (["generate", "--start", "2026-02-30", "--players", "40", "--days", "1"],
     "--start `2026-02-30` is not a calendar date"),
    (["generate", "--players", "5", "--days", "1", "--events-per-day", "10"],
     "--players 5 is too few"),
    (["generate", "--players", "40", "--days", "1", "--events-per-day", "10",
      "--writer", "BAD!"], "--writer 'BAD!' must be"),
])
def test_bad_flags_name_the_flag_instead_of_a_traceback(data, capsys, argv, says):
    """Regression (audit of issue 12): a malformed date flag or a generate spec out of range
    raised ValueError (a traceback naming `GenerateSpec.players`); now exit 2 naming the
    flag, and nothing is landed."""
    assert main(argv) == 2
    said = capsys.readouterr().err.strip()  # after the progress bar's blank line
    assert said.startswith("error: "), said
    assert says in said, said
    assert not (data / "lake").exists() or landed_rows(data) == []


@pytest.mark.parametrize(("argv", "says"), [
    (["void", "m1", "--reason", "x" * 501], "--reason is 501 characters; use at most 500"),
    (["ban", "alice", "--reason", "x" * 501], "--reason is 501 characters; use at most 500"),
    (["void", "--list", "--player", "alice"], "--list takes only a match id"),
    (["profile", "import", "/nonexistent/profiles.csv"], "No such file or directory"),
])
def test_operator_commands_refuse_what_the_api_refuses(data, capsys, argv, says):
    """Regression (audit of issue 12): `void` and `ban` kept a reason of any length (the
    admin routes take at most 500 characters), `void --list --player P` listed every void
    as if --player were not there, and a missing import file printed Python's
    `[Errno 2] ... '<path>'`. Each is now exit 2 saying what to do; nothing is written."""
    assert main(argv) == 2
    said = capsys.readouterr().err
    assert says in said, said
    assert "[Errno" not in said
    assert not (data / "lake" / "voids").exists()
    assert not (data / "lake" / "bans").exists()
