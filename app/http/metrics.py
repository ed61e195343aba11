"""Prometheus metrics of one process: request latency per route, score visibility, and
figures read at scrape time (speed lag, Redis up, the top-N and base cache counters).

Each app has its own `CollectorRegistry`, so two apps in one process (tests) never share or
double-register collectors.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import redis
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from leaderboard.speed_keys import StateLost

if TYPE_CHECKING:
    from app.http.service import Service

__all__ = ["LATENCY_BUCKETS", "Metrics", "TimedRequests"]

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _LiveCollector:
    """Figures read at scrape time: speed lag, Redis up, the top-N cache counters."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def describe(self) -> Iterable[Metric]:
        return self._families(lag=None, up=None, lost=None)

    def collect(self) -> Iterable[Metric]:
        speed = self.service.speed
        lost: float | None = 0.0
        try:
            lag: float | None = float(len(speed.folder.pending(speed.current())))
            up = 1.0
        except StateLost:
            self.service.state_lost()
            lag, up, lost = None, 1.0, 1.0
        except redis.RedisError:
            lag, up, lost = None, 0.0, None
        return self._families(lag=lag, up=up, lost=lost)

    def _families(self, *, lag: float | None, up: float | None,
                  lost: float | None) -> list[Metric]:
        stats = self.service.cache.stats()
        families: list[Metric] = []
        lost_family = GaugeMetricFamily(
            "leaderboard_speed_state_lost",
            "1 while the speed state lost its past (Redis lost its data) and is not rebuilt "
            "yet: merged reads and ingest answer 503 (absent: Redis down)")
        if lost is not None:
            lost_family.add_metric([], lost)
        families.append(lost_family)
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
        bases = self.service.boards.bases.stats()
        counter, gauge = CounterMetricFamily, GaugeMetricFamily
        for kind, name, value, text in (
                (counter, "top_cache_hits", stats.hits,
                 "Top-N answers served fresh from the cache"),
                (counter, "top_cache_misses", stats.misses,
                 "Top-N answers computed (cache misses)"),
                (counter, "top_cache_coalesced", stats.coalesced,
                 "Top-N requests that waited on another request's refresh of the same key"),
                (counter, "top_cache_stale", stats.stale,
                 "Stale top-N answers served while Redis failed"),
                (gauge, "top_cache_hit_ratio", stats.hit_ratio,
                 "Share of top-N answers that needed no computation"),
                (gauge, "top_cache_entries", stats.entries,
                 "Top-N answers kept (fresh or for stale serving)"),
                (gauge, "top_cache_bytes", stats.bytes, "Bytes of the top-N answers kept"),
                (gauge, "base_cache_bytes", bases.bytes,
                 "Bytes of base arrays kept (LRU, bounded by LEADERBOARD_BASE_CACHE_BYTES)"),
                (gauge, "base_cache_max_bytes", bases.max_bytes,
                 "The bound on leaderboard_base_cache_bytes (LEADERBOARD_BASE_CACHE_BYTES)"),
                (gauge, "base_cache_entries", bases.entries,
                 "Board-windows whose base arrays are kept"),
                (counter, "base_cache_evictions", bases.evictions,
                 "Base board-windows dropped to stay under the bound (least recently used "
                 "first)"),
                (counter, "base_cache_oversized", bases.oversized,
                 "Base board-windows larger than the whole bound: served, not kept")):
            family = kind(f"leaderboard_{name}", text)
            family.add_metric([], value)
            families.append(family)
        return families


class Metrics:
    """The registry of one app and the histograms its routes observe."""

    def __init__(self, service: Service) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "leaderboard_http_request_duration_seconds", "HTTP request latency per route",
            ["method", "route", "status"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.visibility = Histogram(
            "leaderboard_score_visibility_seconds",
            "From an event's ingested_at stamp to its score being folded into the speed "
            "layer (readable), per ingested batch", buckets=LATENCY_BUCKETS,
            registry=self.registry)
        self.registry.register(_LiveCollector(service))


class TimedRequests:
    """Request latency per route into the metrics, as a plain ASGI middleware (Starlette's
    BaseHTTPMiddleware costs a task and a stream per request: a third of a fast read)."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
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
