"""Readers for event files (JSONL, CSV, Parquet) and the football results CSV.

A reader never lets one bad line sink a file: lines that cannot be parsed come back as
quarantine rows with reason `unparseable`; only an unreadable file raises SourceError.
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

__all__ = ["SourceBatch", "SourceError", "field_text", "read_source", "unparseable_rows"]


class SourceError(RuntimeError):
    """A file that cannot be read at all (missing, unreadable, not the format it claims)."""


@dataclass(frozen=True)
class SourceBatch:
    table: pa.Table  # raw rows, typed or text
    unparseable: pa.Table  # quarantine rows (QUARANTINE_SCHEMA without ingested_at)
    format: str
    skipped: int = 0  # rows the format says are not events (e.g. unplayed fixtures)


def unparseable_rows(rows: list[tuple[str, str]], source: str) -> pa.Table:
    """(raw text, detail) pairs as quarantine rows; the raw text goes in match_id (files and
    the HTTP API quarantine what they cannot read the same way)."""
    columns: dict[str, Any] = {name: pa.nulls(len(rows), pa.string()) for name in INPUT_FIELDS}
    columns["match_id"] = pa.array([raw[:1000] for raw, _ in rows], pa.string())
    columns["reason"] = pa.array(["unparseable"] * len(rows), pa.string())
    columns["detail"] = pa.array([detail for _, detail in rows], pa.string())
    columns["source"] = pa.array([source] * len(rows), pa.string())
    return pa.table(columns)


def field_text(value: Any) -> str | None:
    """A JSON value as the text validation parses (numbers as written, objects as JSON)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value)


def _read_jsonl(path: Path, source: str) -> SourceBatch:
    columns: dict[str, list[str | None]] = {name: [] for name in INPUT_FIELDS}
    bad: list[tuple[str, str]] = []
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                bad.append((line.rstrip("\n"), f"line {number}: not JSON ({exc.msg})"))
                continue
            if not isinstance(record, dict):
                bad.append((line.rstrip("\n"), f"line {number}: not a JSON object"))
                continue
            for name in INPUT_FIELDS:
                columns[name].append(field_text(record.get(name)))
    table = pa.table({name: pa.array(values, pa.string()) for name, values in columns.items()})
    return SourceBatch(table, unparseable_rows(bad, source), "jsonl")


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
