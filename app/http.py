"""The HTTP API for the game: ingest match results, read merged leaderboards, operate.

Usage: leaderboard serve [--host 127.0.0.1] [--port 8000] [--workers N]
       (or any ASGI server: `uvicorn --factory app.http:create_app_from_env`)

A composition root: read routes call `serving.service.Leaderboards` (top-N through
`serving.cache.TopCache`), the ingest route calls `speed_layer.ingest.Ingestor` exactly as
`leaderboard ingest` does (validate, door, land, quarantine, fold), admin routes call
`SpeedLayer.ban/unban`. OpenAPI at /openapi.json, interactive docs at /docs.

Auth: `POST /v1/events` needs a game server's credential from the keys file
(LEADERBOARD_API_KEYS): an API key (`Authorization: Bearer <key>` or `X-API-Key`), or an
HMAC-SHA256 of the body with the server's secret (`X-Server-Id` + `X-Signature: sha256=<hex>`).
The server_id of every landed row is the credential's; a server_id in the body is ignored.
Admin routes need the admin key (LEADERBOARD_ADMIN_KEY or `admin_key` in the keys file).
Reads are public.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import threading
import time
import tomllib
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Annotated, Any

import pyarrow as pa
import redis
from fastapi import Body, FastAPI, Header, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from pydantic import BaseModel, Field
from redis.backoff import NoBackoff
from redis.retry import Retry
from starlette.concurrency import run_in_threadpool

from app.sources import field_text, unparseable_rows
from leaderboard.calendar import WINDOW_KINDS
from leaderboard.lake import LandingWriter
from leaderboard.manifest import ManifestError, read_current
from leaderboard.registry import Board, RegistryError
from leaderboard.schema import INPUT_FIELDS
from leaderboard.settings import Settings, SettingsError
from leaderboard.timeutil import format_instant
from leaderboard.validation import ID_PATTERN
from serving.cache import DEFAULT_MAX_STALE, DEFAULT_TTL, CacheUnavailable, TopCache
from serving.service import MAX_AROUND_K, MAX_FRIENDS, MAX_TOP_N, Leaderboards, QueryError
from speed_layer.ingest import Ingestor, IngestReport, open_writer
from speed_layer.service import SpeedLayer

__all__ = [
    "MAX_BATCH_ROWS",
    "MAX_BODY_BYTES",
    "ApiKeys",
    "HttpConfig",
    "ServerCredential",
    "create_app",
    "create_app_from_env",
]

MAX_BATCH_ROWS = 10_000
MAX_BODY_BYTES = 8 * 1024 * 1024
_MIN_KEY_LENGTH = 16
_ID = re.compile(ID_PATTERN)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


# -- configuration ----------------------------------------------------------------------------

@dataclass(frozen=True)
class ServerCredential:
    """One game server: its API key and/or its HMAC secret."""

    server_id: str
    key: str | None = None
    secret: str | None = None


@dataclass(frozen=True)
class ApiKeys:
    """Who may write: per-server credentials, and the separate admin key."""

    servers: tuple[ServerCredential, ...] = ()
    admin_key: str | None = None
    source: str = "<none>"

    @classmethod
    def load(cls, path: Path, *, admin_key: str | None = None) -> ApiKeys:
        """A TOML or JSON (by extension) keys file; `admin_key` (the env var) wins over the
        file's."""
        what = f"LEADERBOARD_API_KEYS={path}"
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise SettingsError(f"{what}: cannot read the keys file ({exc.strerror}); "
                                "point it at a TOML or JSON file of server keys") from None
        try:
            raw = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
        except (ValueError, tomllib.TOMLDecodeError) as exc:
            raise SettingsError(f"{what}: not valid {path.suffix or 'TOML'} ({exc})") from None
        return cls.parse(raw, source=str(path), admin_key=admin_key)

    @classmethod
    def parse(cls, raw: Any, *, source: str = "<dict>", admin_key: str | None = None) -> ApiKeys:
        """{"admin_key": ..., "servers": {id: key | {"key": ..., "secret": ...}}}."""
        def fail(where: str, why: str) -> SettingsError:
            return SettingsError(f"keys file {source}: `{where}` {why}")

        if not isinstance(raw, dict):
            raise fail("(top)", "must be a table/object")
        unknown = set(raw) - {"admin_key", "servers"}
        if unknown:
            raise fail(sorted(unknown)[0], "is not a known key (known: admin_key, servers)")
        servers_raw = raw.get("servers", {})
        if not isinstance(servers_raw, dict):
            raise fail("servers", "must map server_id to a key or to {key, secret}")
        servers = []
        for server_id, entry in sorted(servers_raw.items()):
            where = f"servers.{server_id}"
            if not _ID.match(server_id):
                raise fail(where, "names a server_id that is not 1-64 chars of [A-Za-z0-9_.:-]")
            if isinstance(entry, str):
                entry = {"key": entry}
            if not isinstance(entry, dict) or not entry or set(entry) - {"key", "secret"}:
                raise fail(where, "must be a key string or a table with `key` and/or `secret`")
            for name in ("key", "secret"):
                value = entry.get(name)
                if value is not None and (not isinstance(value, str)
                                          or len(value) < _MIN_KEY_LENGTH):
                    raise fail(f"{where}.{name}",
                               f"must be a string of at least {_MIN_KEY_LENGTH} characters")
            servers.append(ServerCredential(server_id, entry.get("key"), entry.get("secret")))
        admin = admin_key if admin_key is not None else raw.get("admin_key")
        if admin is not None and (not isinstance(admin, str) or len(admin) < _MIN_KEY_LENGTH):
            raise fail("admin_key", f"must be a string of at least {_MIN_KEY_LENGTH} characters")
        keys = [s.key for s in servers if s.key] + [s.secret for s in servers if s.secret]
        if len(set(keys)) != len(keys):
            raise fail("servers", "gives two servers the same key or secret")
        if admin is not None and admin in keys:
            raise fail("admin_key", "equals a server's key; the admin key must be separate")
        return cls(tuple(servers), admin, source)

    def server_for_key(self, key: str) -> str | None:
        """The server holding this API key. Every key is compared (in constant time each),
        so the time taken says nothing about which key came close."""
        found = None
        given = key.encode()
        for server in self.servers:
            if server.key is not None and hmac.compare_digest(server.key.encode(), given):
                found = server.server_id
        return found

    def verify_signature(self, server_id: str, body: bytes, signature: str) -> bool:
        """Whether `signature` (hex, optionally `sha256=`-prefixed) is the HMAC-SHA256 of
        the body under the server's secret."""
        secret = next((s.secret for s in self.servers if s.server_id == server_id), None)
        expected = hmac.new((secret or "").encode(), body, hashlib.sha256).hexdigest()
        given = signature.strip().removeprefix("sha256=").lower()
        return hmac.compare_digest(expected.encode(), given.encode()) and secret is not None

    def is_admin(self, key: str) -> bool:
        return self.admin_key is not None and hmac.compare_digest(self.admin_key.encode(),
                                                                  key.encode())


