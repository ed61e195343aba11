"""Player profiles: game servers set a player's display name, country and avatar; anyone
reads them (and every listing carries the display name).

A write is durable in the lake's profile log first, then put in the serving cache (Redis);
the worker that took it forgets its cached top-N pages listing the player, so its next
listing shows the new name (other workers' pages age out within LEADERBOARD_TOP_TTL).
"""

from __future__ import annotations

from typing import Annotated, Any

import redis
from fastapi import APIRouter, Header, Request, Security
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials
from starlette.concurrency import run_in_threadpool

from app.http.auth import (
    SERVER_BEARER,
    SERVER_KEY,
    SERVER_SIGNATURE,
    signature_hex,
    token_of,
)
from app.http.errors import ApiError, documented
from app.http.params import PlayerId, json_answer
from app.http.ratelimit import check_rate
from app.http.replay import REQUEST_ID_RULE, applied_once, checked_request_id, request_digest
from app.http.routers.ingest import server_and_body
from app.http.service import Service, ServiceDep
from app.sources import parse_json
from leaderboard.erasure import ErasureRunning, erasure_barrier
from leaderboard.profiles import (
    AVATAR_URL_MAX,
    COUNTRY_CODES,
    DISPLAY_NAME_MAX,
    DISPLAY_NAME_RAW_MAX,
    Profile,
    ProfileError,
    parse_profile,
    write_profile,
)

__all__ = ["MAX_PROFILE_BODY", "PROFILE_BODY_SCHEMA", "PROFILE_SCHEMA", "router"]

router = APIRouter(tags=["profiles"])

#: The body of a PUT. What a schema cannot state (printable characters, the length after
#: NFC normalisation, a host in the URL) is checked by `leaderboard.profiles.parse_profile`
#: and answered 422 with a specific error code.
PROFILE_BODY_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["display_name"], "additionalProperties": False,
    "examples": [{"display_name": "Zoë Kim", "country": "KR",
                  "avatar_url": "https://cdn.example.com/avatars/zoe.png"}],
    "properties": {
        "display_name": {"type": "string", "minLength": 1, "maxLength": DISPLAY_NAME_RAW_MAX,
                         "description": f"1-{DISPLAY_NAME_MAX} printable Unicode characters "
                                        "after NFC normalisation (stored normalised); no "
                                        "control, format or separator characters other than "
                                        "the space, no leading or trailing space"},
        "country": {"anyOf": [{"type": "string", "enum": list(COUNTRY_CODES)},
                              {"type": "null"}],
                    "description": "ISO 3166-1 alpha-2, upper case (KR, BR, DE); optional"},
        "avatar_url": {"anyOf": [{"type": "string", "maxLength": AVATAR_URL_MAX,
                                  "pattern": r"^https://[!-~]+$"}, {"type": "null"}],
                       "description": "an https URL with a host, ASCII without spaces "
                                      "(percent-encode the rest); optional"},
    },
}
#: A stored profile, as GET and PUT answer it.
PROFILE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["player_id", "display_name", "country", "avatar_url", "updated_at"],
    "properties": {
        "player_id": {"type": "string"},
        "display_name": {"type": "string"},
        "country": {"type": ["string", "null"]},
        "avatar_url": {"type": ["string", "null"]},
        "updated_at": {"type": "string", "format": "date-time"},
    },
}
_ANSWER = {"content": {"application/json": {"schema": PROFILE_SCHEMA}}}


#: A profile's body is small: a longer one is refused before it is read whole.
MAX_PROFILE_BODY = 16_384
#: Seconds a profile write waits for a running erasure before it answers 503.
PROFILE_ERASURE_WAIT = 1.0


