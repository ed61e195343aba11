"""The HTTP API for the game: ingest match results, read merged leaderboards, operate.

Usage: leaderboard serve [--host 127.0.0.1] [--port 8000] [--workers N]
       (or uvicorn itself: `uvicorn --factory app.http:create_app_from_env
       --http app.http.transport:JSON_HTTP --ws none`, whose own 400s are then JSON)

The composition root, and nothing else: `create_app` builds the app's `Service`
(`app.http.service`), installs the error mapping (`errors`) and the latency middleware
(`metrics`), and includes the routers (`routers.ingest`, `reads`, `admin`, `ops`), which get
the service by dependency. Credentials are in `auth`, settings in `config`.
OpenAPI at /openapi.json; Swagger UI at /docs and ReDoc at /redoc, their assets served by the
app itself (no CDN: the docs work offline).

Auth: `POST /v1/events` needs a game server's credential from the keys file
(LEADERBOARD_API_KEYS): an API key (`Authorization: Bearer <key>` or `X-API-Key`), or an
HMAC-SHA256 of the request (method, path and query, timestamp, body) under the server's
secret (`X-Server-Id` + `X-Timestamp` + `X-Signature: sha256=<hex>`, docs/signing.md).
The server_id of every landed row is the credential's; a server_id in the body is ignored.
Admin routes need the admin key (LEADERBOARD_ADMIN_KEY or `admin_key` in the keys file).
Reads are public.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis
from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

from app.console import router as console_router
from app.http.auth import ApiKeys, ServerCredential
from app.http.config import MAX_BATCH_ROWS, MAX_BODY_BYTES, HttpConfig
from app.http.contract import bind_openapi
from app.http.errors import install_error_handlers
from app.http.metrics import TimedRequests
from app.http.routers import ROUTERS
from app.http.service import Service
from leaderboard.settings import Settings

__all__ = [
    "MAX_BATCH_ROWS",
    "MAX_BODY_BYTES",
    "ApiKeys",
    "HttpConfig",
    "ServerCredential",
    "create_app",
    "create_app_from_env",
]


def create_app(settings: Settings, config: HttpConfig | None = None, *,
               client: redis.Redis | None = None) -> FastAPI:
    """The app for one process. `client` defaults to REDIS_URL or the local server."""
    service = Service(settings, config or HttpConfig(), client)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        service.close()

    app = FastAPIOffline(
        title="leaderboard", version="1.0",
        description="Merged (batch + speed) leaderboards: ingest match results, read ranks, "
                    "top N, neighbours, friends, percentiles and history.\n\n"
                    "Every answer other than 2xx is JSON `{\"error\": code, \"message\": "
                    "text}`. Besides each operation's documented statuses, any request may "
                    "get two answers no route gives: 400 `bad_http_request` when it is not "
                    "valid HTTP/1.1 (a request line over 64 KiB, both Content-Length and "
                    "Transfer-Encoding, a malformed header; `leaderboard serve` answers it "
                    "before any route, and closes the connection), and 500 `internal_error` "
                    "for a bug.",
        lifespan=lifespan)
    app.state.service = service
    install_error_handlers(app)
    app.add_middleware(TimedRequests, metrics=service.metrics)
    for router in ROUTERS:
        app.include_router(router)
    app.include_router(console_router)
    app.openapi = bind_openapi(app, settings.registry)  # type: ignore[method-assign]
    return app


def create_app_from_env() -> FastAPI:
    """The app from the environment alone (what `leaderboard serve` starts in each worker)."""
    return create_app(Settings.from_env(), HttpConfig.from_env())
