"""The OpenAPI document bound to this app's registry: what the routers' schemas cannot know
until the registry is loaded.

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

from app.http.routers.scores import SCORES_PATH
from leaderboard.registry import Registry

__all__ = ["bind_openapi"]


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
            if path == SCORES_PATH and direct:
                body = operation["requestBody"]["content"]["application/json"]["schema"]
                for field in ("score", "delta"):
                    takes = [b for b in direct if b.score_field == field] or direct
                    body["properties"][field]["minimum"] = min(b.min_points for b in takes)
                    body["properties"][field]["maximum"] = max(b.max_points for b in takes)


def bind_openapi(app: FastAPI, registry: Registry) -> Callable[[], dict[str, Any]]:
    """`app.openapi`: FastAPI's document with the registry's names and bounds, built once."""
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = copy.deepcopy(get_openapi(
                title=app.title, version=app.version, description=app.description,
                routes=app.routes))
            _bind(spec, registry)
            app.openapi_schema = spec
        return app.openapi_schema

    return openapi
