"""Request parameters the routers share: board names, player ids, windows, and the JSON
encoding of read answers."""

from __future__ import annotations

import json
from datetime import date, datetime
from typing import Annotated, Any

from fastapi import Path, Query
from fastapi.responses import Response

from app.http.errors import ApiError
from leaderboard.validation import ID_PATTERN, ID_RULE, id_problem
from serving.service import MAX_FRIENDS

__all__ = ["FRIEND_IDS_PATTERN", "WINDOW_PATTERN", "BoardName", "PlayerId", "Window",
           "check_player_id", "encode_json", "json_answer"]

BoardName = Annotated[str, Path(description="board name, e.g. `global` or `region:na`",
                                max_length=64)]
PlayerId = Annotated[str, Path(description=f"player id: {ID_RULE}", pattern=ID_PATTERN)]
#: A window kind (the window open now) or a window id; a well-formed id of a window the
#: board does not have is a 404 (see Service.window), a malformed one a 422.
WINDOW_PATTERN = (r"^(?:daily|weekly|monthly|season|all-time|daily:\d{4}-\d{2}-\d{2}|"
                  r"weekly:\d{4}-W\d{2}|monthly:\d{4}-\d{2}|season:[A-Za-z0-9][A-Za-z0-9_.-]{0,31})$")
Window = Annotated[str | None, Query(
    description="`daily|weekly|monthly|season|all-time` (the window open now) or a window id "
                "such as `daily:2026-12-01`, `weekly:2026-W49`, `monthly:2026-12`, "
                "`season:2026-S4`; default all-time", pattern=WINDOW_PATTERN)]
#: Comma-separated player ids, each by ID_PATTERN, at most MAX_FRIENDS of them.
_ONE_ID = ID_PATTERN.removeprefix("^").removesuffix("$")
FRIEND_IDS_PATTERN = rf"^{_ONE_ID}(?:,{_ONE_ID}){{0,{MAX_FRIENDS - 1}}}$"


def check_player_id(value: str, where: str) -> str:
    """A player id from a place the schema cannot check (a comma-separated list)."""
    problem = id_problem(value)
    if problem is not None:
        raise ApiError(422, "invalid_request", f"{where}: {problem}")
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def encode_json(answer: Any) -> bytes:
    """An answer as compact JSON bytes (dates ISO 8601), without FastAPI's per-field
    encoder: the read routes return these as they are."""
    return json.dumps(answer, separators=(",", ":"), default=_plain).encode()


def json_answer(answer: Any) -> Response:
    return Response(encode_json(answer), media_type="application/json")
