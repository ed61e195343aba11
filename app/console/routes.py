"""The console's routes: HTML pages at `/` and under `/console/`, and their static assets.
The one JSON answer the pages need that the API lacks, the operations summary, is served by
`app.http.routers.ops` behind the admin key.

The router reads the app's shared service from `request.app.state.service` through the
small `ConsoleService` protocol, so it depends on what the HTTP app holds, not on how the
app is split into modules. Pages are left out of the OpenAPI schema: they are a client of
the API, not part of it.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from typing import Annotated, Any, Protocol, cast

import redis
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from app.console import pages
from leaderboard.registry import Board, Registry, RegistryError
from leaderboard.validation import id_problem
from serving.service import Leaderboards

__all__ = ["CONTENT_SECURITY_POLICY", "STATIC_FILES", "ConsoleService", "router"]

#: The assets the pages load (name: media type); nothing else is served from the folder.
STATIC_FILES = {"console.js": "text/javascript; charset=utf-8",
                "console.css": "text/css; charset=utf-8"}
_PAGE_SIZES = (10, 25, 50, 100)
_Text = Annotated[str, Query(max_length=200)]


class ConsoleService(Protocol):
    """What the console needs from the HTTP app's service."""

    registry: Registry
    boards: Leaderboards


router = APIRouter(include_in_schema=False)


def _service(request: Request) -> ConsoleService:
    return cast(ConsoleService, request.app.state.service)


#: The pages load only their own script, stylesheet and API: nothing inline, nothing from
#: elsewhere, and they are not framed (the operations page holds the admin key).
CONTENT_SECURITY_POLICY = ("default-src 'self'; img-src 'self' data:; base-uri 'none'; "
                           "form-action 'self'; frame-ancestors 'none'")


def _html(text: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status, headers={
        "Cache-Control": "no-store", "Content-Security-Policy": CONTENT_SECURITY_POLICY,
        "X-Content-Type-Options": "nosniff"})


def _board(service: ConsoleService, name: str) -> Board | HTMLResponse:
    try:
        return service.registry.board(name)
    except RegistryError as exc:
        return _html(pages.not_found_page(str(exc), service.registry), 404)


def _window(board: Board, window: str) -> str:
    """The requested window, else all-time, else the board's first window kind."""
    if window:
        return window[:64]
    return "all-time" if "all-time" in board.windows else board.windows[0]


def _default_board(service: ConsoleService, name: str) -> Board | HTMLResponse:
    return _board(service, name or service.registry.boards[0].name)


@router.get("/")
def boards_page(request: Request) -> Response:
    return _html(pages.boards_page(_service(request).boards.boards()))


@router.get("/console/boards/{board}")
def board_page(request: Request, board: str, window: _Text = "", n: _Text = "") -> Response:
    service = _service(request)
    found = _board(service, board)
    if isinstance(found, HTMLResponse):
        return found
    size = int(n) if n.isdigit() and int(n) in _PAGE_SIZES else 25
    return _html(pages.board_page(service.registry, found, _window(found, window), size))


@router.get("/console/players")
def player_page(request: Request, board: _Text = "", window: _Text = "", player: _Text = "",
                friends: Annotated[str, Query(max_length=40_000)] = "") -> Response:
    service = _service(request)
    found = _default_board(service, board)
    if isinstance(found, HTMLResponse):
        return found
    text, shown = player.strip()[:64], _window(found, window)
    matches = _named(service, text)
    if text and not matches and id_problem(text) is not None:  # neither an id nor a name
        return _html(pages.player_page(service.registry, found, shown, "", friends.strip(),
                                       searched=text))
    if not matches or _known(service, found, shown, text):
        # An id (or nothing to choose from): its page, and others whose name starts so.
        matches = [m for m in matches if m["player_id"] != text]
        return _html(pages.player_page(service.registry, found, shown, text, friends.strip(),
                                       searched=text if matches else "", matches=matches))
    # A name: the page of the one player it names, else the list to choose from.
    text, searched = ("", text) if len(matches) != 1 else (matches[0]["player_id"], "")
    return _html(pages.player_page(service.registry, found, shown, text, friends.strip(),
                                   searched=searched, matches=matches))


def _named(service: ConsoleService, text: str) -> list[dict[str, Any]]:
    """Players whose display name starts with `text` (none when Redis cannot say: the
    page still works by id)."""
    if not text:
        return []
    try:
        return service.boards.profiles.find(text, limit=20)
    except redis.RedisError:
        return []


def _known(service: ConsoleService, board: Board, window: str, text: str) -> bool:
    """Whether `text` is the id of a player with a profile or a rank on the board (two
    short reads); when Redis cannot say, a valid id is taken as one."""
    if id_problem(text) is not None:
        return False
    try:
        return (service.boards.profiles.get(text) is not None
                or service.boards.player(board.name, text, window)["status"] == "ranked")
    except redis.RedisError:
        return True


@router.get("/console/distribution")
def distribution_page(request: Request, board: _Text = "", window: _Text = "") -> Response:
    service = _service(request)
    found = _default_board(service, board)
    if isinstance(found, HTMLResponse):
        return found
    return _html(pages.distribution_page(service.registry, found, _window(found, window)))


@router.get("/console/ops")
def ops_page() -> Response:
    return _html(pages.ops_page())


@cache
def _asset(name: str) -> bytes:
    return (files("app.console") / "static" / name).read_bytes()


@router.get("/console/static/{name}")
def static(name: str) -> Response:
    media = STATIC_FILES.get(name)
    if media is None:
        return JSONResponse({"error": "not_found",
                             "message": f"no console asset '{name}'; the assets are "
                                        f"{', '.join(sorted(STATIC_FILES))}"}, status_code=404)
    return Response(_asset(name), media_type=media, headers={"Cache-Control": "no-cache"})