def _fields(body: bytes) -> dict[str, Any]:
    try:
        data = parse_json(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ApiError(400, "bad_json", 'the body is not JSON; send {"display_name": "...", '
                                        '"country": "KR", "avatar_url": "https://..."}') from None
    if not isinstance(data, dict):
        raise ApiError(422, "invalid_profile", 'the body must be a JSON object: '
                                               '{"display_name": "...", ...}')
    return data


def _save(service: Service, profile: Profile, server_id: str) -> Profile:
    """The lake first (durable), then the serving cache; this worker's cached listings of
    the player are forgotten. The erasure ledger's check (in `write_profile`) and both
    writes hold the erasure barrier shared: an erasure between them would finish, and the
    writes then bring the id back into the lake and Redis. While an erasure runs, the write
    waits at most PROFILE_ERASURE_WAIT, then answers 503: a waiting write holds a thread
    of the pool ingest shares, and enough of them stalled ingest for the whole erasure
    (review s9)."""
    try:
        with erasure_barrier(service.settings.lake_dir, exclusive=False,
                             wait=PROFILE_ERASURE_WAIT):
            return _write(service, profile, server_id)
    except ErasureRunning:  # only the barrier's wait raises it
        raise ApiError(503, "erasure_running",
                       "a player's data is being erased (right to erasure); nothing was "
                       "saved: send the same request again shortly",
                       headers={"Retry-After": "5"}) from None


def _write(service: Service, profile: Profile, server_id: str) -> Profile:
    stored = write_profile(service.settings.lake_dir, profile, service.settings.now(),
                           server_id)
    try:
        service.boards.profiles.store([stored])
    except redis.RedisError as exc:
        raise ApiError(503, "unavailable",
                       f"the profile is saved in the lake, but the serving cache (Redis) is "
                       f"unavailable ({exc}): send the same request again shortly so "
                       "listings show it", headers={"Retry-After": "5"}) from None
    finally:
        service.cache.forget_players([profile.player_id])
    return stored


@router.put("/v1/players/{player_id}/profile", summary="Set a player's profile",
            openapi_extra={"requestBody": {"required": True, "content": {
                "application/json": {"schema": PROFILE_BODY_SCHEMA}}}},
            responses={200: {"description": "the profile as stored; for a repeat of a write "
                                            "applied earlier (same request id, header "
                                            "`Idempotent-Replayed: true`), the profile as it "
                                            "is now, nothing saved", **_ANSWER},
                       **documented(400, 401, 403, 404, 409, 413, 422, 429, 503,
                                    s400="the body is not JSON",
                                    s404="a repeat of a write applied earlier (same request "
                                         "id) for a player who has no profile now",
                                    s409="`in_flight_elsewhere`: an earlier send of this "
                                         "request (same request id) is being applied right "
                                         "now; send it again after Retry-After",
                                    s413="the body is over 16 KiB",
                                    s429="the server's rate limit (keys file "
                                         "`events_per_second`/`burst`; a profile write is "
                                         "one event): nothing was saved; retry after "
                                         "Retry-After",
                                    s401="no credential, or a signature without X-Timestamp",
                                    s403="a wrong key or signature (one made for another "
                                         "method, path or body), or X-Timestamp more than 5 "
                                         "minutes from the server's clock",
                                    s422="a field breaks the rules: `error` is "
                                         "invalid_display_name, invalid_country, "
                                         "invalid_avatar_url or invalid_profile; `erased` "
                                         "for an erased player's id; `bad_request_id` for "
                                         "an X-Request-Id that is not "
                                         + REQUEST_ID_RULE + "; `request_id_reused` for "
                                         "an X-Request-Id sent within 10 minutes with "
                                         "another request (another player or body): "
                                         "nothing saved",
                                    s503="nothing was saved while a player's data is being "
                                         "erased (`erasure_running`), or saved but not "
                                         "cached (Redis unavailable, `unavailable`): send "
                                         "the same request again after Retry-After")})
async def put_profile(
    service: ServiceDep, request: Request, player_id: PlayerId,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(SERVER_BEARER)] = None,
    x_api_key: Annotated[str | None, Security(SERVER_KEY)] = None,
    x_signature: Annotated[str | None, Security(SERVER_SIGNATURE)] = None,
    x_server_id: Annotated[str | None, Header(description="the signing server (with "
                                                          "X-Signature)")] = None,
    x_timestamp: Annotated[str | None, Header(description="Unix seconds the signature "
                                                          "covers (with X-Signature)")] = None,
    x_request_id: Annotated[str | None, Header(
        description=f"with an API key: this write's id ({REQUEST_ID_RULE}); a repeat of "
                    "the same request within 10 minutes is answered with the profile and "
                    "saves nothing, the id with another request is a 422. A signed write's "
                    "id is its signature")] = None,
) -> Any:
    """A game server's credential, as for `POST /v1/events`, and its rate limit: a write is
    one event of its bucket. Latest write wins; every write is kept in the lake's profile
    log. A write is applied once per request id (`app.http.replay`): a signed request's
    signature, else X-Request-Id when sent; a repeat answers the profile as it is and saves
    nothing, so a replayed write cannot undo a later one."""
    server_id, body = await server_and_body(
        service, request, bearer, x_api_key, x_signature, x_server_id, x_timestamp,
        limit=MAX_PROFILE_BODY, advice="a profile holds only display_name, country and "
                                       "avatar_url")
    signed = token_of(bearer, x_api_key) is None  # authenticated by its signature
    request_id = ("sig:" + signature_hex(x_signature or "") if signed
                  else checked_request_id(x_request_id))
    digest = request_digest(request.method, request.url.path, body)
    with applied_once(service.client, server_id, request_id, digest) as apply:
        if not apply:
            return _repeated(service, player_id)
        try:
            profile = parse_profile(player_id, _fields(body))
            # One token of the server's bucket, as one event (429 with Retry-After, nothing
            # saved).
            await run_in_threadpool(check_rate, service.client, service.config.keys,
                                    server_id, 1, what="a profile write")
            stored = await run_in_threadpool(_save, service, profile, server_id)
        except ProfileError as exc:  # a bad field, or an erased player
            raise ApiError(422, exc.code, str(exc)) from None
    return json_answer(stored.as_dict())


def _repeated(service: Service, player_id: str) -> Response:
    """The answer to a repeat of an applied write: the profile as it is now."""
    found = service.boards.profiles.get(player_id)
    if found is None:
        raise ApiError(404, "profile_not_found",
                       f"this request was applied earlier (same request id); player "
                       f"{player_id} has no profile now")
    answer = json_answer(found)
    answer.headers["Idempotent-Replayed"] = "true"
    return answer


@router.get("/v1/players/{player_id}/profile", summary="A player's profile",
            responses={200: {"description": "the latest profile", **_ANSWER},
                       **documented(404, 422, 503, s404="the player has no profile")})
async def get_profile(service: ServiceDep, player_id: PlayerId) -> Any:
    found = service.boards.profiles.get(player_id)
    if found is None:
        raise ApiError(404, "profile_not_found",
                       f"player {player_id} has no profile; a game server sets one with PUT "
                       f"/v1/players/{player_id}/profile")
    return json_answer(found)
