"""Composition roots for people and the game: the `leaderboard` CLI, the HTTP app, the demo."""

from __future__ import annotations

__all__: list[str] = []
