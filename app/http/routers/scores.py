"""Game servers submit scores to a direct board (`source = "direct"` in the registry):
`POST /v1/boards/{board}/scores`, one score a request, through the same door, landing and
fold as match events (speed_layer.ingest.Ingestor with `board`), so a retry counts once and
the score is in merged reads as soon as the answer comes back."""

from __future__ import annotations

from typing import Annotated, Any

import pyarrow as pa
from fastapi import APIRouter, Header, Request, Security
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials
from starlette.concurrency import run_in_threadpool

from app.http.auth import (
    SERVER_BEARER,
    SERVER_KEY,
    SERVER_SIGNATURE,
)
from app.http.errors import ApiError, documented
from app.http.params import BoardName
from app.http.ratelimit import check_rate
from app.http.routers.ingest import EVENT_SCHEMA, server_and_body
from app.http.service import ServiceDep
from app.sources import json_field_text, parse_json, quarantine_rows, unparseable_rows
from leaderboard.registry import Board

__all__ = ["SCORES_PATH", "SCORE_BODY_SCHEMA", "router"]

router = APIRouter(tags=["ingest"])

SCORES_PATH = "/v1/boards/{board}/scores"
_FIELDS = EVENT_SCHEMA["properties"]
#: One submission. `score` for a max|min|last board, `delta` (added to the player's total)
#: for a sum board; the route answers the other with 422 `score_expected`/`delta_expected`.
SCORE_BODY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["player_id", "match_id"],
    "properties": {
        "player_id": _FIELDS["player_id"],
        "match_id": {**_FIELDS["match_id"],
                     "description": "what the score came from (a race, a run): with the board "
                                    "and player its identity, so a retry counts once; "
                                    + _FIELDS["match_id"]["description"]},
        "score": {"type": "integer", "description": "the score, for a max, min or last board "
                                                    "(within its bounds)"},
        "delta": {"type": "integer", "description": "points added to the player's total, for "
                                                    "a sum board (within its bounds)"},
        "event_time": {**_FIELDS["event_time"], "type": ["string", "null"],
                       "description": "when it was scored (RFC 3339 with an offset); absent "
                                      "or null: the server's clock at landing"},
    },
    "oneOf": [{"required": ["score"]}, {"required": ["delta"]}],
    "examples": [{"player_id": "p001", "match_id": "race-1", "score": 65_000,
                  "event_time": "2026-12-01T17:00:00Z"}],
}


