"""The match event schema (one row per player per match) and the quarantine schema."""

from __future__ import annotations

import pyarrow as pa

__all__ = [
    "EVENT_FIELDS",
    "EVENT_SCHEMA",
    "INPUT_FIELDS",
    "LANDED_SCHEMA",
    "QUARANTINE_SCHEMA",
    "TIMESTAMP",
    "as_landed",
    "conform",
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
#: and so does null.
LANDED_SCHEMA = EVENT_SCHEMA.append(pa.field("ingested_at", TIMESTAMP, nullable=False)).append(
    pa.field("backfill", pa.bool_()))

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
    return conform(table.select(LANDED_SCHEMA.names), LANDED_SCHEMA)
