"""Operator actions behind the admin key: ban and unban a player on every board.

The key is checked before the body is read: a caller without it learns nothing about what
a valid body looks like (401/403, never a 422 first).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel, Field, ValidationError

from app.http.auth import ADMIN_BEARER, ADMIN_KEY, check_admin, token_of
from app.http.errors import documented
from app.http.service import Service, ServiceDep
from leaderboard.validation import ID_PATTERN, ID_RULE

__all__ = ["PlayerAction", "router"]

_AUTH_RESPONSES = documented(401, 403, 422, 503, s401="no admin key",
                             s403="a wrong admin key, or none is configured",
                             s422="the body is not a valid action")


class PlayerAction(BaseModel):
    """A ban or an unban of one player."""

    player_id: str = Field(pattern=ID_PATTERN, description=ID_RULE)
    reason: str = Field("", max_length=500, description="why (kept in the lake's tombstone)")


async def _admin(service: ServiceDep,
                 bearer: Annotated[HTTPAuthorizationCredentials | None,
                                   Security(ADMIN_BEARER)] = None,
                 x_admin_key: Annotated[str | None, Security(ADMIN_KEY)] = None) -> Service:
    check_admin(service.config.keys, token_of(bearer, x_admin_key))
    return service


async def _action(request: Request) -> PlayerAction:
    """The body, read only once the admin dependency (declared first) has passed."""
    try:
        return PlayerAction.model_validate_json(await request.body())
    except ValidationError as exc:
        raise RequestValidationError(
            [{**error, "loc": ("body", *error["loc"])}
             for error in exc.errors(include_url=False, include_context=False)]) from None


AdminDep = Annotated[Service, Depends(_admin)]
ActionDep = Annotated[PlayerAction, Depends(_action)]

router = APIRouter(tags=["admin"], responses=_AUTH_RESPONSES)
_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": PlayerAction.model_json_schema()}}}}


@router.post("/v1/admin/bans", summary="Ban a player from every board", openapi_extra=_BODY)
def ban(service: AdminDep, action: ActionDep) -> dict[str, Any]:
    count = service.speed.ban(action.player_id, service.settings.now(), action.reason)
    service.cache.clear()
    return {"player_id": action.player_id, "status": "banned", "board_windows": count}


@router.post("/v1/admin/unbans", summary="Unban a player, restoring scores", openapi_extra=_BODY)
def unban(service: AdminDep, action: ActionDep) -> dict[str, Any]:
    count = service.speed.unban(action.player_id, service.settings.now())
    service.cache.clear()
    return {"player_id": action.player_id, "status": "unbanned", "board_windows": count}
