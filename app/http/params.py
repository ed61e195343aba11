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

__all__ = ["BoardName", "PlayerId", "Window", "check_player_id", "encode_json", "json_answer"]

BoardName = Annotated[str, Path(description="board name, e.g. `global` or `region:na`",
                                max_length=64)]
PlayerId = Annotated[str, Path(description=f"player id: {ID_RULE}", pattern=ID_PATTERN)]
Window = Annotated[str | None, Query(
    description="`daily|weekly|monthly|season|all-time` (the window open now) or a window id "
                "such as `weekly:2026-W49`; default all-time", max_length=64)]


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
