"""Game servers post match results: validated, landed and folded exactly as
`leaderboard ingest` does (speed_layer.ingest.Ingestor), answered row by row."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

import pyarrow as pa
from fastapi import APIRouter, Header, Request, Security
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials
from starlette.concurrency import run_in_threadpool

from app.http.auth import (
    SERVER_BEARER,
    SERVER_KEY,
    SERVER_SIGNATURE,
    check_server,
    check_signed,
    token_of,
)
from app.http.config import MAX_BATCH_ROWS
from app.http.errors import ApiError, documented
from app.http.ratelimit import check_rate
from app.http.service import Service, ServiceDep
from app.sources import JSON_TEXT_FIELDS, json_rows, not_json, parse_json, quarantine_rows
from leaderboard.validation import ID_PATTERN, ID_RULE, MATCH_ID_PATTERN

__all__ = ["EVENT_BODY_SCHEMA", "read_body", "router", "server_and_body"]

router = APIRouter(tags=["ingest"])

#: One event: the row contract. Strings are JSON strings and points a JSON integer (5, not
#: "5"): the HTTP contract is typed, unlike CSV files, whose fields are all text.
EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["match_id", "player_id", "points", "event_time", "region", "mode"],
    "properties": {
        "match_id": {"type": "string", "minLength": 1, "maxLength": 128,
                     "pattern": MATCH_ID_PATTERN,
                     "description": "1-128 characters, not blank, without control, format "
                                    "(e.g. U+202E) or line-separator characters"},
        "player_id": {"type": "string", "pattern": ID_PATTERN, "description": ID_RULE},
        "points": {"type": "integer", "description": "a JSON integer, within every bound of "
                                                     "the boards the event counts for"},
        "event_time": {"type": "string", "format": "date-time",
                       "description": "RFC 3339 with an offset; not ahead of the server clock "
                                      "by more than future_skew, nor past a window's grace"},
        "region": {"type": "string", "description": "a region of the registry"},
        "mode": {"type": "string", "description": "a mode of the registry"},
        "server_id": {"description": "ignored: the server_id is the credential's"},
    },
}
_EVENTS = {"type": "array", "minItems": 1, "maxItems": MAX_BATCH_ROWS, "items": EVENT_SCHEMA}
#: The body: {"events": [...]} or the bare array.
EVENT_BODY_SCHEMA: dict[str, Any] = {"anyOf": [
    {"type": "object", "required": ["events"], "properties": {"events": _EVENTS}},
    _EVENTS,
]}


async def read_body(request: Request, limit: int, advice: str | None = None) -> bytes:
    """The body, refused 413 as soon as it is known to exceed `limit` bytes (by
    Content-Length, else while streaming), so an oversized body is never read whole;
    `advice` says what to send instead (default: an events batch's)."""
    declared = request.headers.get("content-length", "")
    too_big = ApiError(413, "body_too_large", f"the body exceeds {limit:,} bytes; " + (
        advice or f"send at most {MAX_BATCH_ROWS:,} events per request in smaller batches"))
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


async def server_and_body(
    service: Service, request: Request, bearer: HTTPAuthorizationCredentials | None,
    x_api_key: str | None, x_signature: str | None, x_server_id: str | None,
    x_timestamp: str | None, *, limit: int | None = None, advice: str | None = None,
) -> tuple[str, bytes]:
    """The game server a write comes from, and its body, for every route a server writes
    by (events, scores, profiles): an API key is checked before the body is read, a
    signature after (it covers the body); the body is bounded by `limit` (default: the
    app's), `advice` saying what to send instead."""
    keys = service.config.keys
    server_id = check_server(keys, token_of(bearer, x_api_key),
                             signed=bool(x_server_id and x_signature))
    body = await read_body(request, service.config.max_body_bytes if limit is None else limit,
                            advice)
    if server_id is None:
        assert x_server_id is not None
        assert x_signature is not None
        server_id = check_signed(keys, x_server_id, x_timestamp, x_signature,
                                 (request.method, *_target(request), body),
                                 service.settings.now())
    return server_id, body


def _target(request: Request) -> tuple[bytes, bytes]:
    """The path and query as the request line sent them (what a signature covers): the
    server's raw path when it gives one, else the decoded path encoded again."""
    raw = request.scope.get("raw_path")
    path = raw if isinstance(raw, bytes) else quote(request.scope["path"]).encode("ascii")
    return path, request.scope.get("query_string", b"")


def _events_of(body: bytes, max_rows: int) -> list[Any]:
    try:
        data = parse_json(body)
    except ValueError as exc:  # UnicodeDecodeError is one
        raise ApiError(400, "bad_json", f"the body is not JSON ({not_json(exc)}); send "
                                        '{"events": [{...}, ...]} or a JSON array') from None
    except RecursionError:
        raise ApiError(400, "bad_json", "the body nests arrays or objects too deeply to read; "
                                        'send {"events": [{...}, ...]} with flat event '
                                        "objects") from None
    events = data.get("events") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ApiError(400, "bad_batch", 'the body must be {"events": [...]} or a JSON array '
                                         "of event objects")
    if len(events) > max_rows:
        raise ApiError(413, "too_many_events", f"{len(events):,} events in one request; the "
                                               f"limit is {max_rows:,}: split the batch")
    if not events:
        raise ApiError(422, "empty_batch", "the batch holds no events; send at least one")
    return events


#: The body's text fields (its server_id is ignored: the credential's is the rows').
_TEXT_FIELDS = tuple(name for name in JSON_TEXT_FIELDS if name != "server_id")


def _batch_table(events: list[Any], server_id: str, source: str
                 ) -> tuple[pa.Table, pa.Table, list[int], list[dict[str, Any]]]:
    """(rows as text columns with the credential's server_id, the rows that broke the JSON
    contract in quarantine form with their values as sent, the body row number of each
    table row, those rows' rejections)."""
    columns, rows, refused = json_rows(events, _TEXT_FIELDS)
    columns["server_id"] = [server_id] * len(rows)
    table = pa.table({name: pa.array(values, pa.string()) for name, values in columns.items()})
    quarantine = quarantine_rows([({**values, "server_id": server_id}, reason, detail)
                                  for _, values, reason, detail in refused], source)
    rejected = [{"row": index, "reason": reason, "detail": detail}
                for index, _, reason, detail in refused]
    return table, quarantine, rows, rejected


@router.post("/v1/events", summary="Ingest a batch of match events",
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": EVENT_BODY_SCHEMA}}}},
             responses={200: {"description": "every row accepted (or a retry)"},
                        207: {"description": "some rows rejected: see `rejected`"},
                        **documented(400, 401, 403, 409, 413, 422, 429, 503,
                                     s400="the body is not JSON, or not a batch of events",
                                     s401="no credential, or a signature without X-Timestamp",
                                     s403="a wrong key or signature (one made for another "
                                          "method, path, query or body), or X-Timestamp "
                                          "more than 5 minutes from the server's clock",
                                     s413="the body or the batch is too large, or the batch "
                                          "exceeds the server's burst",
                                     s409="some rows are being landed by another worker right "
                                          "now (an earlier send of this batch): they were not "
                                          "landed here; send the same batch again after "
                                          "Retry-After (the rows that did land count as "
                                          "retries then)",
                                     s422="every row rejected (`rejected` says why), or an "
                                          "empty batch")})
async def ingest(
    service: ServiceDep,
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(SERVER_BEARER)] = None,
    x_api_key: Annotated[str | None, Security(SERVER_KEY)] = None,
    x_signature: Annotated[str | None, Security(SERVER_SIGNATURE)] = None,
    x_server_id: Annotated[str | None, Header(description="the signing server (with "
                                                          "X-Signature)")] = None,
    x_timestamp: Annotated[str | None, Header(description="Unix seconds the signature "
                                                          "covers (with X-Signature)")] = None,
) -> Response:
    """Validate, land and fold the rows exactly as `leaderboard ingest` does: retries
    within the idempotency horizon are dropped at the door, invalid rows are
    quarantined and answered with their reasons, the valid rows beside them land."""
    keys = service.config.keys
    server_id, body = await server_and_body(service, request, bearer, x_api_key, x_signature,
                                            x_server_id, x_timestamp)
    events = _events_of(body, service.config.max_batch_rows)
    # Refused whole before anything is claimed or landed (429 with Retry-After).
    await run_in_threadpool(check_rate, service.client, keys, server_id, len(events))
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
        # Whether the rows this batch put in the lake are on the live boards: none when
        # every row was rejected.
        "folded": report.fold_error is None and len(rejected) < len(events),
    }
    if report.fold_error:
        answer["warning"] = (f"landed durably, but the fold into the speed layer failed "
                             f"({report.fold_error}); it is repaired on the next request")
    status = 200 if not rejected else (422 if len(rejected) == len(events) else 207)
    if report.in_flight:
        # Not a duplicate: the other landing may still fail, so the client must send again.
        answer.update(error="in_flight_elsewhere", in_flight=report.in_flight, message=(
            f"{report.in_flight:,} row(s) of this batch are being landed by another worker "
            "right now (an earlier send of the same rows) and were not landed here; send the "
            "same batch again after Retry-After: rows that landed count as retries then"))
        return JSONResponse(answer, status_code=409, headers={"Retry-After": "1"})
    if status == 422:
        answer.update(error="all_rows_rejected",
                      message="every row was rejected; see `rejected` for the reasons")
    return JSONResponse(answer, status_code=status)
