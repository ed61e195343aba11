"""Operator actions behind the admin key: ban and unban a player on every board."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Header
from pydantic import BaseModel, Field

from app.http.auth import check_admin
from app.http.service import ServiceDep
from leaderboard.validation import ID_PATTERN

__all__ = ["PlayerAction", "router"]

router = APIRouter(tags=["admin"])


class PlayerAction(BaseModel):
    """A ban or an unban of one player."""

    player_id: str = Field(pattern=ID_PATTERN, description="1-64 chars of [A-Za-z0-9_.:-]")
    reason: str = Field("", max_length=500, description="why (kept in the lake's tombstone)")


@router.post("/v1/admin/bans", summary="Ban a player from every board")
def ban(service: ServiceDep, action: Annotated[PlayerAction, Body()],
        authorization: Annotated[str | None, Header()] = None,
        x_admin_key: Annotated[str | None, Header()] = None) -> dict[str, Any]:
    check_admin(service.config.keys, authorization, x_admin_key)
    count = service.speed.ban(action.player_id, service.settings.now(), action.reason)
    service.cache.clear()
    return {"player_id": action.player_id, "status": "banned", "board_windows": count}


@router.post("/v1/admin/unbans", summary="Unban a player, restoring scores")
def unban(service: ServiceDep, action: Annotated[PlayerAction, Body()],
          authorization: Annotated[str | None, Header()] = None,
          x_admin_key: Annotated[str | None, Header()] = None) -> dict[str, Any]:
    check_admin(service.config.keys, authorization, x_admin_key)
    count = service.speed.unban(action.player_id, service.settings.now())
    service.cache.clear()
    return {"player_id": action.player_id, "status": "unbanned", "board_windows": count}
