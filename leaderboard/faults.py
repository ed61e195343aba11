"""Named fault checkpoints: the one seam through which tests inject crashes and errors.

The code calls `checkpoint("fold.after_script")` at the points where a crash or an error
matters; that is a dict lookup and nothing else unless a hook is installed for the name. A
test installs a hook (in process with `injected(...)` / `install(...)`, or in a child
process through the `LEADERBOARD_FAULTS` environment variable, read when this module is
first imported) that raises `InjectedFault` or kills the process with SIGKILL. Checkpoint
names are part of the test contract: rename one only together with its tests; log lines
are free to change.

Checkpoints (where a hook runs, and what is durable at that moment):

- `ingest.after_claim`: the door has claimed the batch's ids; nothing landed yet (a raise
  releases the claims of rows not landed; a kill leaves them in flight: the writer's next
  claim releases them, or another writer's claim of the same ids does once the dead writer's
  landing lock is free).
- `ingest.after_land`: the batch's files are landed (durable); nothing folded yet.
- `fold.after_script`: one board-window's fold script of a file has run. While any hook is
  installed the fold sends its calls one at a time, so a fault here leaves the file folded
  into some board-windows and not others.
- `fold.before_progress`: every board-window of a file is folded; the version's progress
  mark does not record the file yet.
- `rebase.after_catch_up`: the new version's state caught up with the lake; `current` still
  names the old version (files landing now are folded into the old version only).
- `rebase.after_flip`: `current` names the new version; the old one is not yet set to expire.
- `rebuild.after_reset`: a rebuild cleared the version's keys and synced the bans; nothing
  folded yet and no pointer written (the state still counts as lost).
- `batch.rollups`: the rollups are computed, not yet written (hit once per run).
- `batch.standings`: the standings files are written; no manifest yet.
- `batch.checks`: the version is about to be checked (its files written, no manifest yet).
- `batch.manifest`: the version's manifest is written; `current.json` not swapped yet.
- `compact.record`, `compact.written`, `compact.verified`, `compact.deleted`: the four
  durable steps of one compaction (record written, new file written, new file verified,
  originals deleted).

`LEADERBOARD_FAULTS` holds `name=action[@n]` items separated by commas: action `raise` or
`kill`; `@n` fires only on the n-th hit of that name in the process (1-based), else every
hit. Example: `LEADERBOARD_FAULTS="batch.standings=kill"`.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = [
    "ENV",
    "InjectedFault",
    "active",
    "checkpoint",
    "clear",
    "fail",
    "injected",
    "install",
    "kill",
    "on_hit",
]

ENV = "LEADERBOARD_FAULTS"

Hook = Callable[[str], None]

_hooks: dict[str, Hook] = {}


class InjectedFault(RuntimeError):
    """Raised by a `fail` hook: a fault a test injected at a named checkpoint."""


def checkpoint(name: str) -> None:
    """Run the hook installed for `name`, if any (a no-op in production)."""
    if _hooks:
        hook = _hooks.get(name)
        if hook is not None:
            hook(name)


def active() -> bool:
    """Whether any hook is installed (code may then take its slower, step-by-step path so
    every checkpoint is reachable)."""
    return bool(_hooks)


def fail(name: str) -> None:
    """A hook: raise `InjectedFault` at the checkpoint."""
    raise InjectedFault(f"fault injected at checkpoint {name} (test hook)")


def kill(_name: str) -> None:
    """A hook: stop the process the hard way (SIGKILL), as a crash or an OOM kill would."""
    os.kill(os.getpid(), signal.SIGKILL)


def on_hit(n: int, hook: Hook) -> Hook:
    """A hook that runs `hook` on the n-th hit only (1-based) and lets every other pass."""
    if n < 1:
        raise ValueError(f"hit number {n} must be 1 or more")
    hits = 0

    def nth(name: str) -> None:
        nonlocal hits
        hits += 1
        if hits == n:
            hook(name)

    return nth


def install(name: str, hook: Hook) -> None:
    """Install `hook` at checkpoint `name` (replacing any hook there)."""
    _hooks[name] = hook


def clear(name: str | None = None) -> None:
    """Remove the hook at `name`, or every hook."""
    if name is None:
        _hooks.clear()
    else:
        _hooks.pop(name, None)


@contextmanager
def injected(name: str, hook: Hook) -> Iterator[None]:
    """`hook` installed at `name` for the block (the previous hook restored after)."""
    previous = _hooks.get(name)
    install(name, hook)
    try:
        yield
    finally:
        if previous is None:
            clear(name)
        else:
            install(name, previous)


def parse(spec: str) -> dict[str, Hook]:
    """Hooks from a `LEADERBOARD_FAULTS` value; a malformed item raises ValueError."""
    actions: dict[str, Hook] = {"raise": fail, "kill": kill}
    found: dict[str, Hook] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, action = item.partition("=")
        action, at, hit = action.partition("@")
        if not sep or not name or action not in actions or (at and not hit.isdigit()):
            raise ValueError(f"{ENV} item {item!r} is not name=raise|kill[@n]; e.g. "
                             "fold.after_script=kill@3")
        hook = actions[action]
        found[name.strip()] = on_hit(int(hit), hook) if at else hook
    return found


_hooks.update(parse(os.environ.get(ENV, "")))
