"""The core of the leaderboard pipeline: contracts shared by every layer.

Event schema and validation, the board/window registry and calendar, the sort-key codec,
the lake layout and landing writer, and settings. Imports no layer (jobs, speed_layer,
serving, app never appear here).
"""

from __future__ import annotations

__all__: list[str] = []
