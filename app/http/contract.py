"""The OpenAPI document bound to this app's registry: what the routers' schemas cannot know
until the registry is loaded; and the links between operations (OpenAPI `links`: what a
client does next with an answer, e.g. read the player a score was just submitted for),
which a stateful client (or Schemathesis's stateful phase) follows.

Board path parameters list the registry's boards, and an event's `region` and `mode` its
regions and modes, and `points` the widest bounds of its event boards (a score's, of its
direct boards), so a client (or
Schemathesis) reading the schema knows which values exist: the schema and the route's
answers agree on them, as they do on every other field.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from app.http.errors import ERROR_BODY
from app.http.routers.scores import SCORES_PATH
from leaderboard.registry import Board, Registry

__all__ = ["LINKS", "bind_openapi"]

_PLAYER = "/v1/boards/{board}/players/{player_id}"
_TOP = "/v1/boards/{board}/top"
#: (operation, name, next operation, its parameters, its body): each a link of the first
#: operation's 200 answer (runtime expressions: OpenAPI 3's `$request...`/`$response...`;
#: `path.board` None: the registry's first board).
LINKS: list[tuple[str, str, str, dict[str, str | None], Any]] = [
    ("POST /v1/admin/bans", "UnbanThePlayer", "POST /v1/admin/unbans", {},
     {"player_id": "$response.body#/player_id"}),
    ("POST /v1/admin/bans", "ReadTheBannedPlayer", f"GET {_PLAYER}",
     {"path.board": None, "path.player_id": "$response.body#/player_id"}, None),
    ("POST /v1/admin/unbans", "ReadTheUnbannedPlayer", f"GET {_PLAYER}",
     {"path.board": None, "path.player_id": "$response.body#/player_id"}, None),
    ("POST /v1/admin/voids", "ListTheMatchVoids", "GET /v1/admin/voids",
     {"query.match_id": "$request.body#/match_id"}, None),
    ("PUT /v1/players/{player_id}/profile", "ReadTheProfile",
     "GET /v1/players/{player_id}/profile", {"path.player_id": "$request.path.player_id"}, None),
    (f"POST {SCORES_PATH}", "ReadTheScoredPlayer", f"GET {_PLAYER}",
     {"path.board": "$request.path.board", "path.player_id": "$response.body#/player_id"},
     None),
    (f"GET {_TOP}", "ReadTheLeader", f"GET {_PLAYER}",
     {"path.board": "$request.path.board",
      "path.player_id": "$response.body#/entries/0/player_id"}, None),
    (f"GET {_TOP}", "PlayersAroundTheLeader", f"GET {_PLAYER}/around",
     {"path.board": "$request.path.board",
      "path.player_id": "$response.body#/entries/0/player_id"}, None),
    ("GET /v1/admin/quarantine", "ReleaseTheFirstRow", "POST /v1/admin/quarantine/release",
     {}, {"ids": ["$response.body#/rows/0/id"]}),
]


def _event_schemas(node: Any) -> list[dict[str, Any]]:
    """Every object schema with the event fields, wherever the body nests it."""
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        properties = node.get("properties")
        if isinstance(properties, dict) and {"region", "mode", "points"} <= set(properties):
            found.append(node)
        for value in node.values():
            found.extend(_event_schemas(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_event_schemas(value))
    return found


def _example_event(registry: Registry, boards: list[Board]) -> dict[str, Any]:
    """One event of the registry's names, its points within every board's bounds where
    they have a common point."""
    low = max(board.min_points for board in boards)
    high = min(board.max_points for board in boards)
    return {"match_id": "m-2026-12-01-17", "player_id": "p001",
            "points": min(max(10, low), high) if low <= high else low,
            "event_time": "2026-12-01T17:00:00Z", "region": registry.regions[0],
            "mode": registry.modes[0]}


def _bind(spec: dict[str, Any], registry: Registry) -> None:
    boards = [board.name for board in registry.boards]
    # Match events count on the event boards, scores on the direct ones (a registry without
    # direct boards lists them all for the scores route, which answers 409 for each).
    fed_by_events = [b for b in registry.boards if not b.direct] or list(registry.boards)
    direct = [b for b in registry.boards if b.direct]
    for path, operations in spec.get("paths", {}).items():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                if parameter.get("name") == "board" and parameter.get("in") == "path":
                    parameter["schema"]["enum"] = ([b.name for b in direct]
                                                   if path == SCORES_PATH and direct else boards)
            for event in _event_schemas(operation.get("requestBody", {})):
                fields = event["properties"]
                fields["region"]["enum"] = list(registry.regions)
                fields["mode"]["enum"] = list(registry.modes)
                fields["points"]["minimum"] = min(board.min_points for board in fed_by_events)
                fields["points"]["maximum"] = max(board.max_points for board in fed_by_events)
            if path == "/v1/events":
                body = operation["requestBody"]["content"]["application/json"]["schema"]
                body["examples"] = [{"events": [_example_event(registry, fed_by_events)]}]
            if path == SCORES_PATH and direct:
                body = operation["requestBody"]["content"]["application/json"]["schema"]
                for field in ("score", "delta"):
                    takes = [b for b in direct if b.score_field == field] or direct
                    body["properties"][field]["minimum"] = min(b.min_points for b in takes)
                    body["properties"][field]["maximum"] = max(b.max_points for b in takes)


#: What the server answers before any route, to a request that is not valid HTTP/1.1
#: (app.http.transport): any operation may get it, so each documents it.
_NOT_HTTP = ("`bad_http_request`: the request is not valid HTTP/1.1 (a request line or URL "
             "over 64 KiB, both Content-Length and Transfer-Encoding, a malformed header), "
             "answered by the server before the route; the connection is closed")


def _transport_answers(spec: dict[str, Any]) -> None:
    """Every operation's 400 names the server's own (app.http.transport)."""
    for operations in spec.get("paths", {}).values():
        for operation in operations.values():
            responses = operation["responses"]
            if "400" in responses:
                responses["400"]["description"] += f"; or {_NOT_HTTP}"
            else:
                responses["400"] = {"description": _NOT_HTTP, "content": {
                    "application/json": {"schema": ERROR_BODY}}}


def _link(spec: dict[str, Any], registry: Registry) -> None:
    """LINKS into the document, each naming its target by operationId."""
    def operation(label: str) -> dict[str, Any]:
        method, path = label.split(" ", 1)
        found: dict[str, Any] = spec["paths"][path][method.lower()]
        return found

    for source, name, target, parameters, body in LINKS:
        link: dict[str, Any] = {"operationId": operation(target)["operationId"]}
        if parameters:
            link["parameters"] = {key: registry.boards[0].name if value is None else value
                                  for key, value in parameters.items()}
        if body is not None:
            link["requestBody"] = body
        operation(source)["responses"]["200"].setdefault("links", {})[name] = link


def bind_openapi(app: FastAPI, registry: Registry) -> Callable[[], dict[str, Any]]:
    """`app.openapi`: FastAPI's document with the registry's names and bounds, built once."""
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = copy.deepcopy(get_openapi(
                title=app.title, version=app.version, description=app.description,
                routes=app.routes))
            _bind(spec, registry)
            _link(spec, registry)
            _transport_answers(spec)
            app.openapi_schema = spec
        return app.openapi_schema

    return openapi