def _seconds(env: Mapping[str, str], name: str, default: float, low: float,
             high: float) -> float:
    text = env.get(name) or ""
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise SettingsError(f"{name}={text!r} is not a number of seconds") from None
    if not low <= value <= high:
        raise SettingsError(f"{name}={text!r} must be between {low:g} and {high:g} seconds")
    return value


@dataclass(frozen=True)
class HttpConfig:
    """What the HTTP app needs beyond `Settings`: credentials, cache times, limits."""

    keys: ApiKeys = field(default_factory=ApiKeys)
    top_ttl: float = DEFAULT_TTL
    top_max_stale: float = DEFAULT_MAX_STALE
    max_batch_rows: int = MAX_BATCH_ROWS
    max_body_bytes: int = MAX_BODY_BYTES
    writer: str = "http"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HttpConfig:
        """LEADERBOARD_API_KEYS (keys file), LEADERBOARD_ADMIN_KEY, LEADERBOARD_TOP_TTL
        (1-5 s, default 2), LEADERBOARD_TOP_STALE (default 60 s)."""
        env = os.environ if env is None else env
        admin = env.get("LEADERBOARD_ADMIN_KEY") or None
        path = env.get("LEADERBOARD_API_KEYS") or None
        if path is not None:
            keys = ApiKeys.load(Path(path), admin_key=admin)
        else:
            keys = ApiKeys.parse({}, source="(no LEADERBOARD_API_KEYS)", admin_key=admin)
        ttl = _seconds(env, "LEADERBOARD_TOP_TTL", DEFAULT_TTL, 1.0, 5.0)
        stale = _seconds(env, "LEADERBOARD_TOP_STALE", DEFAULT_MAX_STALE, ttl, 3600.0)
        return cls(keys=keys, top_ttl=ttl, top_max_stale=stale)


