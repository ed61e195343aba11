"""Which raw events retention left whole: the line both the batch and the speed layer draw.

Retention deletes whole ingest partitions through `deleted_through` (its ledger,
`lake/retention.json`). An event lands on or after its event date less the registry's
`future_skew` (validation refuses one further ahead), so every raw event of an event date
after `deleted_through + ceil(future_skew) + 1 day` (the extra day: a margin) is still in
the lake. A void of a result on such a date can be applied exactly from the raw events (the
batch's void night, jobs.revoid; the speed layer's recompute of the player's base part); a
void of a result on an earlier date cannot (its raw rows may be gone): the published rows
stand, and both layers say so. One function, so the two layers never draw different lines.

A date after the line is still recomputed only if its raw events give back what the base
counted for it (`redoable`): a result landed twice with different event times whose first
copy was in a deleted partition makes the kept copy count on its own date now. Both layers
decide per date over every player, as the batch rewrites a date's rollups whole.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from leaderboard.registry import Registry

__all__ = ["RETENTION_LEDGER", "Tally", "deleted_through", "kept_after", "line_after",
           "redoable"]

#: (events, points) of one event date over every player.
Tally = tuple[int, int]

#: The ledger of deleted raw partitions, under the lake dir (written by jobs.retention).
RETENTION_LEDGER = "retention.json"


def deleted_through(lake: Path) -> date | None:
    """The newest raw-event partition retention deleted (None: never)."""
    try:
        ledger = json.loads((Path(lake) / RETENTION_LEDGER).read_text())
    except FileNotFoundError:
        return None
    return date.fromisoformat(ledger["deleted_through"])


def kept_after(lake: Path, registry: Registry) -> date | None:
    """The safe line: the last event date whose raw events may be partly deleted (None:
    nothing deleted); every later event date still has all its raw events in the lake."""
    through = deleted_through(lake)
    return None if through is None else line_after(through, registry)


def line_after(through: date, registry: Registry) -> date:
    """The safe line once raw partitions through `through` are deleted (`kept_after`)."""
    skew_days = math.ceil(registry.future_skew / timedelta(days=1))
    return through + timedelta(days=skew_days + 1)


def redoable(days: Iterable[date], raw: Mapping[date, Tally],
             base: Mapping[str, Mapping[str, Any]]) -> list[date]:
    """The event dates of `days` (after the safe line) a void may recompute from raw
    events: those whose kept raw events, deduped and counted with the base's voids (`raw`,
    over every player), give back the base's totals of the date (`base`:
    `Manifest.rollups`). Any other date lost a raw event or gained one (a duplicate whose
    first copy retention deleted): the base's rows of it stand for every player. The batch
    (jobs.batch `_redo`) and the speed layer (`SpeedLayer._seed`, the void's answer) both
    ask this, per date over all players, so a result one removes the other never brings
    back."""
    found = []
    for day in sorted(set(days)):
        entry = base.get(day.isoformat(), {})
        if raw.get(day, (0, 0)) == (int(entry.get("events", 0)), int(entry.get("points", 0))):
            found.append(day)
    return found
