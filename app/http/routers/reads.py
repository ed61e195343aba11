"""Public reads of the merged (batch + speed) leaderboards.

The fast reads are coroutines run on the event loop: each is a few hundred microseconds of
work and at most one short Redis round trip, which costs less than a hop to the thread pool
and back. History (Parquet reads) and percentiles (a few script calls) stay in the pool.
"""

from __future__ import annotations

from datetime import date
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import Response
from pydantic import Field

from app.http.errors import ApiError
from app.http.params import BoardName, PlayerId, Window, check_player_id, encode_json, json_answer
from app.http.service import ServiceDep
from leaderboard.calendar import WINDOW_KINDS
from serving.service import MAX_AROUND_K, MAX_FRIENDS, MAX_TOP_N

__all__ = ["router"]

router = APIRouter(tags=["read"])


@router.get("/v1/boards", summary="Boards, their windows and next resets")
async def boards(service: ServiceDep) -> Response:
    return json_answer({"boards": service.boards.boards()})


@router.get("/v1/boards/{board}/top", summary="The top N (paged by cursor)")
async def top(service: ServiceDep, board: BoardName, window: Window = None,
              n: Annotated[int, Query(ge=1, le=MAX_TOP_N)] = 100,
              cursor: Annotated[str | None, Query(max_length=256,
                                                  description="next_cursor of a previous page")
                                ] = None) -> Response:
    """Cached for LEADERBOARD_TOP_TTL seconds per (version, board, window, n, cursor)."""
    service.board(board)
    return Response(service.cache.top(service.boards, board, n, window, cursor,
                                      encode=encode_json),
                    media_type="application/json")


@router.get("/v1/boards/{board}/players/{player_id}",
            summary="A player's rank, score, percentile and move since yesterday")
async def player(service: ServiceDep, board: BoardName, player_id: PlayerId,
                 window: Window = None) -> Response:
    service.board(board)
    return json_answer(service.boards.player(board, player_id, window))


@router.get("/v1/boards/{board}/players/{player_id}/around",
            summary="The k players listed before and after a player")
async def around(service: ServiceDep, board: BoardName, player_id: PlayerId,
                 window: Window = None,
                 k: Annotated[int, Query(ge=1, le=MAX_AROUND_K)] = 5) -> Response:
    service.board(board)
    return json_answer(service.boards.around(board, player_id, k, window))


@router.get("/v1/boards/{board}/friends", summary="A list of players ranked together")
async def friends(service: ServiceDep, board: BoardName,
                  ids: Annotated[str, Query(description=f"comma-separated player ids (at most "
                                                        f"{MAX_FRIENDS})",
                                            max_length=MAX_FRIENDS * 65)],
                  window: Window = None) -> Response:
    service.board(board)
    players = [p.strip() for p in ids.split(",") if p.strip()]
    if not players:
        raise ApiError(422, "invalid_request", "ids: give at least one player id")
    if len(players) > MAX_FRIENDS:
        raise ApiError(422, "invalid_request", f"ids: {len(players)} ids; the limit is "
                                               f"{MAX_FRIENDS}")
    for p in players:
        check_player_id(p, "ids")
    return json_answer(service.boards.friends(board, players, window))


@router.get("/v1/boards/{board}/players/{player_id}/history",
            summary="A player's rank on each published day")
def history(service: ServiceDep, board: BoardName, player_id: PlayerId,
            window: Annotated[str, Query(description="window kind: "
                                                     + "|".join(WINDOW_KINDS))] = "all-time",
            first: Annotated[date | None, Query(alias="from")] = None,
            last: Annotated[date | None, Query(alias="to")] = None) -> dict[str, Any]:
    found = service.board(board)
    if window not in found.windows:
        raise ApiError(400, "bad_query", f"window {window!r}: history takes a window kind "
                                         f"of board {found.name}: {', '.join(found.windows)}")
    if first and last and first > last:
        raise ApiError(422, "invalid_request", f"from {first} is after to {last}")
    return {"board": found.name, "player_id": player_id, "window": window,
            "history": service.boards.history(found.name, player_id, window, first, last)}


@router.get("/v1/boards/{board}/percentiles",
            summary="The score needed now for each top-x% and the score histogram")
def percentiles(service: ServiceDep, board: BoardName, window: Window = None,
                top: Annotated[list[Annotated[float, Field(gt=0, le=100)]] | None, Query(
                    max_length=100, description="top percents in (0, 100] to answer, e.g. "
                    "`top=0.1&top=5` (default 1, 2, ... 100)")] = None) -> Response:
    service.board(board)
    return json_answer(service.boards.percentiles(board, window, top))