# -- errors -----------------------------------------------------------------------------------

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


def _error(status: int, code: str, message: str, headers: Mapping[str, str] | None = None,
           **extra: Any) -> JSONResponse:
    return JSONResponse({"error": code, "message": message, **extra}, status_code=status,
                        headers=dict(headers or {}))


def _install_error_handlers(app: FastAPI) -> None:
    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return _error(exc.status, exc.code, exc.message, exc.headers, **exc.extra)

    async def invalid(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        errors = [{"where": ".".join(str(p) for p in e.get("loc", ())),
                   "message": str(e.get("msg", "")),
                   "got": e.get("input") if isinstance(e.get("input"), str | int | float)
                   else None} for e in exc.errors()]
        text = "; ".join(f"{e['where']}: {e['message']}"
                         + (f" (got {e['got']!r})" if e["got"] is not None else "")
                         for e in errors)
        return _error(422, "invalid_request", text, errors=errors)

    async def query_error(request: Request, exc: Exception) -> Response:
        return _error(400, "bad_query", str(exc))

    async def unavailable(request: Request, exc: Exception) -> Response:
        return _error(503, "unavailable", f"the speed layer (Redis) is unavailable: {exc}; "
                                          "retry shortly", {"Retry-After": "5"})

    async def stale(request: Request, exc: Exception) -> Response:
        return _error(503, "unavailable", str(exc), {"Retry-After": "5"})

    async def manifest(request: Request, exc: Exception) -> Response:
        return _error(503, "unavailable", f"the batch view cannot be read: {exc}")

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(QueryError, query_error)
    app.add_exception_handler(redis.RedisError, unavailable)
    app.add_exception_handler(CacheUnavailable, stale)
    app.add_exception_handler(ManifestError, manifest)


# -- metrics ----------------------------------------------------------------------------------

class _LiveCollector:
    """Figures read at scrape time: speed lag, Redis up, the top-N cache counters."""

    def __init__(self, service: _Service) -> None:
        self.service = service

    def describe(self) -> Iterable[Metric]:
        return self._families(lag=None, up=None)

    def collect(self) -> Iterable[Metric]:
        speed = self.service.speed
        try:
            lag: float | None = float(len(speed.folder.pending(speed.current())))
            up = 1.0
        except redis.RedisError:
            lag, up = None, 0.0
        return self._families(lag=lag, up=up)

    def _families(self, *, lag: float | None, up: float | None) -> list[Metric]:
        stats = self.service.cache.stats()
        families: list[Metric] = []
        lag_family = GaugeMetricFamily(
            "leaderboard_speed_lag_files",
            "Landed files not yet folded into the live speed version (absent: Redis down)")
        if lag is not None:
            lag_family.add_metric([], lag)
        families.append(lag_family)
        up_family = GaugeMetricFamily("leaderboard_redis_up", "1 if Redis answered the scrape")
        if up is not None:
            up_family.add_metric([], up)
        families.append(up_family)
        for name, value, text in (
                ("hits", stats.hits, "Top-N answers served fresh from the cache"),
                ("misses", stats.misses, "Top-N answers computed (cache misses)"),
                ("coalesced", stats.coalesced, "Top-N requests that waited on another "
                                               "request's refresh of the same key"),
                ("stale", stats.stale, "Stale top-N answers served while Redis failed")):
            family = CounterMetricFamily(f"leaderboard_top_cache_{name}", text)
            family.add_metric([], value)
            families.append(family)
        ratio = GaugeMetricFamily("leaderboard_top_cache_hit_ratio",
                                  "Share of top-N answers that needed no computation")
        ratio.add_metric([], stats.hit_ratio)
        families.append(ratio)
        return families


class _Metrics:
    def __init__(self, service: _Service) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "leaderboard_http_request_duration_seconds", "HTTP request latency per route",
            ["method", "route", "status"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.visibility = Histogram(
            "leaderboard_score_visibility_seconds",
            "From an event's ingested_at stamp to its score being folded into the speed "
            "layer (readable), per ingested batch", buckets=_LATENCY_BUCKETS,
            registry=self.registry)
        self.registry.register(_LiveCollector(service))


# -- the service behind the routes ------------------------------------------------------------

def _redis_client(settings: Settings) -> redis.Redis:
    """REDIS_URL, or the data dir's local server (the CLI's logic), with short timeouts and
    one retry: a request must fail fast (503, or a stale top-N) when Redis is gone."""
    options: dict[str, Any] = {"protocol": 2, "socket_timeout": 2.0,
                               "socket_connect_timeout": 2.0, "retry": Retry(NoBackoff(), 1)}
    if settings.redis_url is None:
        # Follows the local server to another port if it is restarted there.
        from leaderboard.redis_server import local_server_client

        return local_server_client(settings.data_dir, **options)
    return redis.Redis.from_url(settings.redis_url, **options)


class _Service:
    """State shared by the routes of one app (one process)."""

    def __init__(self, settings: Settings, config: HttpConfig, client: redis.Redis | None
                 ) -> None:
        self.settings = settings
        self.config = config
        self.registry = settings.registry
        self._owns_client = client is None
        self.client = _redis_client(settings) if client is None else client
        self.boards = Leaderboards(settings.lake_dir, self.registry, self.client,
                                   now=settings.now, pointer_ttl=POINTER_TTL)
        self.speed = SpeedLayer(self.client, self.registry, settings.lake_dir)
        self.cache = TopCache(config.top_ttl, config.top_max_stale)
        self.metrics = _Metrics(self)
        # One landing writer per process, opened on first use; the writer is not thread-safe.
        self._ingest_lock = threading.Lock()
        self._writer: LandingWriter | None = None
        self._needs_repair = True  # fold what a crash (or a failed fold) left pending

    def board(self, name: str) -> Board:
        try:
            return self.registry.board(name)
        except RegistryError as exc:
            raise ApiError(404, "unknown_board", str(exc),
                           boards=[b.name for b in self.registry.boards]) from None

    def ingest(self, table: pa.Table, unparseable: pa.Table, server_id: str) -> IngestReport:
        with self._ingest_lock:
            if self._writer is None:
                self._writer = open_writer(self.settings.lake_dir, self.config.writer)
            try:
                if self._needs_repair:
                    self.speed.repair()
                    self._needs_repair = False
                stamped = time.perf_counter()
                report = Ingestor(self.registry, self._writer, self.speed).ingest(
                    table, now=self.settings.now(), source=f"http:{server_id}",
                    unparseable=unparseable, row_reasons=True)
            except redis.RedisError as exc:
                # Raised before landing (the door could not be asked): nothing is in the lake.
                raise ApiError(503, "unavailable",
                               f"the speed layer (Redis) is unavailable ({exc}); nothing was "
                               "landed: retry the same batch later",
                               headers={"Retry-After": "5"}) from None
            if report.fold_error:
                self._needs_repair = True
            elif report.files:
                self.metrics.visibility.observe(time.perf_counter() - stamped)
            return report

    def close(self) -> None:
        with self._ingest_lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        if self._owns_client:
            self.client.close()


# -- request helpers --------------------------------------------------------------------------

def _bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    too_big = ApiError(413, "body_too_large",
                       f"the body exceeds {limit:,} bytes; send at most {MAX_BATCH_ROWS:,} "
                       "events per request in smaller batches")
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


def _events_of(body: bytes, max_rows: int) -> list[Any]:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "bad_json", f"the body is not JSON ({exc}); send "
                                        '{"events": [{...}, ...]} or a JSON array') from None
    events = data.get("events") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ApiError(400, "bad_batch", 'the body must be {"events": [...]} or a JSON array '
                                         "of event objects")
    if len(events) > max_rows:
        raise ApiError(413, "too_many_events", f"{len(events):,} events in one request; the "
                                               f"limit is {max_rows:,}: split the batch")
    if not events:
        raise ApiError(422, "empty_batch", "the batch holds no events")
    return events


def _batch_table(events: list[Any], server_id: str, source: str
                 ) -> tuple[pa.Table, pa.Table, list[int], list[dict[str, Any]]]:
    """(rows as text columns with the credential's server_id, unparseable rows in quarantine
    form, the body row number of each table row, the unparseable rows' rejections)."""
    fields = [name for name in INPUT_FIELDS if name != "server_id"]
    columns: dict[str, list[str | None]] = {name: [] for name in fields}
    rows: list[int] = []
    bad: list[tuple[str, str]] = []
    rejected: list[dict[str, Any]] = []
    for number, event in enumerate(events):
        if not isinstance(event, dict):
            detail = f"row {number} is not a JSON object"
            bad.append((json.dumps(event)[:1000], detail))
            rejected.append({"row": number, "reason": "unparseable", "detail": detail})
            continue
        rows.append(number)
        for name in fields:
            columns[name].append(field_text(event.get(name)))
    table = pa.table({**{name: pa.array(values, pa.string()) for name, values in columns.items()},
                      "server_id": pa.array([server_id] * len(rows), pa.string())})
    return table, unparseable_rows(bad, source), rows, rejected


def _player_id(value: str, where: str) -> str:
    if not _ID.match(value):
        raise ApiError(422, "invalid_request", f"{where}: player id {value[:80]!r} must be 1-64 "
                                               "chars of [A-Za-z0-9_.:-]")
    return value


# -- the app ----------------------------------------------------------------------------------

_BoardName = Annotated[str, PathParam(description="board name, e.g. `global` or `region:na`",
                                      max_length=64)]
_PlayerId = Annotated[str, PathParam(description="player id: 1-64 chars of [A-Za-z0-9_.:-]",
                                     pattern=ID_PATTERN)]
_Window = Annotated[str | None, Query(
    description="`daily|weekly|monthly|season|all-time` (the window open now) or a window id "
                "such as `weekly:2026-W49`; default all-time", max_length=64)]

_EVENT_BODY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"events": {"type": "array", "maxItems": MAX_BATCH_ROWS, "items": {
        "type": "object",
        "required": ["match_id", "player_id", "points", "event_time", "region", "mode"],
        "properties": {
            "match_id": {"type": "string", "maxLength": 128},
            "player_id": {"type": "string", "pattern": ID_PATTERN},
            "points": {"type": "integer"},
            "event_time": {"type": "string", "format": "date-time"},
            "region": {"type": "string"}, "mode": {"type": "string"},
            "server_id": {"type": "string", "description": "ignored: taken from the credential"},
        }}}},
    "required": ["events"],
}


