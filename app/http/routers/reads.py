"""Public reads of the merged (batch + speed) leaderboards.

The fast reads are coroutines run on the event loop: each is a few hundred microseconds of
work and at most one short Redis round trip, which costs less than a hop to the thread pool
and back. History (Parquet reads) and percentiles (a few script calls) stay in the pool.
"""

from __future__ import annotations

from datetime import date
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import Response
from pydantic import Field

from app.http.errors import ApiError, documented
from app.http.params import (
    FRIEND_IDS_PATTERN,
    BoardName,
    PlayerId,
    Window,
    check_player_id,
    encode_json,
    json_answer,
)
from app.http.service import ServiceDep
from leaderboard.calendar import WINDOW_KINDS
from serving.service import MAX_AROUND_K, MAX_FRIENDS, MAX_TOP_N

__all__ = ["router"]

router = APIRouter(tags=["read"])

#: What every read of one board may answer besides 200.
_BOARD_READ = documented(404, 422, 503, s404="no such board, or no such window on it "
                                              "(a well-formed window id naming none)")


@router.get("/v1/boards", summary="Boards, their windows and next resets",
            responses=documented(503))
async def boards(service: ServiceDep) -> Response:
    return json_answer({"boards": service.boards.boards()})


@router.get("/v1/boards/{board}/top", summary="The top N (paged by cursor)",
            responses={**_BOARD_READ, **documented(400, s400="a cursor this API did not "
                                                             "return, or out of range")})
async def top(service: ServiceDep, board: BoardName, window: Window = None,
              n: Annotated[int, Query(ge=1, le=MAX_TOP_N)] = 100,
              cursor: Annotated[str | None, Query(max_length=256,
                                                  description="next_cursor of a previous page",
                                                  pattern=r"^[A-Za-z0-9_-]+$")
                                ] = None) -> Response:
    """Cached for LEADERBOARD_TOP_TTL seconds per (version, board, window, n, cursor)."""
    service.window(board, window)
    return Response(service.cache.top(service.boards, board, n, window, cursor,
                                      encode=encode_json),
                    media_type="application/json")


@router.get("/v1/boards/{board}/players/{player_id}",
            summary="A player's rank, score, percentile and move since yesterday",
            responses=_BOARD_READ)
async def player(service: ServiceDep, board: BoardName, player_id: PlayerId,
                 window: Window = None) -> Response:
    service.window(board, window)
    return json_answer(service.boards.player(board, player_id, window))


@router.get("/v1/boards/{board}/players/{player_id}/around",
            summary="The k players listed before and after a player", responses=_BOARD_READ)
async def around(service: ServiceDep, board: BoardName, player_id: PlayerId,
                 window: Window = None,
                 k: Annotated[int, Query(ge=1, le=MAX_AROUND_K)] = 5) -> Response:
    service.window(board, window)
    return json_answer(service.boards.around(board, player_id, k, window))


@router.get("/v1/boards/{board}/friends", summary="A list of players ranked together",
            responses=_BOARD_READ)
async def friends(service: ServiceDep, board: BoardName,
                  ids: Annotated[str, Query(description=f"comma-separated player ids, no "
                                                        f"spaces (at most {MAX_FRIENDS})",
                                            pattern=FRIEND_IDS_PATTERN,
                                            max_length=MAX_FRIENDS * 65 - 1)],
                  window: Window = None) -> Response:
    service.window(board, window)
    players = ids.split(",")
    if len(players) > MAX_FRIENDS:
        raise ApiError(422, "invalid_request", f"ids: {len(players)} ids; the limit is "
                                               f"{MAX_FRIENDS}")
    for p in players:
        check_player_id(p, "ids")
    return json_answer(service.boards.friends(board, players, window))


#: A calendar date as YYYY-MM-DD only (pydantic alone would also take "0" as 1970-01-01).
_DATE: dict[str, Any] = {"pattern": r"^\d{4}-\d{2}-\d{2}$",
                         "json_schema_extra": {"format": "date"},
                         "description": "a date, YYYY-MM-DD"}


def _day(text: str | None, name: str) -> date | None:
    if text is None:
        return None
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise ApiError(422, "invalid_request", f"{name}: {text!r} is not a calendar date; "
                                               "use YYYY-MM-DD") from None


@router.get("/v1/boards/{board}/players/{player_id}/history",
            summary="A player's rank on each published day",
            responses=documented(404, 422, 503, s404="no such board, or the board has no "
                                                     "window of that kind"))
def history(service: ServiceDep, board: BoardName, player_id: PlayerId,
            window: Annotated[Literal[WINDOW_KINDS], Query(  # type: ignore[valid-type]
                description="window kind")] = "all-time",
            first: Annotated[str | None, Query(alias="from", **_DATE)] = None,
            last: Annotated[str | None, Query(alias="to", **_DATE)] = None) -> dict[str, Any]:
    found = service.board(board)
    first_day, last_day = _day(first, "from"), _day(last, "to")
    if window not in found.windows:
        raise ApiError(404, "unknown_window", f"board {found.name} has no {window} window; it "
                                              f"has {', '.join(found.windows)}")
    if first_day and last_day and first_day > last_day:
        raise ApiError(422, "invalid_request", f"from {first} is after to {last}")
    return {"board": found.name, "player_id": player_id, "window": window,
            "history": service.boards.history(found.name, player_id, window, first_day,
                                              last_day)}


@router.get("/v1/boards/{board}/percentiles",
            summary="The score needed now for each top-x% and the score histogram",
            responses=_BOARD_READ)
def percentiles(service: ServiceDep, board: BoardName, window: Window = None,
                top: Annotated[list[Annotated[float, Field(gt=0, le=100)]] | None, Query(
                    max_length=100, description="top percents in (0, 100] to answer, e.g. "
                    "`top=0.1&top=5` (default 1, 2, ... 100)")] = None) -> Response:
    service.window(board, window)
    return json_answer(service.boards.percentiles(board, window, top))
