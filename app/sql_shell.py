"""`leaderboard sql`: read-only SQL on the analysts' warehouse, printed as tables.

The warehouse (`<data>/warehouse.duckdb`) is written by this project's DuckDB, whose file
format a separately installed `duckdb` command of another version may not read; this shell
uses the very library that wrote it. It opens the file read-only, so a statement that would
write fails with DuckDB's own message and changes nothing. One-shot (`leaderboard sql
"SELECT ..."`, several statements separated by `;`), from a file (`--file q.sql`) or stdin,
or interactive when stdin is a terminal.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table

__all__ = ["DEFAULT_MAX_ROWS", "QueryResult", "SqlError", "WarehouseMissing", "open_warehouse",
           "read_sql", "render_result", "run_once", "run_statements", "shell"]

#: Rows printed per result unless --max-rows says otherwise (JSON output is never cut).
DEFAULT_MAX_ROWS = 40

_HELP = """\
End each statement with ';' (it may span lines). Meta commands:
  .tables   the warehouse's views and tables
  .help     this text
  .quit     leave (or Ctrl-D)
Views: events, rollups, standings, standings_current, histograms; table: boards."""


class WarehouseMissing(Exception):
    """No warehouse file yet: nothing has been published."""


class SqlError(Exception):
    """A statement DuckDB refused (syntax, unknown column, a write on the read-only file)."""


@dataclass
class QueryResult:
    """One statement's answer: column names and rows (`rows` cut at `limit`, see `more`)."""

    statement: str
    columns: list[str] = field(default_factory=list)
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    more: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"statement": self.statement, "columns": self.columns,
                "rows": [[_json_value(v) for v in row] for row in self.rows],
                "truncated": self.more}


def open_warehouse(data_dir: Path) -> Any:
    """A read-only DuckDB connection on `<data_dir>/warehouse.duckdb`."""
    import duckdb

    path = data_dir / "warehouse.duckdb"
    if not path.exists():
        raise WarehouseMissing(f"no warehouse at {path}: run `leaderboard batch` (or `make "
                               "demo`) first, or point --data at the data dir that has one")
    return duckdb.connect(str(path), read_only=True)


def _split(sql: str) -> list[str]:
    import duckdb

    try:
        return [s.query.strip().rstrip(";").strip() for s in duckdb.extract_statements(sql)]
    except duckdb.Error as exc:
        raise SqlError(str(exc)) from None


def run_statements(con: Any, sql: str, *, limit: int | None = DEFAULT_MAX_ROWS
                   ) -> Iterator[QueryResult]:
    """Each statement of `sql` in turn; the first one DuckDB refuses raises SqlError."""
    import duckdb

    for statement in _split(sql):
        if not statement:
            continue
        try:
            cursor = con.execute(statement)
            if cursor.description is None:
                yield QueryResult(statement)
                continue
            columns = [d[0] for d in cursor.description]
            rows = cursor.fetchall() if limit is None else cursor.fetchmany(limit + 1)
        except duckdb.Error as exc:
            raise SqlError(_explain(exc)) from None
        more = limit is not None and len(rows) > limit
        yield QueryResult(statement, columns, [tuple(r) for r in rows[:limit]], more)


def _explain(exc: Exception) -> str:
    text = str(exc)
    if "read-only" in text.lower():
        return (f"{text}\nThe warehouse is opened read-only (every batch rebuilds it): "
                "query it, or take results out with --json")
    return text


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    return value


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.4f}".rstrip("0").rstrip(".") if value == value else "NaN"
    if isinstance(value, datetime | date):
        return value.isoformat()
    return str(_json_value(value))


def render_result(result: QueryResult) -> Table | str:
    """A result as a table a person reads (numbers right-aligned, NULL spelled out)."""
    if not result.columns:
        return "ok"
    table = Table(show_lines=False, caption=(
        f"{len(result.rows):,} row(s) shown; more follow (use --max-rows or a LIMIT)"
        if result.more else f"{len(result.rows):,} row(s)"), caption_justify="left")
    numeric = [bool(result.rows) and all(isinstance(r[i], int | float | Decimal) or r[i] is None
                                         for r in result.rows)
               for i in range(len(result.columns))]
    for name, right in zip(result.columns, numeric, strict=True):
        table.add_column(name, justify="right" if right else "left")
    for row in result.rows:
        table.add_row(*(_cell(v) for v in row))
    return table


def run_once(con: Any, sql: str, *, out: Console, as_json: bool,
             limit: int | None) -> None:
    """One-shot: every statement's result printed (JSON: one object per line)."""
    for result in run_statements(con, sql, limit=None if as_json else limit):
        if as_json:
            print(json.dumps(result.as_dict()))
        else:
            out.print(render_result(result))


def shell(con: Any, *, out: Console, err: Console, stdin: TextIO = sys.stdin,
          limit: int | None = DEFAULT_MAX_ROWS) -> int:
    """The interactive loop: statements end at ';', errors print and the loop goes on."""
    out.print(f"read-only SQL on the warehouse; .help for help, .quit to leave\n{_HELP}")
    pending: list[str] = []
    while True:
        try:
            line = _prompt("   ...> " if pending else "sql> ", stdin)
        except (EOFError, KeyboardInterrupt):
            out.print()
            return 0
        command = line.strip()
        if not pending and command.startswith("."):
            if command in (".quit", ".exit", ".q"):
                return 0
            if command == ".help":
                out.print(_HELP)
            elif command == ".tables":
                _print_all(con, "SELECT table_name AS name, table_type AS kind FROM "
                           "information_schema.tables ORDER BY 1", out, err, limit)
            else:
                err.print(f"unknown command {command}; .help lists them")
            continue
        pending.append(line)
        if command.endswith(";"):
            _print_all(con, "\n".join(pending), out, err, limit)
            pending = []


def _print_all(con: Any, sql: str, out: Console, err: Console, limit: int | None) -> None:
    try:
        for result in run_statements(con, sql, limit=limit):
            out.print(render_result(result))
    except SqlError as exc:
        err.print(f"[red]error:[/red] {exc}", markup=True, highlight=False)


def _prompt(text: str, stdin: TextIO) -> str:
    if stdin is sys.stdin and stdin.isatty():
        return input(text)
    line = stdin.readline()
    if not line:
        raise EOFError
    return line.rstrip("\n")


def read_sql(query: Sequence[str], file: str | None, stdin: TextIO = sys.stdin) -> str | None:
    """The SQL to run once: the arguments, a file (`-`: stdin), piped stdin; None: interactive."""
    if query:
        return " ".join(query)
    if file == "-" or (file is None and not stdin.isatty()):
        return stdin.read()
    if file is not None:
        return Path(file).read_text(encoding="utf-8")
    return None
