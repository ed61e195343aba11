"""Readers for event files (JSONL, CSV, Parquet) and the football results CSV, and the one
rule for a JSON event (a JSONL line, a row of `POST /v1/events`).

A reader never lets one bad line sink a file: lines that cannot be parsed come back as
quarantine rows with reason `unparseable`; only an unreadable file raises SourceError.

JSON is typed and CSV is not. In a JSON event every text field is a JSON string and `points`
a JSON integer: `"points": "12"` or `"match_id": 5` is refused `bad_type` by both the CLI
and the HTTP API (`json_row_problem`), and the row is quarantined with its values as sent
(`json_field_text`: a value of the wrong type as its JSON text, so `"12"` keeps its quotes;
`7` in match_id is the text `7`, so the type is in the detail, and a release never lands a
`bad_type` row). A CSV cell is text by the format's nature: `12` there is an integer.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from app.football import FOOTBALL_HEADER, football_events
from leaderboard.schema import INPUT_FIELDS

__all__ = ["JSON_TEXT_FIELDS", "SourceBatch", "SourceError", "json_field_text",
           "json_row_problem", "json_rows", "not_json", "parse_json", "quarantine_rows",
           "read_source", "unparseable_rows"]

#: The fields of a JSON event that are JSON strings (`points` is a JSON integer).
JSON_TEXT_FIELDS: tuple[str, ...] = tuple(name for name in INPUT_FIELDS if name != "points")
#: At most this much of a value of the wrong type is kept in the quarantine.
_KEPT = 1000


class SourceError(RuntimeError):
    """A file that cannot be read at all (missing, unreadable, not the format it claims)."""


@dataclass(frozen=True)
class SourceBatch:
    table: pa.Table  # raw rows, typed or text
    unparseable: pa.Table  # quarantine rows (QUARANTINE_SCHEMA without ingested_at)
    format: str
    skipped: int = 0  # rows the format says are not events (e.g. unplayed fixtures)


def quarantine_rows(rows: list[tuple[dict[str, str | None], str, str]], source: str
                    ) -> pa.Table:
    """(values by field, reason, detail) triples as quarantine rows (QUARANTINE_SCHEMA
    without ingested_at); a field the values lack is null."""
    columns: dict[str, Any] = {name: pa.array([values.get(name) for values, _, _ in rows],
                                              pa.string()) for name in INPUT_FIELDS}
    columns["reason"] = pa.array([reason for _, reason, _ in rows], pa.string())
    columns["detail"] = pa.array([detail for _, _, detail in rows], pa.string())
    columns["source"] = pa.array([source] * len(rows), pa.string())
    return pa.table(columns)


def unparseable_rows(rows: list[tuple[str, str]], source: str) -> pa.Table:
    """(raw text, detail) pairs as quarantine rows of reason `unparseable`: what could not
    be read as a row at all, its raw text in match_id (files and the HTTP API quarantine
    what they cannot read the same way)."""
    return quarantine_rows([({"match_id": raw[:_KEPT]}, "unparseable", detail)
                            for raw, detail in rows], source)


def _bounded_int(digits: str) -> int:
    """A JSON integer, cut to its first _KEPT characters: Python refuses to convert an
    integer of over 4300 digits (a ValueError that would call valid JSON "not JSON"), and
    no point value is near either length, so validation still refuses it as out of range
    and the quarantine keeps the prefix it keeps of any value."""
    return int(digits[:_KEPT])


def parse_json(text: str | bytes) -> Any:
    """JSON text as Python values, every integer read (however long: see _bounded_int).
    Raises ValueError (JSONDecodeError, UnicodeDecodeError) or RecursionError; `not_json`
    says why in words for the sender."""
    return json.loads(text, parse_int=_bounded_int)


def not_json(exc: ValueError) -> str:
    """Why `parse_json` refused a text, for its sender: where the syntax breaks, or the
    first byte that is not UTF-8 (never the interpreter's own wording)."""
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    if isinstance(exc, UnicodeDecodeError):
        return f"byte {exc.start} is not UTF-8"
    return "not JSON text"


def _is_unicode(value: str) -> bool:
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone UTF-16 surrogate
        return False
    return True


def _json_text(value: Any) -> str:
    """A value as JSON text (non-ASCII escaped, so any string survives), cut to _KEPT."""
    try:
        return json.dumps(value)[:_KEPT]
    except (RecursionError, ValueError):
        return "(a value nested too deeply to show)"


def json_field_text(name: str, value: Any) -> str | None:
    """A JSON event's field as the text validation reads: a text field's string as it is,
    points' integer in digits; a value of any other type (a string in `points` included)
    as its JSON text, which validation then refuses where the type matters (`"5"` is no
    integer) and the quarantine shows as sent."""
    if value is None:
        return None
    if name == "points":
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value) if abs(value) < 10**_KEPT else _json_text(str(value)[:_KEPT])
        return _json_text(value)
    if isinstance(value, str) and _is_unicode(value):
        return value
    return _json_text(value)


