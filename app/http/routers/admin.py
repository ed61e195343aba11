"""Operator actions behind the admin key: ban and unban a player on every board; void a
match (or one player's result in it) and list the voids.

The key is checked before the body is read: a caller without it learns nothing about what
a valid body looks like (401/403, never a 422 first).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Path, Query, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.http.auth import ADMIN_BEARER, ADMIN_KEY, check_admin, token_of
from app.http.errors import ApiError, documented
from app.http.routers.ingest import read_body
from app.http.service import ERASURE_SETTLE, Service, ServiceDep
from leaderboard.validation import ID_PATTERN, ID_RULE, MATCH_ID_PATTERN
from leaderboard.voids import read_voids

__all__ = ["MAX_ADMIN_BODY", "PlayerAction", "VoidAction", "router"]

_AUTH_RESPONSES = documented(401, 403, 413, 422, 503, s401="no admin key",
                             s403="a wrong admin key, or none is configured",
                             s422="the body is not a valid action; `erased`: the player's "
                                  "data was erased, nothing is recorded under the id")


class PlayerAction(BaseModel):
    """A ban or an unban of one player."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"player_id": "p001", "reason": "aimbot, confirmed by replay review"}]})

    player_id: str = Field(pattern=ID_PATTERN, description=ID_RULE)
    reason: str = Field("", max_length=500, description="why (kept in the lake's tombstone)")


_Model = TypeVar("_Model", bound=BaseModel)

#: An admin body is small (the largest, a release of 1,000 row ids, is ~50 KB): a longer one
#: is refused 413 before it is read whole, as an ingest body past its limit.
MAX_ADMIN_BODY = 131_072


