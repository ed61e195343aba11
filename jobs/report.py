"""Charts from the batch view: the score distribution of one board-window as a PNG.

Usage: leaderboard report BOARD --window W --as-of D [--out FILE.png]
"""

from __future__ import annotations

from datetime import date
from pathlib import Path

from leaderboard.batch_view import BatchView
from leaderboard.manifest import read_current, version_as_of

__all__ = ["ReportError", "score_distribution_png"]


class ReportError(RuntimeError):
    """Nothing to chart: no such version, board or window."""


def score_distribution_png(lake: Path, board: str, window_id: str, as_of: date | None,
                           out: Path) -> Path:
    """Draw the equal-width histogram (players per score bucket), with percentile marks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    manifest = version_as_of(lake, as_of) if as_of else read_current(lake)
    if manifest is None:
        raise ReportError(f"no batch version as of {as_of or 'now'}; run `leaderboard batch "
                          f"--as-of {as_of or 'YYYY-MM-DD'}` first")
    view = BatchView(lake, manifest)
    histogram = view.histogram(board, window_id)
    if histogram is None:
        known = ", ".join(w for b, w in view.windows(board)[-5:])
        raise ReportError(f"version {manifest.version} has no {board} {window_id}; "
                          f"recent windows of {board}: {known or 'none'}")
    rows = histogram.to_pylist()
    width = [r for r in rows if r["kind"] == "width"]
    depth = [r for r in rows if r["kind"] == "depth"]
    figure, axis = plt.subplots(figsize=(9, 4.5), dpi=110)
    if width:
        axis.bar([r["lower"] for r in width], [r["players"] for r in width],
                 width=[r["upper"] - r["lower"] for r in width], align="edge",
                 color="#3b7dd8", edgecolor="white")
        for share, style in ((50, ":"), (90, "--"), (99, "-.")):
            bucket = next((r for r in depth if r["bucket"] == 100 - share - 1), None)
            if bucket is not None:
                axis.axvline(bucket["lower"], color="#d8573b", linestyle=style,
                             label=f"top {100 - share}% from {bucket['lower']:g}")
        axis.legend(loc="upper right")
    else:
        axis.text(0.5, 0.5, "no players in this window", ha="center", va="center",
                  transform=axis.transAxes)
    total = sum(r["players"] for r in width)
    axis.set_title(f"{board} {window_id}: score distribution of {total:,} players "
                   f"(as of {manifest.as_of})")
    axis.set_xlabel("score")
    axis.set_ylabel("players")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out)
    plt.close(figure)
    return out
