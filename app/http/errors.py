"""Every answer other than 2xx has one shape: `{"error": code, "message": text, ...}`.

Routes raise `ApiError`; the handlers installed here turn it, FastAPI's validation errors and
the layers' own failures (a bad query, Redis down, an unreadable batch view) into that shape,
so a client parses one error format and a person reads what to do next.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from leaderboard.manifest import ManifestError
from leaderboard.speed_keys import StateLost
from serving.cache import CacheUnavailable
from serving.service import CursorError, QueryError

__all__ = ["ERROR_BODY", "SHOWN_PREFIX", "ApiError", "documented", "error_response",
           "install_error_handlers"]

#: Every answer other than 2xx (healthz's 503 included): its OpenAPI schema.
ERROR_BODY: dict[str, Any] = {
    "type": "object", "required": ["error", "message"],
    "properties": {"error": {"type": "string", "description": "a stable code"},
                   "message": {"type": "string", "description": "what is wrong and what to "
                                                                 "do next"}},
}

_MEANINGS = {
    400: "the request cannot be served as asked (a body that is not a JSON batch, a cursor "
         "this API did not return, a window kind the history route does not take)",
    401: "no credential", 403: "a wrong credential, or none is configured",
    404: "no such board, window or route", 405: "the route does not take that method",
    409: "the action conflicts with one in progress: retry when it is done",
    413: "the body or the batch is too large", 422: "a parameter or body breaks the schema",
    429: "over the server's rate limit: the request was refused whole; retry after "
         "Retry-After seconds",
    503: "Redis or the batch view is unavailable (Retry-After where a retry helps)",
}

#: The header a 429 always carries.
_RETRY_AFTER = {"Retry-After": {"description": "whole seconds after which the same request "
                                               "passes", "schema": {"type": "integer"}}}


def documented(*statuses: int, **meanings: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for error statuses, each with the error body's schema; `meanings`
    (keyed `s404`, ...) word one route's reason where it is more specific."""
    return {status: {"description": meanings.get(f"s{status}", _MEANINGS[status]),
                     "content": {"application/json": {"schema": ERROR_BODY}},
                     **({"headers": _RETRY_AFTER} if status == 429 else {})}
            for status in statuses}


class ApiError(Exception):
    """An answer other than 2xx: `{"error": code, "message": text, ...extra}`."""

    def __init__(self, status: int, code: str, message: str, *,
                 headers: Mapping[str, str] | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})
        self.extra = extra


def error_response(status: int, code: str, message: str,
                   headers: Mapping[str, str] | None = None, **extra: Any) -> JSONResponse:
    """The error shape as a response."""
    return JSONResponse({"error": code, "message": message, **extra}, status_code=status,
                        headers=dict(headers or {}))


def _rule(error: Mapping[str, Any]) -> str:
    """A validation error in words: a pattern mismatch names the rule, not the regex."""
    from app.http.params import FRIEND_IDS_PATTERN, WINDOW_PATTERN
    from leaderboard.validation import ID_PATTERN, ID_RULE, MATCH_ID_PATTERN

    rules = {ID_PATTERN: f"must be {ID_RULE}",
             MATCH_ID_PATTERN: "must be 1-128 printable characters, not all whitespace (no "
                               "control, format or line-separator characters)",
             WINDOW_PATTERN: "must be a window kind (daily, weekly, monthly, season, all-time) "
                             "or a window id such as daily:2026-12-01, weekly:2026-W49, "
                             "monthly:2026-12, season:2026-S4",
             FRIEND_IDS_PATTERN: f"must be 1-500 comma-separated player ids without spaces, "
                                 f"each {ID_RULE}"}
    if error.get("type") == "string_pattern_mismatch":
        pattern = (error.get("ctx") or {}).get("pattern")
        return rules.get(str(pattern), "does not have the documented form (see /docs)")
    return str(error.get("msg", ""))


#: How much of a bad value an error answer shows: enough to recognise it, never the value
#: whole (a 10 MB field is not echoed back, twice).
SHOWN_PREFIX = 64


def _prefix(value: Any) -> Any:
    """A value as an error answer shows it: a string or number cut to SHOWN_PREFIX
    characters, marked with `...` when cut."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return value
    text = value if isinstance(value, str) else _number(value)
    return value if len(text) <= SHOWN_PREFIX else text[:SHOWN_PREFIX] + "..."


def _number(value: int | float) -> str:
    try:
        return str(value)
    except ValueError:  # an int past Python's digit limit for str()
        return "(a number too long to show)"


def _allowed(request: Request) -> str:
    """Every method some route takes on this path: Starlette's 405 names only the first
    route matching the path, and a path may have a route per method (a profile's GET, PUT)."""
    methods: set[str] = set()
    for route in request.app.routes:
        if route.matches(request.scope)[0] != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return ", ".join(sorted(methods))


def install_error_handlers(app: FastAPI) -> None:
    """Map each exception the routes let through to its status and error code."""
    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return error_response(exc.status, exc.code, exc.message, exc.headers, **exc.extra)

    async def invalid(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        errors = [{"where": _prefix(".".join(str(p) for p in e.get("loc", ()))),
                   "message": _rule(e),
                   "got": _prefix(e["input"]) if isinstance(e.get("input"), str | int | float)
                   else None} for e in exc.errors()]
        text = "; ".join(f"{e['where']}: {e['message']}"
                         + (f" (got {e['got']!r})" if e["got"] is not None else "")
                         for e in errors)
        return error_response(422, "invalid_request", text, errors=errors)

    async def query_error(request: Request, exc: Exception) -> Response:
        return error_response(400, "bad_query", str(exc))

    async def cursor_error(request: Request, exc: Exception) -> Response:
        return error_response(400, "bad_cursor", str(exc))

    async def unavailable(request: Request, exc: Exception) -> Response:
        return error_response(503, "unavailable", f"the speed layer (Redis) is unavailable: "
                                                  f"{exc}; retry shortly", {"Retry-After": "5"})

    async def state_lost(request: Request, exc: Exception) -> Response:
        # The app rebuilds the state itself (docs/architecture.md): start it, answer 503.
        request.app.state.service.state_lost()
        return error_response(503, "speed_state_lost", f"{exc}; the server is rebuilding it "
                              "now: retry shortly", {"Retry-After": "2"})

    async def stale(request: Request, exc: Exception) -> Response:
        return error_response(503, "unavailable", str(exc), {"Retry-After": "5"})

    async def manifest(request: Request, exc: Exception) -> Response:
        return error_response(503, "unavailable", f"the batch view cannot be read: {exc}")

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        path = _prefix(request.url.path)
        message = {404: f"no route {path}; see /docs for the API",
                   405: f"{request.method} is not allowed on {path}"}.get(
            exc.status_code, str(exc.detail))
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = _allowed(request)
        return error_response(exc.status_code, code, message, headers)

    async def internal(request: Request, exc: Exception) -> Response:
        # A bug: Starlette logs the traceback after this answer; the client gets the shape.
        return error_response(500, "internal_error", "the server failed on this request (a "
                              "bug, logged with its traceback); retry later, and report it "
                              "if it persists")

    app.add_exception_handler(Exception, internal)
    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(QueryError, query_error)
    app.add_exception_handler(CursorError, cursor_error)
    app.add_exception_handler(redis.RedisError, unavailable)
    app.add_exception_handler(StateLost, state_lost)
    app.add_exception_handler(CacheUnavailable, stale)
    app.add_exception_handler(ManifestError, manifest)
