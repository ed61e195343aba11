"""The repository stands alone: a clone with nothing beside it has every file it cites.

Regression: tests read the football results from `../shared/data` and code cited "DESIGN.md
section N", a file outside the repository, so a fresh clone failed its tests and left its
references dangling.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT = (".py", ".md", ".toml", ".cfg", ".sh", ".txt", ".sql")

__all__: list[str] = []


def tracked_text_files() -> list[Path]:
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    files = [ROOT / name for name in listed if name.endswith(TEXT) or name == "Makefile"]
    return [path for path in files if path.exists()]


def test_nothing_reaches_outside_the_repository():
    outside = re.compile(r"\.\./shared|[\"']shared[\"']\s*/|/work/")
    bad = []
    for path in tracked_text_files():
        if path.name == "test_repository.py":
            continue
        depth = len(path.relative_to(ROOT).parts) - 1  # parents[depth] is the repository
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            above = [int(k) for k in re.findall(r"__file__\)(?:\.resolve\(\))?\.parents\[(\d+)\]",
                                                line)]
            if outside.search(line) or any(k > depth for k in above):
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert bad == []


def test_every_design_reference_resolves_in_docs():
    design = (ROOT / "docs/design.md").read_text(encoding="utf-8")
    sections = set(re.findall(r"^## (\d+)\. ", design, re.MULTILINE))
    invariants = len(re.findall(r"^\d+\. \*\*", design.split("## 7.")[1].split("## 8.")[0],
                                re.MULTILINE))
    cited: list[tuple[str, str]] = []
    for path in tracked_text_files():
        if path.name == "test_repository.py":
            continue
        text = path.read_text(encoding="utf-8").replace("\n", " ")
        assert "DESIGN.md" not in text, f"{path.relative_to(ROOT)} cites DESIGN.md"
        for ref in re.findall(r"design\.md\s+section\s+(\d+(?:\.\d+)?)", text):
            cited.append((str(path.relative_to(ROOT)), ref))
    assert cited, "no code cites docs/design.md any more: is this test still needed?"
    for where, ref in cited:
        major, _, minor = ref.partition(".")
        assert major in sections, f"{where} cites section {ref}, which docs/design.md lacks"
        if major == "7" and minor:
            assert 1 <= int(minor) <= invariants, f"{where} cites invariant {ref}"


def test_the_football_data_set_ships_with_its_licence():
    folder = ROOT / "datasets/football"
    header = (folder / "international_results.csv").open(encoding="utf-8").readline()
    assert header.strip() == ("date,home_team,away_team,home_score,away_score,tournament,city,"
                              "country,neutral")
    note = (folder / "README.md").read_text(encoding="utf-8")
    assert "CC0" in note
    assert "martj42/international_results" in note


def test_the_dag_test_target_migrates_a_local_metadata_db_first():
    """Regression: `airflow dags test nightly_standings DATE` failed with "Database migration
    required" on a fresh clone; `make dag-test` migrates `.airflow/` (git-ignored) first."""
    try:
        # -B: as on a fresh clone (nothing made yet); -o: without installing the venv.
        plan = subprocess.run(["make", "-n", "-B", "-o", ".venv/.installed", "dag-test",
                               "DATE=2026-12-02"],
                              cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"make is not usable here: {exc}")
    lines = plan.splitlines()
    migrate = next(i for i, line in enumerate(lines) if "airflow db migrate" in line)
    run = next(i for i, line in enumerate(lines)
               if "airflow dags test nightly_standings 2026-12-02" in line)
    assert migrate < run
    assert f"AIRFLOW_HOME={ROOT}/.airflow" in lines[run]
    ignored = subprocess.run(["git", "check-ignore", "-q", ".airflow/airflow.db"], cwd=ROOT)
    assert ignored.returncode == 0