def _kind(value: Any) -> str:
    """A JSON value's type, as the JSON text names it."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def json_row_problem(record: dict[str, Any],
                     text_fields: tuple[str, ...] = JSON_TEXT_FIELDS) -> tuple[str, str] | None:
    """(reason, detail) when a JSON event breaks the JSON contract before validation reads
    it: a text field that is not a JSON string (`bad_type`) or not Unicode (`unparseable`),
    points that are not a JSON integer (`bad_type`). A missing field is validation's."""
    for name in text_fields:
        value = record.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            return "bad_type", f"{name} must be a JSON string, got {_kind(value)}"
        if not _is_unicode(value):
            return "unparseable", (f"{name} holds a lone UTF-16 surrogate (such as \\ud800), "
                                   "which is not text: send valid Unicode")
    points = record.get("points")
    if points is not None and (isinstance(points, bool) or not isinstance(points, int)):
        return "bad_type", (f"points must be a JSON integer (e.g. 5), got {_kind(points)} "
                            f"{_json_text(points)[:40]}")
    return None


def json_rows(records: list[Any], text_fields: tuple[str, ...] = JSON_TEXT_FIELDS
              ) -> tuple[dict[str, list[str | None]], list[int],
                         list[tuple[int, dict[str, str | None], str, str]]]:
    """JSON events -> (the passing rows' text columns of every INPUT_FIELDS field, their
    indexes in `records`, and each refused row as (index, values as sent, reason,
    detail)): the one walk the CLI's JSONL reader and the HTTP batch share. A record that
    is not an object is `unparseable`, its JSON text in match_id."""
    columns: dict[str, list[str | None]] = {name: [] for name in INPUT_FIELDS}
    kept: list[int] = []
    refused: list[tuple[int, dict[str, str | None], str, str]] = []
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            refused.append((index, {"match_id": _json_text(record)}, "unparseable",
                            "not a JSON object"))
            continue
        values = {name: json_field_text(name, record.get(name)) for name in INPUT_FIELDS}
        problem = json_row_problem(record, text_fields)
        if problem is not None:
            refused.append((index, values, *problem))
            continue
        kept.append(index)
        for name in INPUT_FIELDS:
            columns[name].append(values[name])
    return columns, kept, refused


def _read_jsonl(path: Path, source: str) -> SourceBatch:
    records: list[Any] = []
    numbers: list[int] = []
    bad: list[tuple[str, str]] = []
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                records.append(parse_json(line))
            except json.JSONDecodeError as exc:
                bad.append((line.rstrip("\n"), f"line {number}: not JSON ({exc.msg})"))
                continue
            except RecursionError:
                bad.append((line.rstrip("\n"), f"line {number}: nested too deeply to read"))
                continue
            numbers.append(number)
    columns, _, refused = json_rows(records)
    table = pa.table({name: pa.array(values, pa.string()) for name, values in columns.items()})
    rows = [(values, reason, f"line {numbers[index]}: {detail}")
            for index, values, reason, detail in refused]
    unparseable = pa.concat_tables([unparseable_rows(bad, source), quarantine_rows(rows, source)])
    return SourceBatch(table, unparseable, "jsonl")


def _read_csv(path: Path, source: str) -> SourceBatch:
    with open(path, encoding="utf-8", errors="replace", newline="") as handle:
        header = next(csv.reader(handle), [])
    if [h.strip() for h in header] == list(FOOTBALL_HEADER):
        table, skipped = football_events(path)
        return SourceBatch(table, unparseable_rows([], source), "football", skipped)
    bad: list[tuple[str, str]] = []

    def invalid(row: Any) -> str:
        bad.append((row.text or "", f"line {row.number}: expected {row.expected_columns} "
                                    f"columns, found {row.actual_columns}"))
        return "skip"

    names = [h.strip() for h in header]
    try:
        table = pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(use_threads=True),
            parse_options=pacsv.ParseOptions(invalid_row_handler=invalid),
            convert_options=pacsv.ConvertOptions(
                column_types={name: pa.string() for name in names},
                strings_can_be_null=True, quoted_strings_can_be_null=False,
            ),
        )
    except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
        raise SourceError(f"{source}: not a readable CSV file ({exc})") from None
    table = table.rename_columns([c.strip() for c in table.column_names])
    return SourceBatch(table, unparseable_rows(bad, source), "csv")


def _read_parquet(path: Path, source: str) -> SourceBatch:
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise SourceError(f"{source}: not a readable Parquet file ({exc})") from None
    return SourceBatch(table, unparseable_rows([], source), "parquet")


_READERS = {".jsonl": _read_jsonl, ".ndjson": _read_jsonl, ".json": _read_jsonl,
            ".csv": _read_csv, ".parquet": _read_parquet, ".pq": _read_parquet}


def read_source(path: Path) -> SourceBatch:
    """Read one input file by its extension (.jsonl/.ndjson/.json, .csv, .parquet)."""
    source = str(path)
    if not path.is_file():
        raise SourceError(f"{source}: no such file; check the path")
    reader = _READERS.get(path.suffix.lower())
    if reader is None:
        raise SourceError(
            f"{source}: unknown format {path.suffix!r}; use .jsonl, .csv or .parquet"
        )
    try:
        return reader(path, source)
    except PermissionError:
        raise SourceError(f"{source}: permission denied") from None
