"""A data dir's binding to its board registry (leaderboard.binding)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from leaderboard.binding import RegistryBindingError, bind_registry, bound_registry
from leaderboard.registry import load_registry


def test_first_use_binds_and_the_same_registry_passes(tmp_path: Path) -> None:
    lake = tmp_path / "data" / "lake"
    default = load_registry()
    assert bound_registry(lake) is None
    bind_registry(lake, default)
    record = bound_registry(lake)
    assert record is not None
    assert (record["fingerprint"], record["source"]) == (default.fingerprint, default.source)
    bind_registry(lake, load_registry())  # the same registry again: nothing to say


def test_another_registry_is_refused_naming_both_and_the_way_out(tmp_path: Path) -> None:
    lake = tmp_path / "data" / "lake"
    bind_registry(lake, load_registry())
    before = (lake / "registry.json").read_bytes()
    football = load_registry("football")
    with pytest.raises(RegistryBindingError) as caught:
        bind_registry(lake, football)
    message = str(caught.value)
    assert "shipped registry 'default'" in message
    assert "shipped registry 'football'" in message
    assert "another data dir" in message
    assert "--data" in message
    assert "lake rebind" in message
    assert (lake / "registry.json").read_bytes() == before


def test_rebind_moves_the_binding(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    bind_registry(lake, load_registry())
    bind_registry(lake, load_registry("football"), rebind=True)
    bind_registry(lake, load_registry("football"))
    with pytest.raises(RegistryBindingError):
        bind_registry(lake, load_registry())


def test_a_broken_binding_says_how_to_repair_it(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    lake.mkdir()
    (lake / "registry.json").write_text(json.dumps({"source": "x"}))
    with pytest.raises(RegistryBindingError, match="lake rebind"):
        bind_registry(lake, load_registry())
