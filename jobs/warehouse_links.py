"""The warehouse's link tree: symlinks to the lake files its `standings` and `histograms`
views read, so that those views name a glob, not every file of the history.

A view naming every standings and histogram file of the history in its SQL made each
nightly refresh parse, bind and store a text that grew with the history (issue 13: about
half a refresh at night 280 of `bench_nights --large`). A glob over the lake's own
directories is no answer: the batch writes its standings files in place (a query would
meet a half-written file), and a killed run's files stay until the next sweep. So the
refresh links, under `<data>/warehouse.files/`, only files a sealed version names:

- `data/<generation>/<lake path>` for each standings and histogram file of the versions
  the warehouse shows (each day's newest, and the published one), under the generation of
  its columns: `all`, or `without-<column>[+<column>...]` for files of an older release
  that lack columns added since. A glob per generation reads files of one schema, with no
  `union_by_name` (which reads every footer at every bind);
- `indexes/<version>.parquet` for each such version's standings index.

Links are relative (`../../lake/...`), so a data dir moved whole keeps them, and they
point at paths, so a file an erasure rewrites in place (temp + rename) is read as
rewritten. A link is added when a version is first shown and never removed while its
file exists (readers of the previous warehouse file may still join on it; the views join
every file with the indexes of the versions they show, so a file no shown version names
adds no row). Product code never deletes a file a manifest names; a refresh from nothing
removes links whose file is gone and re-reads every shown file's footer.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb

__all__ = ["ALL", "LinkTree", "generation", "links_dir", "missing_columns"]

#: The generation of files holding every column added since the first release.
ALL = "all"
_WITHOUT = "without-"


def links_dir(data_dir: Path) -> Path:
    return data_dir / "warehouse.files"


def generation(missing: Iterable[str]) -> str:
    """The generation (directory) name of files lacking the `missing` added columns."""
    names = sorted(missing)
    return _WITHOUT + "+".join(names) if names else ALL


def _missing(name: str) -> tuple[str, ...] | None:
    if name == ALL:
        return ()
    if name.startswith(_WITHOUT):
        return tuple(name.removeprefix(_WITHOUT).split("+"))
    return None


def _first_parquet(folder: Path) -> str | None:
    """A `*.parquet` entry of `folder` at any depth (the first met), or None."""
    for root, _dirs, files in os.walk(folder):
        for name in files:
            if name.endswith(".parquet"):
                return os.path.join(root, name)
    return None


@dataclass(frozen=True)
class LinkTree:
    """The link tree of the warehouse of `data_dir` (absolute, symlinks unresolved)."""

    data_dir: Path

    @property
    def root(self) -> Path:
        return links_dir(self.data_dir)

    def generation_dir(self, gen: str) -> Path:
        return self.root / "data" / gen

    def index_link(self, version: str) -> Path:
        return self.root / "indexes" / f"{version}.parquet"

    def index_glob(self) -> str:
        return str(self.root / "indexes" / "*.parquet")

    def generations(self, kind: str) -> list[tuple[str, tuple[str, ...]]]:
        """(generation, the added columns its files lack) of each generation holding files
        of `kind` (standings, histograms)."""
        folder = self.root / "data"
        if not folder.is_dir():
            return []
        found = []
        for name in sorted(os.listdir(folder)):
            missing = _missing(name)
            if missing is not None and _first_parquet(folder / name / kind) is not None:
                found.append((name, missing))
        return found

    def generation_names(self) -> list[str]:
        folder = self.root / "data"
        return sorted(os.listdir(folder)) if folder.is_dir() else []

    def damaged(self, versions: Iterable[str]) -> bool:
        """Whether an incremental refresh may not trust the tree: an index link of
        `versions` is missing, or the tree holds a file where a link belongs. A data dir
        copied with its links followed (`cp -rL`, `rsync -L`, `tar -h`, shutil.copytree)
        and restored to the same path keeps its warehouse's lake path, so its refresh is
        incremental; it would keep reading the copies, which an erasure (or any rewrite of
        a lake file in place) leaves as they were. Such a copy turns every link into a
        file, so a cheap look finds it: those index links and the first data entry of each
        generation (an erasure relinks every entry: `refresh_warehouse(relink=True)`)."""
        if any(not os.path.islink(self.index_link(v)) for v in versions):
            return True
        for name in self.generation_names():
            first = _first_parquet(self.generation_dir(name))
            if first is not None and not os.path.islink(first):
                return True
        return False

    def linked(self, relpath: str, names: list[str]) -> bool:
        """Whether the lake file `relpath` has a link in one of the generations `names` (a
        file there is no link: see `damaged`)."""
        root = str(self.root / "data")
        return any(os.path.islink(f"{root}/{name}/{relpath}") for name in names)

    def link_data(self, gen: str, relpath: str, *, others: Sequence[str] = ()) -> None:
        """Link the lake file `relpath` under `gen`, and remove its links under the
        generations `others` (a file rewritten with other columns since it was linked)."""
        root = str(self.root / "data")
        # <data>/warehouse.files/data/<gen>/<relpath>: 3 + relpath's folders below <data>
        self._link(f"{root}/{gen}/{relpath}", "../" * (3 + relpath.count("/")) + "lake/"
                   + relpath)
        for name in others:
            if name != gen:
                with contextlib.suppress(FileNotFoundError):  # a concurrent refresh's
                    os.unlink(f"{root}/{name}/{relpath}")

    def link_index(self, version: str, relpath: str) -> None:
        self._link(str(self.index_link(version)), "../../lake/" + relpath)

    @staticmethod
    def _link(link: str, target: str) -> None:
        """A symlink `link` -> `target` (relative), made or corrected; one system call when
        it is new (the night's files), two when it is there already."""
        try:
            os.symlink(target, link)
            return
        except FileNotFoundError:
            os.makedirs(os.path.dirname(link), exist_ok=True)
            try:
                os.symlink(target, link)
                return
            except FileExistsError:
                pass  # a concurrent refresh made it
        except FileExistsError:
            pass
        try:
            if os.readlink(link) == target:
                return
        except OSError:
            pass  # a file, not a link: the data dir was copied with its links followed
        temp = os.path.join(os.path.dirname(link), f".{uuid.uuid4().hex[:8]}.tmp")
        os.symlink(target, temp)
        os.replace(temp, link)  # atomic: a reader's glob sees the old link or the new one

    def prune(self) -> int:
        """Remove links whose file is gone, stray temp links, and anything not a link (a
        data dir copied with its links followed holds copies, which an erasure would not
        rewrite); returns how many."""
        removed = 0
        for folder, _dirs, files in os.walk(self.root):
            for name in files:
                path = os.path.join(folder, name)
                if (name.endswith(".tmp") or not os.path.islink(path)
                        or not os.path.exists(path)):
                    with contextlib.suppress(FileNotFoundError):  # a concurrent refresh's
                        os.unlink(path)
                        removed += 1
        return removed


def missing_columns(con: duckdb.DuckDBPyConnection, paths: list[str],
                    columns: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """{path: the `columns` its footer lacks} for each of `paths` (absolute)."""
    if not columns or not paths:
        return dict.fromkeys(paths, ())
    held: dict[str, set[str]] = {path: set() for path in paths}
    for file_name, name in con.execute(
            "SELECT file_name, name FROM parquet_schema(?::VARCHAR[]) "
            "WHERE list_contains(?::VARCHAR[], name)", [paths, list(columns)]).fetchall():
        held[file_name].add(name)
    return {path: tuple(c for c in columns if c not in names) for path, names in held.items()}
