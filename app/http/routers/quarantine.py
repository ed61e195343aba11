"""Quarantine review behind the admin key: list quarantined rows, release chosen ones.

`GET /v1/admin/quarantine` pages through the rows (reason, landing time, cursor);
`POST /v1/admin/quarantine/release` re-lands rows by id through validation, once
(speed_layer.review). The key is checked before the body is read, as on every admin route.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from app.http.errors import ApiError, documented
from app.http.routers.admin import AdminDep, _body
from app.review import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    MAX_RELEASE,
    parse_since,
    quarantine_page,
    release_answer,
)
from leaderboard.quarantine import QUARANTINE_ID_PATTERN, StaleCursor
from leaderboard.validation import REASONS

__all__ = ["ReleaseRequest", "router"]

_ID_RULE = ("`<ingest_date>.<writer>.<seq>.<row>.<digest>`, as listed (e.g. "
            "2026-12-01.http.12.3.5f0c2a9e)")


class ReleaseRequest(BaseModel):
    """The quarantined rows to land, by id."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"ids": ["2026-12-01.http.12.3.5f0c2a9e"]}]})

    ids: list[Annotated[str, Field(pattern=QUARANTINE_ID_PATTERN)]] = Field(
        min_length=1, max_length=MAX_RELEASE,
        description=f"1-{MAX_RELEASE} row ids from the listing: {_ID_RULE}")


async def _release_request(request: Request) -> ReleaseRequest:
    """The body, read only once the admin dependency (declared first) has passed."""
    return await _body(request, ReleaseRequest)


router = APIRouter(tags=["admin"], responses=documented(
    401, 403, 413, 422, 503, s401="no admin key", s403="a wrong admin key, or none is configured",
    s422="a parameter or the body breaks the schema"))
Reason = Literal[tuple(sorted(REASONS))]  # type: ignore[valid-type]


@router.get("/v1/admin/quarantine", summary="List quarantined rows",
            responses=documented(409, s409="`stale_cursor`: an erasure removed the row the "
                                           "cursor names since that page was listed: list "
                                           "again without a cursor"))
def quarantine(
    service: AdminDep,
    reason: Annotated[Reason | None,  # type: ignore[valid-type]
                      Query(description="only rows of this reason")] = None,
    since: Annotated[str | None, Query(
        description="only rows landed at or after this instant (RFC 3339, or a date "
                    "YYYY-MM-DD for its midnight UTC)",
        json_schema_extra={"format": "date-time"})] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT,
                                description="rows per page")] = DEFAULT_LIMIT,
    cursor: Annotated[str | None, Query(
        pattern=QUARANTINE_ID_PATTERN,
        description="`next_cursor` of the previous page: the rows after it, wherever an "
                    "erasure since moved it (409 `stale_cursor` if it erased that row)")] = None,
) -> dict[str, Any]:
    """Rows in landing order (by landing day, writer and file), each with its `id` (what a
    release takes), the values as sent, `board` (the direct board of a submitted score, null
    for a match event), `reason`, `detail`, `source`, `ingested_at`, `released` (a
    release landed it) and `moved_to` (a release quarantined it again under that id, with
    reason `unknown_board`: nothing landed, release that row; null otherwise);
    `next_cursor` is null on the last page."""
    try:
        instant = None if since is None else parse_since(since)
    except ValueError as exc:
        raise ApiError(422, "invalid_request", str(exc)) from None
    try:
        return quarantine_page(service.settings.lake_dir, reason=reason, since=instant,
                               limit=limit, cursor=cursor)
    except StaleCursor as exc:
        raise ApiError(409, "stale_cursor", str(exc)) from None


_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": ReleaseRequest.model_json_schema()}}}}


@router.post("/v1/admin/quarantine/release", summary="Release quarantined rows (once)",
             openapi_extra=_BODY,
             responses=documented(409, s409="another release is running on this lake: retry "
                                            "when it is done"))
def release(service: AdminDep,
            body: Annotated[ReleaseRequest, Depends(_release_request)]) -> dict[str, Any]:
    """Validate each row again as it was sent and land those that pass, once: `results`
    says per id `released` (counts now, in the speed layer and the next batch),
    `already_released` (a no-op), `duplicate` (the same event already counts),
    `rejected` (still invalid: `reason`; it stays in the quarantine), `requarantined` (a
    score whose board is no longer a direct board: quarantined again with reason
    `unknown_board`, the new row's id in `detail`, the old one marked released; nothing
    landed, now or on a later release of the old id), `in_flight` (another writer is
    landing the same event right now: release it again shortly) or `not_found`."""
    from speed_layer.review import ReleaseBusy

    try:
        answer = release_answer(service.speed, body.ids, service.settings.now())
    except ReleaseBusy as exc:
        raise ApiError(409, "release_running", str(exc), headers={"Retry-After": "1"}
                       ) from None
    if answer["released"]:
        service.cache.clear()
    if "warning" in answer:  # landed, not folded: the next ingest repairs first
        service.fold_failed()
    return answer
