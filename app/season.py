"""A generated season pushed through the real landing path: validate, land, quarantine.

`app.generate` simulates the season (pure, seeded); this module runs it the way the game's
servers would feed the lake, as three threaded stages (generate | validate | land) whose
files and seqs are exactly those of a sequential run, and reports what landed.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from app.generate import GenerateSpec, generate_scores, simulate, total_rows
from leaderboard.lake import LandingWriter
from leaderboard.read_ahead import read_ahead
from leaderboard.registry import Registry
from leaderboard.validation import Validated, validate_events, validate_scores

__all__ = ["GenerateReport", "generate_season", "season_key"]


@dataclass
class GenerateReport:
    """Counts of one generated season, for the CLI summary and the tests."""

    events: int  # clean events generated (before dirt)
    rows: int  # total raw rows offered to the landing path (events + dirt)
    accepted: int
    rejected: int
    duplicates_in_batch: int
    duplicates: int  # dirty re-deliveries injected (retries/duplicates)
    late: int  # late events injected
    malformed: int  # malformed rows injected
    files: int
    quarantine_files: int
    seconds: float
    reasons: dict[str, int]
    #: Busy seconds per stage (generate, validate, land); they overlap, so may sum past `seconds`.
    stage_seconds: dict[str, float] = field(default_factory=dict)
    #: Scores landed on direct boards (app.generate.generate_scores), apart from the events.
    scores: int = 0

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else float("inf")


def season_key(spec: GenerateSpec, registry: Registry) -> str:
    """The cache key of a generated season (the benchmarks keep one per key): its shape and
    the registry it was generated with (a season cached before the registry gained a board,
    such as the default's direct `best-lap`, has no rows for it, and every comparison on it
    would silently leave the board out)."""
    return (f"p{spec.players}-e{spec.events_per_day * spec.days}-d{spec.days}-"
            f"dirty{spec.dirty:g}-s{spec.seed}-b{spec.batch_minutes}-{spec.start.isoformat()}-"
            f"r{registry.fingerprint[:8]}")


# -- threaded stages ---------------------------------------------------------------------------

_T = TypeVar("_T")


def _in_thread(items: Iterator[_T], name: str, depth: int = 3) -> Generator[_T, None, None]:
    """Run an iterator in its own thread, up to `depth` items ahead of the consumer
    (leaderboard.read_ahead): numpy, Arrow compute and the Parquet writer release the GIL in
    their kernels, so chaining stages this way (generate | validate | land) keeps both cores
    busy. Order and content are unchanged; an error in the thread is raised in the consumer."""
    return read_ahead(items, name=name, depth=depth).items


def _timed(items: Iterator[_T], busy: dict[str, float],
           stage: str) -> Generator[_T, None, None]:
    """Pass items through, adding the time spent producing each to busy[stage]."""
    while True:
        began = time.perf_counter()
        try:
            item = next(items)
        except StopIteration:
            return
        finally:
            busy[stage] += time.perf_counter() - began
        yield item


def generate_season(spec: GenerateSpec, registry: Registry, lake: Path, *,
                    progress: Callable[[int, int], None] | None = None) -> GenerateReport:
    """Generate a season and push it through the real landing path: validate, land, quarantine.

    Each micro-batch is validated at its landing time (so late and future rows are judged as
    they would be live) and lands as one file per writer; rejected rows go to the quarantine.
    Generating, validating and landing run as three threaded stages; the files and their seqs
    are exactly those of a sequential run. `progress(rows_done, rows_total)` follows each batch.
    """
    batches, injected = simulate(spec, registry)
    events = spec.days * spec.events_per_day
    total = total_rows(spec)
    busy = {"generate": 0.0, "validate": 0.0, "land": 0.0}
    source = f"generate:{spec.writer}"

    def validated() -> Generator[tuple[datetime, int, Validated], None, None]:
        raw = _in_thread(_timed(batches, busy, "generate"), "generate")
        with contextlib.closing(raw):
            for landing_time, batch in raw:
                began = time.perf_counter()
                result = validate_events(batch, registry, now=landing_time,
                                         ingested_at=landing_time, source=source)
                busy["validate"] += time.perf_counter() - began
                yield landing_time, batch.num_rows, result

    reasons: Counter[str] = Counter()
    accepted = rejected = in_batch = files = quarantine_files = done = scores = 0
    started = time.perf_counter()
    stages = _in_thread(validated(), "validate")
    # Direct boards' scores land in the same landing order (small: validated here).
    pending = list(generate_scores(spec, registry))
    pending.reverse()

    def land_scores(writer: LandingWriter, until: datetime | None) -> tuple[int, int]:
        """Land the scores due by `until` (None: all); (files, quarantine files)."""
        landed = kept = 0
        nonlocal scores
        while pending and (until is None or pending[-1][0] <= until):
            at, board, batch = pending.pop()
            checked = validate_scores(batch, registry, board, now=at, source=source)
            landed += len(writer.land(checked.accepted, at))
            kept += len(writer.quarantine(checked.rejected, at))
            scores += checked.accepted.num_rows
        return landed, kept

    # Closing the stages stops and joins their threads, also when landing fails midway.
    with LandingWriter(lake, spec.writer) as writer, contextlib.closing(stages):
        for landing_time, rows, result in stages:
            began = time.perf_counter()
            landed, kept = land_scores(writer, landing_time)
            files += landed
            quarantine_files += kept
            files += len(writer.land(result.accepted, landing_time))
            quarantine_files += len(writer.quarantine(result.rejected, landing_time))
            busy["land"] += time.perf_counter() - began
            accepted += result.accepted.num_rows
            rejected += result.rejected.num_rows
            in_batch += result.duplicates
            if result.rejected.num_rows:
                reasons.update(result.reason_counts())
            done += rows
            if progress is not None:
                progress(done, total)
        landed, kept = land_scores(writer, None)
        files += landed
        quarantine_files += kept
    return GenerateReport(
        events=events, rows=done, accepted=accepted, rejected=rejected,
        duplicates_in_batch=in_batch, duplicates=injected.duplicates, late=injected.late,
        malformed=injected.malformed, files=files, quarantine_files=quarantine_files,
        seconds=time.perf_counter() - started, reasons=dict(sorted(reasons.items())),
        stage_seconds=busy, scores=scores,
    )
