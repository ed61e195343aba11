"""The match event schema (one row per player per match) and the quarantine schema."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "EVENT_FIELDS",
    "EVENT_SCHEMA",
    "INPUT_FIELDS",
    "LANDED_SCHEMA",
    "QUARANTINE_SCHEMA",
    "SCORE_QUARANTINE_SCHEMA",
    "TIMESTAMP",
    "as_landed",
    "conform",
    "identity_match_ids",
]

TIMESTAMP = pa.timestamp("us", tz="UTC")

#: What a client sends (server_id is optional in files; the HTTP API takes it from the key).
INPUT_FIELDS: tuple[str, ...] = (
    "match_id", "player_id", "points", "event_time", "region", "mode", "server_id",
)

#: A validated event before landing.
EVENT_SCHEMA = pa.schema([
    pa.field("match_id", pa.string(), nullable=False),
    pa.field("player_id", pa.string(), nullable=False),
    pa.field("points", pa.int64(), nullable=False),
    pa.field("event_time", TIMESTAMP, nullable=False),
    pa.field("region", pa.string(), nullable=False),
    pa.field("mode", pa.string(), nullable=False),
    pa.field("server_id", pa.string(), nullable=False),
])

#: A landed event: `ingested_at` is stamped at landing, never by the client. `backfill` marks
#: a trusted historical import, the one exception to the lateness rule (it counts in every
#: window its event_time falls in); files landed before the column existed read it as false,
#: and so does null. `board` is null for a match event; a direct score (a submission to a
#: `source = "direct"` board) names its board there, has region and mode "", and counts on
#: that board only. Files landed before the column read it as null.
LANDED_SCHEMA = EVENT_SCHEMA.append(pa.field("ingested_at", TIMESTAMP, nullable=False)).append(
    pa.field("backfill", pa.bool_())).append(pa.field("board", pa.string()))

EVENT_FIELDS: tuple[str, ...] = tuple(LANDED_SCHEMA.names)

#: A rejected row: the raw values as text, why it was rejected, and where it came from.
QUARANTINE_SCHEMA = pa.schema(
    [pa.field(name, pa.string()) for name in INPUT_FIELDS]
    + [
        pa.field("reason", pa.string(), nullable=False),
        pa.field("detail", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("ingested_at", TIMESTAMP, nullable=False),
    ]
)

#: A quarantined direct score also names its board (last), so a release lands it on that
#: board and the door knows its identity; match events' quarantine files have no such column
#: (read as null).
SCORE_QUARANTINE_SCHEMA = QUARANTINE_SCHEMA.append(pa.field("board", pa.string()))


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """table.cast(schema), without the cast when only the fields' nullability differs."""
    if table.schema.names == schema.names and all(
            column.type == field.type and (field.nullable or not column.null_count)
            for column, field in zip(table.columns, schema, strict=True)):
        return pa.Table.from_arrays(table.columns, schema=schema)
    return table.cast(schema)


def as_landed(table: pa.Table) -> pa.Table:
    """A landed file's rows in LANDED_SCHEMA: a file from before the `backfill` column gets
    it as false (every reader of landed files goes through here or coalesces the same way)."""
    if "backfill" not in table.column_names:
        table = table.append_column("backfill", pa.array([False] * table.num_rows, pa.bool_()))
    if "board" not in table.column_names:
        table = table.append_column("board", pa.nulls(table.num_rows, pa.string()))
    return conform(table.select(LANDED_SCHEMA.names), LANDED_SCHEMA)


#: Joins a direct score's board to its match_id in its identity; no match_id holds it
#: (validation refuses control characters), so no match event's identity can equal one.
_BOARD_SEPARATOR = "\x1f"


def identity_match_ids(table: pa.Table) -> pa.Array | pa.ChunkedArray:
    """The match part of each row's identity, to pair with its player_id: the match_id of a
    match event, `board US match_id` of a direct score, whose identity is (board, match_id,
    player_id). The door, the speed layer's dedupe and the test oracles key on this; the
    engines key on (match_id, player_id, board) alike."""
    match_ids = table.column("match_id")
    if "board" not in table.column_names or table.column("board").null_count == table.num_rows:
        return match_ids
    board = table.column("board")
    joined = pc.binary_join_element_wise(board, match_ids, _BOARD_SEPARATOR)
    return pc.if_else(pc.is_null(board), match_ids, joined)
