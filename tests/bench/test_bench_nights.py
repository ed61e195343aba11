"""bench/bench_nights.py's cache of generated lakes is keyed by the registry.

A lake generated under another registry (say, before the default gained the direct
`best-lap` board) has no rows for the boards it lacked; reusing it, the benchmark's nights
and its full recompute would silently leave those boards out (bench_batch had this defect
first; both now key a season by `app.season.season_key`).
"""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

from app.generate import GenerateSpec
from bench.bench_nights import _pinned, _season
from leaderboard.registry import load_registry
from leaderboard.settings import Settings


def test_a_cached_lake_is_reused_only_under_the_registry_it_was_generated_with(
        tmp_path: Path) -> None:
    spec = GenerateSpec(players=40, days=1, events_per_day=40, start=date(2026, 1, 1))
    default, football = load_registry("default"), load_registry("football")
    said: list[str] = []
    first = _season(spec, default, tmp_path, said.append)
    again = _season(spec, default, tmp_path, said.append)
    other = _season(spec, football, tmp_path, said.append)
    assert first == again  # reused: generated once
    assert other != first  # another registry: a lake of its own
    assert len(said) == 2
    assert json.loads((first / "complete.json").read_text())["registry"] == default.fingerprint
    assert json.loads((other / "complete.json").read_text())["registry"] == football.fingerprint


def test_a_run_keeps_the_registry_it_began_with(tmp_path: Path) -> None:
    """Every night and the final full recompute use the registry read at the start, never
    the file again: the old --large run crashed in its last step, an hour in, loading a
    registry file a rebase of the tree had changed meanwhile."""
    registry = load_registry("football")
    settings = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path),
                                  "LEADERBOARD_CONFIG": str(tmp_path / "gone.toml")})
    assert _pinned(settings, registry).registry is registry
