"""The fault seam: checkpoints are no-ops until a test installs a hook at their name."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from leaderboard import faults


def test_a_checkpoint_without_a_hook_does_nothing():
    faults.checkpoint("fold.after_script")
    assert not faults.active()


def test_an_injected_hook_runs_at_its_name_only_and_is_removed_after():
    with faults.injected("fold.after_script", faults.fail):
        assert faults.active()
        faults.checkpoint("fold.before_progress")
        with pytest.raises(faults.InjectedFault, match=r"fold\.after_script"):
            faults.checkpoint("fold.after_script")
    faults.checkpoint("fold.after_script")
    assert not faults.active()


def test_on_hit_fires_on_the_nth_hit_only():
    hits: list[str] = []
    with faults.injected("x", faults.on_hit(2, hits.append)):
        for _ in range(4):
            faults.checkpoint("x")
    assert hits == ["x"]


def test_the_environment_spec_installs_hooks_in_a_child_process():
    code = ("from leaderboard import faults\n"
            "faults.checkpoint('a')\nprint('after a', flush=True)\n"
            "faults.checkpoint('b')\nfaults.checkpoint('b')\nprint('not reached')\n")
    env = dict(os.environ, LEADERBOARD_FAULTS="b=kill@2, c=raise")
    child = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=60)
    assert child.returncode == -9
    assert child.stdout == "after a\n"


@pytest.mark.parametrize("spec", ["b", "b=explode", "b=kill@x", "=kill"])
def test_a_malformed_spec_says_what_is_expected(spec):
    with pytest.raises(ValueError, match=r"name=raise\|kill"):
        faults.parse(spec)
