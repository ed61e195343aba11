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

from leaderboard.manifest import ManifestError
from serving.cache import CacheUnavailable
from serving.service import QueryError

__all__ = ["ApiError", "error_response", "install_error_handlers"]


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


def install_error_handlers(app: FastAPI) -> None:
    """Map each exception the routes let through to its status and error code."""
    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return error_response(exc.status, exc.code, exc.message, exc.headers, **exc.extra)

    async def invalid(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        errors = [{"where": ".".join(str(p) for p in e.get("loc", ())),
                   "message": str(e.get("msg", "")),
                   "got": e.get("input") if isinstance(e.get("input"), str | int | float)
                   else None} for e in exc.errors()]
        text = "; ".join(f"{e['where']}: {e['message']}"
                         + (f" (got {e['got']!r})" if e["got"] is not None else "")
                         for e in errors)
        return error_response(422, "invalid_request", text, errors=errors)

    async def query_error(request: Request, exc: Exception) -> Response:
        return error_response(400, "bad_query", str(exc))

    async def unavailable(request: Request, exc: Exception) -> Response:
        return error_response(503, "unavailable", f"the speed layer (Redis) is unavailable: "
                                                  f"{exc}; retry shortly", {"Retry-After": "5"})

    async def stale(request: Request, exc: Exception) -> Response:
        return error_response(503, "unavailable", str(exc), {"Retry-After": "5"})

    async def manifest(request: Request, exc: Exception) -> Response:
        return error_response(503, "unavailable", f"the batch view cannot be read: {exc}")

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(QueryError, query_error)
    app.add_exception_handler(redis.RedisError, unavailable)
    app.add_exception_handler(CacheUnavailable, stale)
    app.add_exception_handler(ManifestError, manifest)