class PlayerAction(BaseModel):
    """A ban or an unban of one player."""

    player_id: str = Field(pattern=ID_PATTERN, description="1-64 chars of [A-Za-z0-9_.:-]")
    reason: str = Field("", max_length=500, description="why (kept in the lake's tombstone)")


#: Seconds a worker reuses the speed layer's version pointer (one Redis GET fewer per read).
POINTER_TTL = 1.0


class _Timed:
    """Request latency per route into the metrics, as a plain ASGI middleware (Starlette's
    BaseHTTPMiddleware costs a task and a stream per request: a third of a fast read)."""

    def __init__(self, app: Any, metrics: _Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [500]

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = scope.get("route")
            self.metrics.latency.labels(
                scope["method"], getattr(route, "path", "unmatched"), str(status[0])
            ).observe(time.perf_counter() - started)


def _plain(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def encode_json(answer: Any) -> bytes:
    """An answer as compact JSON bytes (dates ISO 8601), without FastAPI's per-field
    encoder: the read routes return these as they are."""
    return json.dumps(answer, separators=(",", ":"), default=_plain).encode()


def _json(answer: Any) -> Response:
    return Response(encode_json(answer), media_type="application/json")


def create_app(settings: Settings, config: HttpConfig | None = None, *,
               client: redis.Redis | None = None) -> FastAPI:
    """The app for one process. `client` defaults to REDIS_URL or the local server."""
    config = config or HttpConfig()
    service = _Service(settings, config, client)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        service.close()

    app = FastAPI(
        title="leaderboard", version="1.0",
        description="Merged (batch + speed) leaderboards: ingest match results, read ranks, "
                    "top N, neighbours, friends, percentiles and history.",
        lifespan=lifespan)
    app.state.service = service
    _install_error_handlers(app)

    app.add_middleware(_Timed, metrics=service.metrics)

    # -- ingest --------------------------------------------------------------------------------

    @app.post("/v1/events", tags=["ingest"], summary="Ingest a batch of match events",
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": _EVENT_BODY_SCHEMA}}}},
              responses={200: {"description": "every row accepted (or a retry)"},
                         207: {"description": "some rows rejected: see `rejected`"},
                         401: {"description": "no credential"},
                         403: {"description": "wrong credential"},
                         413: {"description": "body or batch too large"},
                         422: {"description": "every row rejected"}})
    async def ingest(
        request: Request,
        authorization: Annotated[str | None, Header()] = None,
        x_api_key: Annotated[str | None, Header()] = None,
        x_server_id: Annotated[str | None, Header()] = None,
        x_signature: Annotated[str | None, Header()] = None,
    ) -> Response:
        """Validate, land and fold the rows exactly as `leaderboard ingest` does: retries
        within the idempotency horizon are dropped at the door, invalid rows are
        quarantined and answered with their reasons, the valid rows beside them land."""
        keys = service.config.keys
        token = _bearer(authorization) or x_api_key
        if token is None and not (x_server_id and x_signature):
            raise ApiError(401, "unauthenticated",
                           "send the server's API key (Authorization: Bearer <key> or "
                           "X-API-Key), or X-Server-Id and X-Signature (HMAC-SHA256 of the body)",
                           headers={"WWW-Authenticate": "Bearer"})
        server_id = None
        if token is not None:
            server_id = keys.server_for_key(token)
            if server_id is None:
                raise ApiError(403, "forbidden", "the API key is not one of the configured "
                                                 f"server keys ({keys.source})")
        body = await _read_body(request, service.config.max_body_bytes)
        if server_id is None:
            assert x_server_id is not None
            assert x_signature is not None
            if not keys.verify_signature(x_server_id, body, x_signature):
                raise ApiError(403, "forbidden", "X-Signature is not the HMAC-SHA256 of the "
                                                 "body under that server's secret")
            server_id = x_server_id
        events = _events_of(body, service.config.max_batch_rows)
        source = f"http:{server_id}"
        table, unparseable, rows, rejected = _batch_table(events, server_id, source)
        report = await run_in_threadpool(service.ingest, table, unparseable, server_id)
        rejected += [{"row": rows[row], "reason": reason, "detail": detail}
                     for row, reason, detail in report.rejections]
        rejected.sort(key=lambda r: r["row"])
        answer: dict[str, Any] = {
            "server_id": server_id, "rows": len(events), "accepted": report.accepted,
            "duplicates": report.duplicates, "retries": report.retries,
            "rejected_count": len(rejected), "rejected": rejected,
            "folded": report.fold_error is None,
        }
        if report.fold_error:
            answer["warning"] = (f"landed durably, but the fold into the speed layer failed "
                                 f"({report.fold_error}); it is repaired on the next request")
        status = 200 if not rejected else (422 if len(rejected) == len(events) else 207)
        if status == 422:
            answer.update(error="all_rows_rejected",
                          message="every row was rejected; see `rejected` for the reasons")
        return JSONResponse(answer, status_code=status)

    # -- reads --------------------------------------------------------------------------------
    # The fast reads are coroutines run on the event loop: each is a few hundred microseconds
    # of work and at most one short Redis round trip, which costs less than a hop to the
    # thread pool and back. History (Parquet reads) stays in the pool.

    @app.get("/v1/boards", tags=["read"], summary="Boards, their windows and next resets")
    async def boards() -> Response:
        return _json({"boards": service.boards.boards()})

    @app.get("/v1/boards/{board}/top", tags=["read"], summary="The top N (paged by cursor)")
    async def top(board: _BoardName, window: _Window = None,
            n: Annotated[int, Query(ge=1, le=MAX_TOP_N)] = 100,
            cursor: Annotated[str | None, Query(max_length=256,
                                                description="next_cursor of a previous page")
                              ] = None) -> Response:
        """Cached for LEADERBOARD_TOP_TTL seconds per (version, board, window, n, cursor)."""
        service.board(board)
        return Response(service.cache.top(service.boards, board, n, window, cursor,
                                          encode=encode_json),
                        media_type="application/json")

    @app.get("/v1/boards/{board}/players/{player_id}", tags=["read"],
             summary="A player's rank, score, percentile and move since yesterday")
    async def player(board: _BoardName, player_id: _PlayerId, window: _Window = None
               ) -> Response:
        service.board(board)
        return _json(service.boards.player(board, player_id, window))

    @app.get("/v1/boards/{board}/players/{player_id}/around", tags=["read"],
             summary="The k players listed before and after a player")
    async def around(board: _BoardName, player_id: _PlayerId, window: _Window = None,
               k: Annotated[int, Query(ge=1, le=MAX_AROUND_K)] = 5) -> Response:
        service.board(board)
        return _json(service.boards.around(board, player_id, k, window))

    @app.get("/v1/boards/{board}/friends", tags=["read"],
             summary="A list of players ranked together")
    async def friends(board: _BoardName,
                ids: Annotated[str, Query(description=f"comma-separated player ids (at most "
                                                      f"{MAX_FRIENDS})",
                                          max_length=MAX_FRIENDS * 65)],
                window: _Window = None) -> Response:
        service.board(board)
        players = [p.strip() for p in ids.split(",") if p.strip()]
        if not players:
            raise ApiError(422, "invalid_request", "ids: give at least one player id")
        if len(players) > MAX_FRIENDS:
            raise ApiError(422, "invalid_request", f"ids: {len(players)} ids; the limit is "
                                                   f"{MAX_FRIENDS}")
        for p in players:
            _player_id(p, "ids")
        return _json(service.boards.friends(board, players, window))

    @app.get("/v1/boards/{board}/players/{player_id}/history", tags=["read"],
             summary="A player's rank on each published day")
    def history(board: _BoardName, player_id: _PlayerId,
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

    @app.get("/v1/boards/{board}/percentiles", tags=["read"],
             summary="The score needed for each top-x% and the score histogram")
    async def percentiles(board: _BoardName, window: _Window = None) -> Response:
        service.board(board)
        return _json(service.boards.percentiles(board, window))

    # -- admin and operations -----------------------------------------------------------------

    def admin(authorization: str | None, x_admin_key: str | None) -> None:
        token = _bearer(authorization) or x_admin_key
        if token is None:
            raise ApiError(401, "unauthenticated", "send the admin key (Authorization: Bearer "
                                                   "<key> or X-Admin-Key)",
                           headers={"WWW-Authenticate": "Bearer"})
        if not service.config.keys.is_admin(token):
            configured = service.config.keys.admin_key is not None
            raise ApiError(403, "forbidden", "wrong admin key" if configured else
                           "no admin key is configured: set LEADERBOARD_ADMIN_KEY")

    @app.post("/v1/admin/bans", tags=["admin"], summary="Ban a player from every board")
    def ban(action: Annotated[PlayerAction, Body()],
            authorization: Annotated[str | None, Header()] = None,
            x_admin_key: Annotated[str | None, Header()] = None) -> dict[str, Any]:
        admin(authorization, x_admin_key)
        count = service.speed.ban(action.player_id, service.settings.now(), action.reason)
        service.cache.clear()
        return {"player_id": action.player_id, "status": "banned", "board_windows": count}

    @app.post("/v1/admin/unbans", tags=["admin"], summary="Unban a player, restoring scores")
    def unban(action: Annotated[PlayerAction, Body()],
              authorization: Annotated[str | None, Header()] = None,
              x_admin_key: Annotated[str | None, Header()] = None) -> dict[str, Any]:
        admin(authorization, x_admin_key)
        count = service.speed.unban(action.player_id, service.settings.now())
        service.cache.clear()
        return {"player_id": action.player_id, "status": "unbanned", "board_windows": count}

    @app.get("/healthz", tags=["operations"], summary="Redis answers and a version is readable",
             responses={503: {"description": "what is wrong"}})
    def healthz() -> Response:
        problems: dict[str, str] = {}
        answer: dict[str, Any] = {}
        try:
            service.client.ping()
            answer["redis"] = "ok"
        except redis.RedisError as exc:
            problems["redis"] = f"Redis does not answer PING: {exc}"
        try:
            manifest = read_current(service.settings.lake_dir)
            if manifest is None:
                problems["manifest"] = ("no batch version is published yet; run "
                                        "`leaderboard batch`")
            else:
                answer.update(version=manifest.version, as_of=manifest.as_of)
        except ManifestError as exc:
            problems["manifest"] = str(exc)
        if "redis" not in problems:
            try:
                # The version the speed pointer names (what reads merge with) must load too.
                answer["serving_version"] = service.boards.version().version.version
            except ManifestError as exc:
                problems["serving_version"] = str(exc)
            except redis.RedisError as exc:
                problems["redis"] = f"Redis failed reading the version pointer: {exc}"
        answer["now"] = format_instant(service.settings.now())
        if problems:
            return JSONResponse({"status": "unavailable", "problems": problems, **answer},
                                status_code=503)
        return JSONResponse({"status": "ok", **answer})

    @app.get("/metrics", tags=["operations"], summary="Prometheus metrics")
    def metrics() -> Response:
        return Response(generate_latest(service.metrics.registry),
                        media_type=CONTENT_TYPE_LATEST)

    return app


def create_app_from_env() -> FastAPI:
    """The app from the environment alone (what `leaderboard serve` starts in each worker)."""
    return create_app(Settings.from_env(), HttpConfig.from_env())