def _submission(body: bytes, board: Board) -> dict[str, Any]:
    """The body as a submission, or the ApiError that says what to fix."""
    try:
        data = parse_json(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ApiError(400, "bad_json", 'the body is not JSON; send {"player_id": ..., '
                                        '"match_id": ..., "score" or "delta": ...}') from None
    if not isinstance(data, dict):
        raise ApiError(422, "bad_score", "the body must be one JSON object "
                                         '{"player_id", "match_id", "score" | "delta", '
                                         '"event_time"?}')
    field = board.score_field
    other = "score" if field == "delta" else "delta"
    if "score" in data and "delta" in data:
        raise ApiError(422, "score_and_delta", f"send one of score and delta, not both; board "
                                               f"{board.name} takes `{field}`")
    if other in data:
        kept = "adds each delta to the player's total" if field == "delta" else (
            f"keeps each player's {board.aggregation} score")
        raise ApiError(422, f"{field}_expected",
                       f"board {board.name} {kept}: send `{field}`, not `{other}`")
    for name in ("player_id", "match_id", field):
        if data.get(name) is None:
            raise ApiError(422, "missing_field", f"{name} is missing; send "
                                                 f'{{"player_id", "match_id", "{field}"}}')
    value = data[field]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(422, "bad_type", f"{field} must be a JSON integer (e.g. 5)")
    for name in ("player_id", "match_id", "event_time"):
        text = data.get(name)
        if text is not None and (not isinstance(text, str) or not _is_text(text)):
            raise ApiError(422, "bad_type", f"{name} must be a JSON string of valid Unicode")
    return data


def _refused(body: bytes, board: Board, server_id: str, exc: ApiError, source: str
             ) -> pa.Table:
    """A refused submission as a quarantine row of its board, with its reason: its fields
    as sent (the board's `score` or `delta` as points, each as validation reads a JSON
    event's), or the whole body in match_id when it is not one JSON object."""
    try:
        data = parse_json(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        data = None
    if isinstance(data, dict):
        sent = data.get(board.score_field)
        if sent is None:  # the other field, which the reason names
            sent = data.get("delta" if board.score_field == "score" else "score")
        values = {name: json_field_text(name, data.get(name))
                  for name in ("player_id", "match_id", "event_time")}
        values |= {"points": json_field_text("points", sent), "server_id": server_id}
    else:
        values = {"match_id": body.decode("utf-8", "replace")[:1000]}
    table = quarantine_rows([(values, exc.code, exc.message)], source)
    # With its board, as every quarantined score: the listing shows it, and a release
    # judges it as a score to that board.
    return table.append_column("board", pa.array([board.name], pa.string()))


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


@router.post(SCORES_PATH, summary="Submit a score to a direct board",
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": SCORE_BODY_SCHEMA}}}},
             responses={200: {"description": "accepted, or a retry of an accepted score "
                                             "(`retry`: counted once)"},
                        **documented(400, 401, 403, 404, 409, 413, 422, 429, 503,
                                     s400="the body is not JSON",
                                     s401="no credential, or a signature without X-Timestamp",
                                     s403="a wrong key or signature (one made for another "
                                          "method, path, query or body), or X-Timestamp "
                                          "more than 5 minutes from the server's clock",
                                     s404="no such board",
                                     s409="`not_a_direct_board`: the board is fed by match "
                                          "events (POST /v1/events), not by scores; or "
                                          "`in_flight_elsewhere`: another worker is landing "
                                          "this score right now (send it again after "
                                          "Retry-After)",
                                     s422="the submission is refused: `error` is the reason "
                                          "(`score_expected`, `delta_expected`, "
                                          "`points_out_of_bounds`, `too_late`, ...); "
                                          "`implausible_rate`: past the player's events "
                                          "per minute, held in the quarantine for review "
                                          "(a release lands it on this board)")})
async def submit_score(
    service: ServiceDep,
    request: Request,
    board: BoardName,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(SERVER_BEARER)] = None,
    x_api_key: Annotated[str | None, Security(SERVER_KEY)] = None,
    x_signature: Annotated[str | None, Security(SERVER_SIGNATURE)] = None,
    x_server_id: Annotated[str | None, Header(description="the signing server (with "
                                                          "X-Signature)")] = None,
    x_timestamp: Annotated[str | None, Header(description="Unix seconds the signature "
                                                          "covers (with X-Signature)")] = None,
) -> Response:
    """One score for one player on a direct board: validated as a match event counted on
    that board alone would be, landed, and folded at once (a player read right after sees
    it). Idempotent by (board, match_id, player_id): a retry within the idempotency horizon
    answers 200 with `retry: true` and counts nothing."""
    keys = service.config.keys
    server_id, body = await server_and_body(service, request, bearer, x_api_key, x_signature,
                                            x_server_id, x_timestamp)
    found = service.board(board)
    if not found.direct:
        direct = [b.name for b in service.registry.boards if b.direct]
        raise ApiError(409, "not_a_direct_board",
                       f"board {found.name} is fed by match events: send them to POST "
                       f"/v1/events; scores go to a direct board"
                       + (f" ({', '.join(direct)})" if direct else " (the registry has none)"),
                       direct_boards=direct)
    source = f"http:{server_id}"
    try:
        data = _submission(body, found)
    except ApiError as exc:
        if exc.status == 422:  # kept with its values as sent and its reason, as an event row
            service.quarantine(_refused(body, found, server_id, exc, source))
        raise
    # A score is one event of the server's rate (429 with Retry-After, before anything lands).
    await run_in_threadpool(check_rate, service.client, keys, server_id, 1)
    field = found.score_field
    # Absent or null: the server's clock; any string (an empty one too) is judged as sent.
    event_time = data.get("event_time")
    if event_time is None:
        event_time = service.settings.now().isoformat()
    table = pa.table({
        "match_id": pa.array([data["match_id"]], pa.string()),
        "player_id": pa.array([data["player_id"]], pa.string()),
        # As text, as an event's: validation judges the range (a score past int64 is
        # refused 422 with the bound, not an overflow).
        "points": pa.array([json_field_text("points", data[field])], pa.string()),
        "event_time": pa.array([event_time], pa.string()),
        "server_id": pa.array([server_id], pa.string()),
    })
    report = await run_in_threadpool(service.ingest, table, unparseable_rows([], source),
                                     server_id, board=found)
    answer: dict[str, Any] = {
        "board": found.name, "player_id": data["player_id"], "match_id": data["match_id"],
        field: data[field], "accepted": report.accepted == 1, "retry": report.retries == 1,
        # In the speed layer: landed and folded now, or a retry of a score that is; a
        # refused score is in neither.
        "folded": report.accepted + report.retries == 1 and report.fold_error is None,
    }
    if report.rejections:
        _, reason, detail = report.rejections[0]
        return JSONResponse({"error": reason, "message": detail.replace("points", field),
                             **answer}, status_code=422)
    if report.in_flight:
        return JSONResponse({"error": "in_flight_elsewhere", "message": (
            "another worker is landing this score right now (an earlier send of it); send it "
            "again after Retry-After: if that landing went through it counts as a retry"),
            **answer}, status_code=409, headers={"Retry-After": "1"})
    if report.fold_error:
        answer["warning"] = (f"landed durably, but the fold into the speed layer failed "
                             f"({report.fold_error}); it is repaired on the next request")
    return JSONResponse(answer)
