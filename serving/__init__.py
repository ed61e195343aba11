"""The serving layer: answers queries by merging the batch view with the speed state.

Score, rank, around, top-N (with its cache), percentiles, friends, history and histograms;
no HTTP and no ingest. Imports only the core (`leaderboard`), never `jobs`, `speed_layer`
or pyspark.
"""

from __future__ import annotations

__all__: list[str] = []
