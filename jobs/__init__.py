"""The batch layer: recomputes authoritative standings from the immutable master dataset.

Rollups, standings, ranks, percentiles and histograms on DuckDB (default) or Spark, the
atomic publish of a batch version, and the analysts' DuckDB warehouse. Imports only the
core (`leaderboard`), never `speed_layer` or `serving`.
"""

from __future__ import annotations

__all__: list[str] = []
