"""The state behind the routes of one app (one process), and the dependency that hands it
to them.

One `Service` per app: the Redis client, the serving layer's `Leaderboards`, the speed
layer, the top-N cache, the metrics and the landing writer. Routers never build any of
these; they declare `service: ServiceDep` and FastAPI passes the app's own.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Annotated

import pyarrow as pa
import redis
from fastapi import Depends, Request
from redis.backoff import NoBackoff
from redis.retry import Retry

from app.http.config import HttpConfig
from app.http.errors import ApiError
from app.http.metrics import Metrics
from leaderboard.lake import LandingWriter
from leaderboard.registry import Board, RegistryError
from leaderboard.settings import Settings
from leaderboard.speed_keys import StateLost, connect
from serving.cache import TopCache
from serving.service import Leaderboards, QueryError
from speed_layer.ingest import Ingestor, IngestReport, open_writer
from speed_layer.service import RebuildRunning, SpeedLayer

__all__ = ["ERASURE_SETTLE", "POINTER_TTL", "REDIS_TIMEOUT", "Service", "ServiceDep",
           "service_of"]

#: Seconds a worker reuses the speed layer's version pointer (one Redis GET fewer per read).
POINTER_TTL = 1.0
#: Seconds a request's Redis calls may take before they fail (the client's timeouts).
REDIS_TIMEOUT = 2.0
#: Seconds after a pointer moves when no request reads another version any more: the reuse,
#: plus a request that read the old pointer at its last moment and then waited on Redis.
ERASURE_SETTLE = POINTER_TTL + REDIS_TIMEOUT

_log = logging.getLogger(__name__)


def _redis_client(settings: Settings) -> redis.Redis:
    """The layers' client with short timeouts and one retry: a request must fail fast (503,
    or a stale top-N) when Redis is gone."""
    return connect(settings, timeout=REDIS_TIMEOUT, connect_timeout=REDIS_TIMEOUT,
                   retry=Retry(NoBackoff(), 1))


class Service:
    """State shared by the routes of one app (one process)."""

    def __init__(self, settings: Settings, config: HttpConfig, client: redis.Redis | None
                 ) -> None:
        self.settings = settings
        self.config = config
        self.registry = settings.registry
        self._owns_client = client is None
        self.client = _redis_client(settings) if client is None else client
        self.boards = Leaderboards(settings.lake_dir, self.registry, self.client,
                                   now=settings.now, pointer_ttl=POINTER_TTL,
                                   base_cache_bytes=settings.base_cache_bytes)
        self.speed = SpeedLayer(self.client, self.registry, settings.lake_dir)
        self.cache = TopCache(config.top_ttl, config.top_max_stale)
        self.metrics = Metrics(self)
        # One landing writer per process, opened on first use; the writer is not thread-safe.
        self._ingest_lock = threading.Lock()
        self._writer: LandingWriter | None = None
        self._needs_repair = True  # fold what a crash (or a failed fold) left pending
        self._rebuild_guard = threading.Lock()
        self.rebuild_thread: threading.Thread | None = None

    def board(self, name: str) -> Board:
        """The registry's board, or a 404 that lists the boards there are."""
        try:
            return self.registry.board(name)
        except RegistryError as exc:
            raise ApiError(404, "unknown_board", str(exc),
                           boards=[b.name for b in self.registry.boards]) from None

    def window(self, board: str, window: str | None) -> Board:
        """The board, after checking it has the window asked for: a well-formed window id
        naming no window of the board (`daily:2026-02-30`, a season not in the calendar, a
        kind the board lacks) is a 404, as an unknown board is."""
        found = self.board(board)
        try:
            self.boards.resolve(found.name, window)
        except QueryError as exc:
            raise ApiError(404, "unknown_window", str(exc),
                           windows=list(found.windows)) from None
        return found

    def ingest(self, table: pa.Table, unparseable: pa.Table, server_id: str, *,
               board: Board | None = None) -> IngestReport:
        """Validate, land and fold one request's rows (one request at a time per process);
        with `board`, scores submitted to that direct board."""
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
                    unparseable=unparseable, row_reasons=True, board=board)
            except StateLost as exc:
                self.state_lost()
                raise ApiError(503, "speed_state_lost",
                               f"{exc}; the server is rebuilding it now and nothing was "
                               "landed: retry the same batch shortly",
                               headers={"Retry-After": "2"}) from None
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

    def fold_failed(self) -> None:
        """Rows landed outside `ingest` (a quarantine release) could not be folded: this
        worker's next ingest repairs first, as after a failed fold of its own (the next
        ingest's fold catches up only its own writer's files)."""
        self._needs_repair = True

    def quarantine(self, rows: pa.Table) -> None:
        """Keep refused rows (quarantine form, without ingested_at) with their reasons."""
        with self._ingest_lock:
            if self._writer is None:
                self._writer = open_writer(self.settings.lake_dir, self.config.writer)
            self._writer.quarantine(rows, self.settings.now())

    def state_lost(self) -> None:
        """The speed state lost its past (Redis lost its data): rebuild it from the lake in
        a background thread, one per process (the rebuild's lock in Redis keeps it to one
        across workers). Reads and ingest answer 503 until the rebuilt state is live."""
        self.boards.forget_pointer()  # no read reuses the pointer of the lost state
        with self._rebuild_guard:
            if self.rebuild_thread is not None and self.rebuild_thread.is_alive():
                return
            self.rebuild_thread = threading.Thread(target=self._rebuild, name="speed-rebuild",
                                                   daemon=True)
            self.rebuild_thread.start()

    def _rebuild(self) -> None:
        speed = SpeedLayer(self.client, self.registry, self.settings.lake_dir)
        try:
            # The profiles went with the speed state: reloaded first, while reads still
            # answer 503, so no read after the rebuild waits on it (or blocks the loop).
            self.boards.profiles.reload(self.settings.now())
            speed.rebuild(self.settings.now())
        except RebuildRunning:
            return  # another worker is at it
        except redis.RedisError as exc:
            _log.warning("rebuilding the speed state failed (%s); the next request retries", exc)
            return
        _log.warning("rebuilt the speed state of %s from the lake",
                     speed.current().version or "no batch yet")

    def close(self) -> None:
        with self._ingest_lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        if self._owns_client:
            self.client.close()


async def service_of(request: Request) -> Service:
    """The app's service (a coroutine: FastAPI would run a plain function in the pool)."""
    service: Service = request.app.state.service
    return service


ServiceDep = Annotated[Service, Depends(service_of)]
