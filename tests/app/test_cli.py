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
SHARED = Path(__file__).parents[3] / "shared" / "data" / "international_results.csv"


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
    source = tmp_path / "events.jsonl"
    lines = [json.dumps(GOOD), "{not json", json.dumps(dict(GOOD, match_id="m2", region="moon")),
             json.dumps(dict(GOOD, match_id="m3", player_id="bob", points="7")), "",
             json.dumps([1, 2])]
    source.write_text("\n".join(lines) + "\n")
    code, report = run_json(capsys, "ingest", str(source))
    assert code == 0
    total = report["total"]
    assert (total["rows"], total["accepted"], total["rejected"]) == (5, 2, 3)
    assert total["reasons"] == {"unparseable": 2, "unknown_region": 1}
    events = sorted(landed_rows(data), key=lambda r: r["match_id"])
    assert [(e["match_id"], e["player_id"], e["points"]) for e in events] == [
        ("m1", "alice", 5), ("m3", "bob", 7)]
    assert all(e["server_id"] == "file" for e in events)
    assert {e["ingested_at"].isoformat() for e in events} == {"2026-12-01T12:00:00+00:00"}
    quarantined = landed_rows(data, "quarantine")
    assert sorted(q["reason"] for q in quarantined) == ["unknown_region", "unparseable",
                                                         "unparseable"]
    assert any("line 2" in q["detail"] for q in quarantined)


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


def test_backfill_football_then_batch_and_report(data, capsys):
    code, report = run_json(capsys, "--config", "football", "ingest", "--backfill",
                            str(SHARED))
    assert code == 0
    assert report["files"][0]["format"] == "football"
    assert report["total"]["accepted"] == 2 * 49_520 - 2 * report["files"][0]["skipped"]
    assert report["total"]["rejected"] == 0
    code, summary = run_json(capsys, "--config", "football", "batch", "--as-of", "2026-07-31")
    assert code == 0
    assert summary["mode"] == "full"
    assert summary["events"] == report["total"]["accepted"]
    out = data / "chart.png"
    assert main(["--config", "football", "report", "global", "--window", "season:2026-S2",
                 "--as-of", "2026-07-31", "--out", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_without_backfill_old_football_matches_would_be_late(data, tmp_path, capsys):
    source = tmp_path / "few.csv"
    lines = SHARED.read_text().splitlines()
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
