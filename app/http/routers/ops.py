"""Operations: health for load balancers and orchestrators, metrics for Prometheus, and the
console's operations summary for the admin key."""

from __future__ import annotations

from typing import Any

import redis
from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.console.ops import QuarantineTally, ops_status
from app.http.errors import documented
from app.http.routers.admin import AdminDep
from app.http.service import ServiceDep
from leaderboard.manifest import ManifestError, read_current
from leaderboard.speed_keys import StateLost, read_live_version
from leaderboard.timeutil import format_instant
from leaderboard.visibility import invisible_files

__all__ = ["router"]

router = APIRouter(tags=["operations"])
#: The quarantine's counts by file, memoised across the summary's polls.
_tally = QuarantineTally()


@router.get("/healthz", summary="Redis answers and a version is readable",
            responses=documented(503, s503="what is wrong: `problems` names each failed part"))
def healthz(service: ServiceDep) -> Response:
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
            if invisible := invisible_files(service.settings.lake_dir, manifest):
                problems["invisible_events"] = (
                    f"{len(invisible)} landed file(s) hold accepted events that version "
                    f"{manifest.version} did not read, ingested before its watermark "
                    f"{manifest.watermark}: the speed layer counts them as absorbed, so they "
                    "are on no live board; run `leaderboard batch` (once the night they "
                    "landed in has ended) to absorb them")
    except ManifestError as exc:
        problems["manifest"] = str(exc)
    if "redis" not in problems:
        try:
            # The version the speed pointer names (what reads merge with) must load too.
            # Fresh, not the pointer reads reuse for a second: a lost state shows at once.
            read_live_version(service.client, service.settings.lake_dir)
            answer["serving_version"] = service.boards.version().version.version
        except StateLost as exc:
            service.state_lost()
            problems["speed_state"] = f"{exc}; the server is rebuilding it now"
        except ManifestError as exc:
            problems["serving_version"] = str(exc)
        except redis.RedisError as exc:
            problems["redis"] = f"Redis failed reading the version pointer: {exc}"
    answer["now"] = format_instant(service.settings.now())
    if problems:
        degraded = set(problems) <= {"speed_state", "invisible_events"}
        status = "degraded" if degraded else "unavailable"
        error = ("unavailable" if not degraded else "speed_state_lost"
                 if "speed_state" in problems else "events_invisible")
        return JSONResponse({"status": status, "error": error,
                             "message": "; ".join(problems.values()), "problems": problems,
                             **answer}, status_code=503)
    return JSONResponse({"status": "ok", **answer})


@router.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse,
            responses={200: {"description": "the Prometheus text exposition format",
                             "content": {"text/plain": {"schema": {"type": "string"}}}}})
def metrics(service: ServiceDep) -> Response:
    return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/console/api/ops", include_in_schema=False)
def console_ops(service: AdminDep) -> JSONResponse:
    """The console's operations summary (batch run, speed status, quarantine by reason) as
    JSON, for the admin key only (401 without it, 403 with another): it names writers,
    versions and what was refused, which is not for the public the boards are for."""
    status = ops_status(service.settings.lake_dir, service.speed, service.settings.now(),
                        _tally)
    return JSONResponse(status.as_dict(), headers={"Cache-Control": "no-store"})
