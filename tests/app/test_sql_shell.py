"""`leaderboard sql`: read-only SQL on a real warehouse, printed for people or as JSON.

Regression: the README and the batch's output sent analysts to `duckdb -readonly
data/warehouse.duckdb`, a command a fresh install does not have.
"""

from __future__ import annotations

import io
import json
import re
from datetime import date
from pathlib import Path

import pytest
from lakes import day, land, random_stream

from app.cli import main
from app.sql_shell import open_warehouse, run_statements, shell
from jobs.batch import run_batch
from jobs.warehouse import refresh_warehouse
from leaderboard.registry import load_registry
from leaderboard.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir with two published nights and their warehouse."""
    data = tmp_path_factory.mktemp("sql") / "data"
    registry = load_registry()
    land(data / "lake", registry, random_stream(5, start=day("2026-11-28"),
                                                regions=("na", "eu"), modes=("ranked",)))
    settings = Settings.from_env({"LEADERBOARD_DATA": str(data)})
    run_batch(settings, date(2026, 11, 29))
    run_batch(settings, date(2026, 11, 30))
    refresh_warehouse(data, registry)
    return data


def sql(capsys, data: Path, *argv: str) -> tuple[int, str, str]:
    code = main(["--data", str(data), "sql", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_query_prints_a_table(data, capsys):
    code, out, _ = sql(capsys, data, "SELECT rank, player_id, score FROM standings_current "
                       "WHERE board = 'global' AND window_id = 'all-time' ORDER BY rank LIMIT 3")
    assert code == 0
    assert re.search(r"rank\s.*player_id\s.*score", out)
    assert "3 row(s)" in out
    assert "(" not in out.split("row(s)")[0].split("score", 1)[1]  # no Python tuples


def test_json_gives_every_row_of_every_statement(data, capsys):
    code, out, _ = sql(capsys, data, "--json", "SELECT count(*) AS n FROM standings; "
                       "SELECT DISTINCT as_of FROM standings ORDER BY as_of")
    assert code == 0
    first, second = (json.loads(line) for line in out.splitlines())
    assert first["columns"] == ["n"]
    assert first["rows"][0][0] > 0
    assert second["rows"] == [["2026-11-29"], ["2026-11-30"]]


def test_a_write_is_refused_and_changes_nothing(data, capsys):
    before = (data / "warehouse.duckdb").read_bytes()
    code, _, err = sql(capsys, data, "DROP VIEW standings")
    assert code == 1
    assert "read-only" in err
    assert (data / "warehouse.duckdb").read_bytes() == before


def test_a_bad_query_says_what_is_wrong(data, capsys):
    code, _, err = sql(capsys, data, "SELECT nope FROM standings")
    assert code == 1
    assert "nope" in err
    assert "Traceback" not in err


def test_without_a_warehouse_it_says_what_to_run(tmp_path, capsys):
    code, _, err = sql(capsys, tmp_path, "SELECT 1")
    assert code == 1
    assert "leaderboard batch" in err


def test_long_results_are_cut_and_say_so(data, capsys):
    code, out, _ = sql(capsys, data, "--max-rows", "2", "SELECT * FROM range(10)")
    assert code == 0
    assert "2 row(s) shown; more follow" in out


def test_the_shell_reads_statements_across_lines_and_survives_errors(data):
    from rich.console import Console

    out, err = io.StringIO(), io.StringIO()
    con = open_warehouse(data)
    try:
        stdin = io.StringIO(".tables\nSELECT 40\n + 2 AS answer;\nSELECT nope;\n.bogus\n"
                            "SELECT 'still here' AS s;\n")
        code = shell(con, out=Console(file=out, width=120), err=Console(file=err, width=120),
                     stdin=stdin)
    finally:
        con.close()
    assert code == 0
    assert "standings_current" in out.getvalue()
    assert re.search(r"answer.*\n.*\n.*42", out.getvalue())
    assert "still here" in out.getvalue()
    assert "nope" in err.getvalue()
    assert "unknown command .bogus" in err.getvalue()


def test_the_readme_queries_run_on_the_warehouse(data):
    """Every statement in the README's analysts' SQL block parses and runs."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```sql\n(.*?)```", readme, re.DOTALL)
    assert blocks
    con = open_warehouse(data)
    try:
        results = [r for block in blocks for r in run_statements(con, block)]
    finally:
        con.close()
    assert len(results) >= 5
    assert all(result.columns for result in results)