class VoidAction(BaseModel):
    """A void: a match (every player's result) or one player's result in it counts nowhere
    from now on. A void of a match not landed yet is recorded: its events will not count
    when they arrive. No un-void: a corrected result is a new submission, new match_id."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"match_id": "m-2026-12-01-17", "reason": "a replayed match"},
        {"match_id": "m-2026-12-01-17", "player_id": "p001", "reason": "disconnect abuse"}]})

    match_id: str = Field(min_length=1, max_length=128, pattern=MATCH_ID_PATTERN,
                          description="the match to void (1-128 printable characters)")
    player_id: str | None = Field(None, pattern=ID_PATTERN,
                                  description=f"only this player's result ({ID_RULE}); "
                                              "absent or null: every player of the match")
    reason: str = Field(min_length=1, max_length=500,
                        description="why (kept in the lake's void record)")


async def _admin(service: ServiceDep,
                 bearer: Annotated[HTTPAuthorizationCredentials | None,
                                   Security(ADMIN_BEARER)] = None,
                 x_admin_key: Annotated[str | None, Security(ADMIN_KEY)] = None) -> Service:
    check_admin(service.config.keys, token_of(bearer, x_admin_key))
    return service


async def _body(request: Request, model: type[_Model]) -> _Model:
    """The body, read only once the admin dependency (declared first) has passed, and
    refused 413 past MAX_ADMIN_BODY bytes."""
    body = await read_body(request, MAX_ADMIN_BODY,
                           "an admin action is one small JSON object (see /docs)")
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise RequestValidationError(
            [{**error, "loc": ("body", *error["loc"])}
             # With its context: a pattern mismatch is then named by its rule, not "does
             # not have the documented form" (app.http.errors._rule).
             for error in exc.errors(include_url=False)]) from None


async def _action(request: Request) -> PlayerAction:
    return await _body(request, PlayerAction)


async def _void_action(request: Request) -> VoidAction:
    return await _body(request, VoidAction)


AdminDep = Annotated[Service, Depends(_admin)]
ActionDep = Annotated[PlayerAction, Depends(_action)]
VoidDep = Annotated[VoidAction, Depends(_void_action)]

router = APIRouter(tags=["admin"], responses=_AUTH_RESPONSES)
_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": PlayerAction.model_json_schema()}}}}


@contextmanager
def _not_erased(service: Service, player: str | None) -> Iterator[None]:
    """The action's block, refused (422 `erased`) for an erased player: the check and the
    write under the erasure barrier (`app.erasure.unless_erased`)."""
    from app.erasure import ErasedPlayer, unless_erased

    try:
        with unless_erased(service.settings.lake_dir, player):
            yield
    except ErasedPlayer as exc:
        raise ApiError(422, "erased", str(exc)) from None


@router.post("/v1/admin/bans", summary="Ban a player from every board", openapi_extra=_BODY)
def ban(service: AdminDep, action: ActionDep) -> dict[str, Any]:
    with _not_erased(service, action.player_id):
        count = service.speed.ban(action.player_id, service.settings.now(), action.reason)
    service.cache.clear()
    return {"player_id": action.player_id, "status": "banned", "board_windows": count}


@router.post("/v1/admin/unbans", summary="Unban a player, restoring scores", openapi_extra=_BODY)
def unban(service: AdminDep, action: ActionDep) -> dict[str, Any]:
    with _not_erased(service, action.player_id):
        count = service.speed.unban(action.player_id, service.settings.now())
    service.cache.clear()
    return {"player_id": action.player_id, "status": "unbanned", "board_windows": count}


@router.post("/v1/admin/voids", summary="Void a match, or one player's result in it",
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": VoidAction.model_json_schema()}}}})
def void(service: AdminDep, action: VoidDep) -> dict[str, Any]:
    """A void record in the lake; the live boards drop the voided results at once (every
    aggregation recomputed exactly), the next batch version drops them too, published
    versions stay as they were. `players`: whose live standings changed (empty for a match
    that has not landed yet). `not_removed` (null when nothing is left): after retention,
    the results on event dates whose raw events it deleted, which neither the live boards
    nor any batch can remove (`results`, `line`, a `message` to show), or `unseen` when no
    raw event of the void is left in the lake at all; `partial: true` for a whole match
    whose results in deleted partitions cannot be listed and may still count (a match with
    a result on or before the line, or a direct board's match, whose scores span days),
    and `deleted_through`: the newest ingest date whose raw events retention deleted.
    A void already recorded for the same
    result or its whole match answers `status: already_voided` with that void as `earlier`:
    nothing new is recorded, and `players` is empty unless the earlier void's application
    had not finished (a Redis failure part-way), which this request finished."""
    with _not_erased(service, action.player_id):
        applied = service.speed.void_applied(action.match_id, action.player_id,
                                             service.settings.now(), action.reason)
    service.cache.clear()
    return applied.as_dict(action.match_id, action.player_id)


@router.get("/v1/admin/voids", summary="List the voids, newest first")
def voids(service: AdminDep,
          limit: Annotated[int, Query(ge=1, le=1000, description="at most this many")] = 100,
          match_id: Annotated[str | None, Query(min_length=1, max_length=128,
                                                pattern=MATCH_ID_PATTERN,
                                                description="only this match's")] = None,
          ) -> dict[str, Any]:
    found = [v for v in read_voids(service.settings.lake_dir)
             if match_id is None or v.match_id == match_id]
    found.reverse()
    return {"total": len(found), "voids": [v.as_dict() for v in found[:limit]]}


@router.delete("/v1/admin/players/{player_id}",
               summary="Erase a player everywhere (right to erasure)",
               responses=documented(409, 503,
                                    s409="`erasure_incomplete`: files of the lake could "
                                         "not be read (`lake.unreadable` lists them); "
                                         "the rest is erased; restore them, then erase "
                                         "again",
                                    s503="`erasure_stopped`: a file could not be written (a "
                                         "full disk, a permission; from the ledger to the "
                                         "warehouse); none is damaged; the message says "
                                         "whether the id is refused at ingest yet; fix "
                                         "that, then erase again (it resumes)"))
def erase(service: AdminDep,
          player_id: Annotated[str, Path(pattern=ID_PATTERN, description=ID_RULE)],
          ) -> dict[str, Any]:
    """Every byte of the id leaves the lake (events, quarantine, logs, rollups, every
    version's standings and histograms), Redis (its AOF rewritten) and the warehouse; the
    ledger keeps a salted hash, and later events of the id are refused (reason `erased`).
    Idempotent: erasing an id again finds nothing more to remove."""
    from app.erasure import ErasureStopped, erase_player

    try:
        result = erase_player(service.settings, service.speed, player_id,
                              settle=ERASURE_SETTLE)
    except ErasureStopped as exc:
        raise ApiError(503, "erasure_stopped", str(exc), player_id=player_id) from exc
    service.boards.forget_pointer()  # this process's next read follows the new version
    service.cache.clear()
    if result["status"] == "incomplete":
        raise ApiError(409, "erasure_incomplete", result["remains"], player_id=player_id,
                       **{k: v for k, v in result.items() if k not in ("status", "remains")})
    return {"player_id": player_id, **result}
