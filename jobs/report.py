"""Charts from the batch view: the score distribution of one board-window as a PNG.

Usage: leaderboard report BOARD --window W --as-of D [--out FILE.png]

The cut-offs marked are the percentiles route's (`leaderboard.percentile`): the score that
makes the top x% is the one at rank ceil(x/100 * players) of the version's standings, best
first on either order. A heavy tail (`heavy_tail`, the console's rule) gets a logarithmic
score axis with buckets of equal width on it, and a logarithmic count axis.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from leaderboard.batch_view import BatchView
from leaderboard.manifest import Manifest, read_current, version_as_of
from leaderboard.percentile import heavy_tail, position_for, scores_at
from leaderboard.registry import Board

__all__ = ["MARKS", "Chart", "ReportError", "score_distribution_png"]

#: The top percents marked on the chart, with their line styles.
MARKS = ((1, "-."), (10, "--"), (50, ":"))
#: Buckets of the log-axis histogram (equal width in log(score + 1)).
_LOG_BUCKETS = 40


class ReportError(RuntimeError):
    """Nothing to chart: no such version, board or window."""


@dataclass(frozen=True)
class Chart:
    """A chart written: where, how many players, the cut-off labels drawn (as they read on
    the chart), and whether the score axis is logarithmic."""

    path: Path
    players: int
    marks: list[str]
    log_scale: bool


def score_distribution_png(lake: Path, board: Board, window_id: str, as_of: date | None,
                           out: Path) -> Chart:
    """Draw the window's histogram (players per score bucket) with the top 1%, 10% and 50%
    cut-offs, from the batch version as of `as_of` (the live one if None)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    manifest, view = _version(lake, as_of)
    standings = view.standings(board.name, window_id)
    if standings is None:
        known = ", ".join(w for b, w in view.windows(board.name)[-5:])
        raise ReportError(f"version {manifest.version} has no {board.name} {window_id}; "
                          f"recent windows of {board.name}: {known or 'none'}")
    ordered = np.asarray(standings.column("score").to_numpy(zero_copy_only=False), np.int64)
    figure, axis = plt.subplots(figsize=(9, 4.5), dpi=110)
    log_scale = False
    if len(ordered):
        scores = ordered.tolist()
        cutoffs = scores_at(scores, [Decimal(top) for top, _ in MARKS])
        # The console's inputs: the cut-offs of the top 1%, 2%, ..., 100%.
        every = scores_at(scores, [Decimal(top) for top in range(1, 101)])
        log_scale = heavy_tail(min(every), max(every), median=every[49])
        if log_scale:
            _log_histogram(axis, ordered)
        else:
            _batch_histogram(axis, view, board.name, window_id)
        for (top, style), score in zip(MARKS, cutoffs, strict=True):
            rank = position_for(Decimal(top), len(ordered))
            better = "or less" if board.order == "asc" else "or more"
            axis.axvline(score, color="#d8573b", linestyle=style,
                         label=f"top {top}%: {score:,} {better} (rank {rank:,})")
        axis.legend(loc="upper right")
    else:
        axis.text(0.5, 0.5, "no players in this window", ha="center", va="center",
                  transform=axis.transAxes)
    axis.set_title(f"{board.name} {window_id}: score distribution of {len(ordered):,} players "
                   f"(as of {manifest.as_of})")
    axis.set_xlabel("score (log axis: heavy tail)" if log_scale else "score")
    axis.set_ylabel("players (log axis)" if log_scale else "players")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out)
    legend = axis.get_legend()
    marks = [] if legend is None else [text.get_text() for text in legend.get_texts()]
    plt.close(figure)
    return Chart(out, len(ordered), marks, log_scale)


def _version(lake: Path, as_of: date | None) -> tuple[Manifest, BatchView]:
    manifest = version_as_of(lake, as_of) if as_of else read_current(lake)
    if manifest is None:
        raise ReportError(f"no batch version as of {as_of or 'now'}; run `leaderboard batch "
                          f"--as-of {as_of or 'YYYY-MM-DD'}` first")
    return manifest, BatchView(lake, manifest)


def _batch_histogram(axis: Any, view: BatchView, board: str, window_id: str) -> None:
    """The batch's equal-width buckets, as the console draws them."""
    table = view.histogram(board, window_id)
    width = [] if table is None else [r for r in table.to_pylist() if r["kind"] == "width"]
    axis.bar([r["lower"] for r in width], [r["players"] for r in width],
             width=[r["upper"] - r["lower"] for r in width], align="edge",
             color="#3b7dd8", edgecolor="white")


def _log_histogram(axis: Any, scores: npt.NDArray[np.int64]) -> None:
    """Buckets of equal width in log(score + 1) (no score is negative here, and scores are
    whole: edges are too), drawn on a log(score + 1) axis, the console's, and a log count
    axis: a tail of a few players orders of magnitude past the median stays visible next to
    the crowd."""
    from matplotlib.ticker import FixedLocator, FuncFormatter

    lo, hi = int(scores.min()), int(scores.max())
    edges = np.unique(np.round(np.geomspace(lo + 1, hi + 2, _LOG_BUCKETS + 1)) - 1)
    counts, edges = np.histogram(scores, bins=edges)
    axis.bar(edges[:-1], counts, width=np.diff(edges), align="edge", color="#3b7dd8",
             edgecolor="white", linewidth=0.5)
    axis.set_xscale("function", functions=(_log1p10, _expm1_10))
    axis.set_xlim(edges[0], edges[-1])
    axis.xaxis.set_major_locator(FixedLocator(
        [lo, *(10**k for k in range(1, len(str(hi))) if lo < 10**k < hi), hi]))
    axis.set_yscale("log")
    plain = FuncFormatter(lambda value, _: f"{value:,.0f}")
    axis.xaxis.set_major_formatter(plain)
    axis.yaxis.set_major_formatter(plain)


def _log1p10(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """log10(score + 1), the score axis of a heavy tail (0 where a margin falls below 0)."""
    axis: npt.NDArray[np.float64] = np.log10(np.maximum(values, 0) + 1)
    return axis


def _expm1_10(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    scores: npt.NDArray[np.float64] = np.power(10.0, values) - 1
    return scores
