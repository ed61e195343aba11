"""The OpenAPI document bound to this app's registry: what the routers' schemas cannot know
until the registry is loaded.

Board path parameters list the registry's boards, and an event's `region` and `mode` its
regions and modes, and `points` the widest bounds of its boards, so a client (or
Schemathesis) reading the schema knows which values exist: the schema and the route's
answers agree on them, as they do on every other field.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

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
    for operations in spec.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                if parameter.get("name") == "board" and parameter.get("in") == "path":
                    parameter["schema"]["enum"] = boards
            for event in _event_schemas(operation.get("requestBody", {})):
                fields = event["properties"]
                fields["region"]["enum"] = list(registry.regions)
                fields["mode"]["enum"] = list(registry.modes)
                fields["points"]["minimum"] = min(board.min_points for board in registry.boards)
                fields["points"]["maximum"] = max(board.max_points for board in registry.boards)


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
