"""Game servers post match results: validated, landed and folded exactly as
`leaderboard ingest` does (speed_layer.ingest.Ingestor), answered row by row."""

from __future__ import annotations

import json
from typing import Annotated, Any

import pyarrow as pa
from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from app.http.auth import check_server
from app.http.config import MAX_BATCH_ROWS
from app.http.errors import ApiError
from app.http.service import ServiceDep
from app.sources import field_text, unparseable_rows
from leaderboard.schema import INPUT_FIELDS
from leaderboard.validation import ID_PATTERN

__all__ = ["EVENT_BODY_SCHEMA", "router"]

router = APIRouter(tags=["ingest"])

EVENT_BODY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"events": {"type": "array", "maxItems": MAX_BATCH_ROWS, "items": {
        "type": "object",
        "required": ["match_id", "player_id", "points", "event_time", "region", "mode"],
        "properties": {
            "match_id": {"type": "string", "maxLength": 128},
            "player_id": {"type": "string", "pattern": ID_PATTERN},
            "points": {"type": "integer"},
            "event_time": {"type": "string", "format": "date-time"},
            "region": {"type": "string"}, "mode": {"type": "string"},
            "server_id": {"type": "string", "description": "ignored: taken from the credential"},
        }}}},
    "required": ["events"],
}


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    too_big = ApiError(413, "body_too_large",
                       f"the body exceeds {limit:,} bytes; send at most {MAX_BATCH_ROWS:,} "
                       "events per request in smaller batches")
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


def _events_of(body: bytes, max_rows: int) -> list[Any]:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "bad_json", f"the body is not JSON ({exc}); send "
                                        '{"events": [{...}, ...]} or a JSON array') from None
    events = data.get("events") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ApiError(400, "bad_batch", 'the body must be {"events": [...]} or a JSON array '
                                         "of event objects")
    if len(events) > max_rows:
        raise ApiError(413, "too_many_events", f"{len(events):,} events in one request; the "
                                               f"limit is {max_rows:,}: split the batch")
    if not events:
        raise ApiError(422, "empty_batch", "the batch holds no events")
    return events


def _batch_table(events: list[Any], server_id: str, source: str
                 ) -> tuple[pa.Table, pa.Table, list[int], list[dict[str, Any]]]:
    """(rows as text columns with the credential's server_id, unparseable rows in quarantine
    form, the body row number of each table row, the unparseable rows' rejections)."""
    fields = [name for name in INPUT_FIELDS if name != "server_id"]
    columns: dict[str, list[str | None]] = {name: [] for name in fields}
    rows: list[int] = []
    bad: list[tuple[str, str]] = []
    rejected: list[dict[str, Any]] = []
    for number, event in enumerate(events):
        if not isinstance(event, dict):
            detail = f"row {number} is not a JSON object"
            bad.append((json.dumps(event)[:1000], detail))
            rejected.append({"row": number, "reason": "unparseable", "detail": detail})
            continue
        rows.append(number)
        for name in fields:
            columns[name].append(field_text(event.get(name)))
    table = pa.table({**{name: pa.array(values, pa.string()) for name, values in columns.items()},
                      "server_id": pa.array([server_id] * len(rows), pa.string())})
    return table, unparseable_rows(bad, source), rows, rejected


@router.post("/v1/events", summary="Ingest a batch of match events",
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": EVENT_BODY_SCHEMA}}}},
             responses={200: {"description": "every row accepted (or a retry)"},
                        207: {"description": "some rows rejected: see `rejected`"},
                        401: {"description": "no credential"},
                        403: {"description": "wrong credential"},
                        413: {"description": "body or batch too large"},
                        422: {"description": "every row rejected"}})
async def ingest(
    service: ServiceDep,
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
    x_api_key: Annotated[str | None, Header()] = None,
    x_server_id: Annotated[str | None, Header()] = None,
    x_signature: Annotated[str | None, Header()] = None,
) -> Response:
    """Validate, land and fold the rows exactly as `leaderboard ingest` does: retries
    within the idempotency horizon are dropped at the door, invalid rows are
    quarantined and answered with their reasons, the valid rows beside them land."""
    keys = service.config.keys
    server_id = check_server(keys, authorization, x_api_key,
                             signed=bool(x_server_id and x_signature))
    body = await _read_body(request, service.config.max_body_bytes)
    if server_id is None:
        assert x_server_id is not None
        assert x_signature is not None
        if not keys.verify_signature(x_server_id, body, x_signature):
            raise ApiError(403, "forbidden", "X-Signature is not the HMAC-SHA256 of the "
                                             "body under that server's secret")
        server_id = x_server_id
    events = _events_of(body, service.config.max_batch_rows)
    source = f"http:{server_id}"
    table, unparseable, rows, rejected = _batch_table(events, server_id, source)
    report = await run_in_threadpool(service.ingest, table, unparseable, server_id)
    rejected += [{"row": rows[row], "reason": reason, "detail": detail}
                 for row, reason, detail in report.rejections]
    rejected.sort(key=lambda r: r["row"])
    answer: dict[str, Any] = {
        "server_id": server_id, "rows": len(events), "accepted": report.accepted,
        "duplicates": report.duplicates, "retries": report.retries,
        "rejected_count": len(rejected), "rejected": rejected,
        "folded": report.fold_error is None,
    }
    if report.fold_error:
        answer["warning"] = (f"landed durably, but the fold into the speed layer failed "
                             f"({report.fold_error}); it is repaired on the next request")
    status = 200 if not rejected else (422 if len(rejected) == len(events) else 207)
    if status == 422:
        answer.update(error="all_rows_rejected",
                      message="every row was rejected; see `rejected` for the reasons")
    return JSONResponse(answer, status_code=status)
