"""The speed layer: holds in Redis only what arrived since the last batch watermark.

Ingest (validate, dedupe, land, fold), rebase onto a new batch version, rebuild after a
Redis loss, and bans. Imports only the core (`leaderboard`), never `jobs` or `serving`.
"""

from __future__ import annotations

__all__: list[str] = []
