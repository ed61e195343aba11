"""Reading the published batch view: the standings and histograms of one version.

Standings files hold many windows of one board and kind, ordered by (window_id, rank,
player_id); a window is read by filtering on window_id (row groups pruned by statistics).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from leaderboard.manifest import Manifest, ManifestError, read_current

__all__ = ["BatchView", "open_current"]


class BatchView:
    """One published version: its index, and its standings and histograms on demand."""

    def __init__(self, lake: Path, manifest: Manifest) -> None:
        self.lake = Path(lake)
        self.manifest = manifest
        index = manifest.standings(self.lake)
        self._entries: dict[tuple[str, str], dict[str, object]] = {
            (row["board"], row["window_id"]): row for row in index.to_pylist()
        }

    @property
    def as_of(self) -> str:
        return self.manifest.as_of

    def windows(self, board: str | None = None) -> list[tuple[str, str]]:
        return sorted(k for k in self._entries if board is None or k[0] == board)

    def entry(self, board: str, window_id: str) -> dict[str, object] | None:
        return self._entries.get((board, window_id))

    def _read(self, column: str, board: str, window_id: str) -> pa.Table | None:
        entry = self.entry(board, window_id)
        if entry is None:
            return None
        path = self.lake / str(entry[column])
        try:
            table = pq.read_table(path, filters=[("window_id", "=", window_id)])
        except FileNotFoundError:
            raise ManifestError(f"{path} named by version {self.manifest.version} is missing; "
                                "republish with `leaderboard batch --full`") from None
        return table.drop_columns(["window_id"])

    def standings(self, board: str, window_id: str) -> pa.Table | None:
        """The window's standings ordered by rank, player_id (None: not in this version)."""
        table = self._read("path", board, window_id)
        if table is None:
            return None
        expected = int(self.entry(board, window_id)["rows"])  # type: ignore[index, arg-type]
        if table.num_rows != expected:
            raise ManifestError(f"{board} {window_id}: {table.num_rows} rows on disk, the index "
                                f"of version {self.manifest.version} says {expected}")
        return table

    def histogram(self, board: str, window_id: str) -> pa.Table | None:
        table = self._read("histogram", board, window_id)
        if table is None:
            return None
        return table.sort_by([("kind", "ascending"), ("bucket", "ascending")])

    def player(self, board: str, window_id: str, player_id: str) -> dict[str, object] | None:
        table = self.standings(board, window_id)
        if table is None:
            return None
        found = table.filter(pc.equal(table.column("player_id"), player_id))
        return found.to_pylist()[0] if found.num_rows else None


def open_current(lake: Path) -> BatchView | None:
    """The live version's view, or None before the first publish."""
    manifest = read_current(lake)
    return None if manifest is None else BatchView(lake, manifest)
