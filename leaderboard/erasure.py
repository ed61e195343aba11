"""The erasure ledger: which player ids were erased, kept only as salted hashes.

After an erasure (GDPR right to erasure) no byte of the player's id may remain under the
data dir, yet a later event of that id must be refused (reason `erased`). So the ledger
(`lake/erasure/ledger.json`) keeps `sha256(salt + id)` and the time, never the id; the salt
(`lake/erasure/salt`, 32 random bytes, written once) stays in the data dir, so the hash
cannot be looked up in a table of hashed ids computed elsewhere. A quarantined event of an
erased id carries the hash in place of the id.

`without_player` rewrites one Parquet file without a player's rows, atomically (temp file +
fsync + rename), which every part of an erasure uses.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from leaderboard.lake import atomic_write_bytes, atomic_write_parquet
from leaderboard.timeutil import format_instant

__all__ = ["ERASED_PREFIX", "REDACTED", "ErasureLedger", "ErasureRunning", "RewriteFailed",
           "erasure_barrier", "erasure_dir", "holds_player", "record_erasure", "redact_erased",
           "rewriting", "without_player"]

#: What a quarantined row of an erased id holds in place of the id: this and the hash.
ERASED_PREFIX = "erased:"


def erasure_dir(lake: Path) -> Path:
    return lake / "erasure"


class ErasureRunning(Exception):
    """The erasure barrier stayed held for longer than a caller would wait (`erasure_barrier`
    with `wait`): an erasure is running."""


class RewriteFailed(Exception):
    """Writing a file back without the player failed (a full disk, a permission, an I/O
    error). The write is atomic, so the file is whole as it was: once the cause is fixed,
    running the erasure again finishes it. Unlike a file that cannot be read, no backup
    is needed."""

    def __init__(self, path: Path, cause: OSError) -> None:
        super().__init__(f"{path} could not be written: {cause.strerror or cause}")
        self.path = path
        self.cause = cause


@contextmanager
def rewriting(path: Path) -> Iterator[None]:
    """The block writes `path` (or deletes it): an OSError there is `RewriteFailed`, told
    apart from one reading a file."""
    try:
        yield
    except OSError as exc:
        raise RewriteFailed(path, exc) from exc


@contextmanager
def erasure_barrier(lake: Path, *, exclusive: bool, create: bool = True,
                    wait: float | None = None) -> Iterator[None]:
    """Hold the lake's erasure barrier for the block: exclusive for an erasure, shared for
    a job that reads and rewrites the files an erasure rewrites (a batch run, a
    compaction). Without it two erasures read a file, each wrote it back without its own
    player only (one removal lost, or a reader met a file mid-replace), and a batch that
    read the events before an erasure published the id again after it. Blocks until
    free.

    A shared holder creates nothing where there is nothing to guard: no lake (a mistyped
    data dir), or, with `create=False` (a dry run, which writes nothing), no barrier file
    yet or a read-only lake (a mounted backup); the lock is then not held. The file is
    locked only once it is the one at the path (a `demo --fresh` that removed the lake
    meanwhile would otherwise leave this holder locking a file no erasure opens).

    `wait`: give up after that many seconds with ErasureRunning (a request of the game's,
    which must not hold a server thread for a whole erasure); None waits as long as it
    takes."""
    path = erasure_dir(lake) / "barrier.lock"
    if not exclusive and not lake.is_dir():
        yield
        return
    handle: IO[bytes]
    while True:
        if exclusive or create:
            path.parent.mkdir(parents=exclusive, exist_ok=True)
            handle = open(path, "ab")  # noqa: SIM115 - held for the whole block
        elif not path.exists():
            yield  # a dry run where no erasure ever ran: nothing to guard, nothing made
            return
        else:
            try:
                handle = open(path, "ab")  # noqa: SIM115 - held for the whole block
            except OSError:  # a read-only lake (a mounted backup): a read handle locks too
                handle = open(path, "rb")  # noqa: SIM115
        try:
            _lock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, wait)
        except ErasureRunning:
            handle.close()
            raise
        try:
            if os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        handle.close()  # removed or replaced between the open and the lock: lock the new one
    with handle:
        yield  # closing the file releases the lock


def _salt(lake: Path) -> bytes:
    """The data dir's salt, written on first use: whole in a temp file, then linked to its
    name (one salt, ever; a write cut short by a full disk leaves no empty salt behind)."""
    path = erasure_dir(lake) / "salt"
    try:
        return bytes.fromhex(path.read_text().strip())
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".salt.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            atomic_write_bytes(temp, secrets.token_hex(32).encode())
            os.link(temp, path)
        except FileExistsError:
            pass
        finally:
            temp.unlink(missing_ok=True)
        return bytes.fromhex(path.read_text().strip())


@dataclass(frozen=True)
class ErasureLedger:
    """The salted hashes of erased ids, and the salt to hash a candidate with."""

    salt: bytes
    hashes: frozenset[str]

    @classmethod
    def load(cls, lake: Path) -> ErasureLedger:
        path = erasure_dir(lake) / "ledger.json"
        try:
            entries = json.loads(path.read_text())["erased"]
        except FileNotFoundError:
            return cls(b"", frozenset())
        return cls(_salt(lake), frozenset(e["hash"] for e in entries))

    def __bool__(self) -> bool:
        return bool(self.hashes)

    def hashed(self, player_id: str) -> str:
        return hashlib.sha256(self.salt + player_id.encode()).hexdigest()

    def erased(self, player_id: str) -> bool:
        return bool(self.hashes) and self.hashed(player_id) in self.hashes

    def mask(self, player_ids: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.bool_]:
        """A boolean per value: true where the id was erased (nulls: false)."""
        values = player_ids.to_pylist()
        if not self.hashes:
            return np.zeros(len(values), dtype=bool)
        return np.fromiter((v is not None and self.erased(v) for v in values), dtype=bool,
                           count=len(values))


def record_erasure(lake: Path, player_id: str, at: datetime) -> str:
    """Add the id's salted hash to the ledger (first step of an erasure, so its events are
    refused from then on); returns the hash. A failed write (of the salt or the ledger) is
    `RewriteFailed`: the ledger is as it was, without the id."""
    with rewriting(erasure_dir(lake) / "salt"):
        ledger = ErasureLedger(_salt(lake), frozenset())
    digest = ledger.hashed(player_id)
    path = erasure_dir(lake) / "ledger.json"
    try:
        entries = json.loads(path.read_text())["erased"]
    except FileNotFoundError:
        entries = []
    if digest not in {e["hash"] for e in entries}:
        entries.append({"hash": digest, "at": format_instant(at)})
        with rewriting(path):
            atomic_write_bytes(path, json.dumps({"erased": entries}, indent=1).encode())
    return digest


def _lock(handle: IO[bytes], operation: int, wait: float | None) -> None:
    """flock `handle`, blocking (`wait` None) or polling for at most `wait` seconds."""
    if wait is None:
        fcntl.flock(handle, operation)
        return
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(handle, operation | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise ErasureRunning("an erasure is running on this lake") from None
            time.sleep(0.02)


#: What an erased id becomes inside another row's free text (a ban's or void's reason).
REDACTED = "[erased]"

#: The characters of a player id (ID_PATTERN): an id inside free text is a token, a run of
#: them not inside a longer one.
_ID_CHARS = "A-Za-z0-9_.:-"
_TOKEN = re.compile(f"[{_ID_CHARS}]+")
#: Id characters a sentence puts after a word ("alt of p1.", "p1: smurf"): a token ending
#: in them is also the id without them.
_TRAILING = ".:"


def _named(token: str, erased: Callable[[str], bool]) -> str:
    """`token` with the erased id it is, or starts with before trailing `.`/`:`, replaced
    by REDACTED."""
    end = len(token)
    while end > 0:
        if erased(token[:end]):
            return REDACTED + token[end:]
        if token[end - 1] not in _TRAILING:
            return token
        end -= 1
    return token


def _redact(text: str, erased: Callable[[str], bool]) -> str:
    """`text` with every token naming an erased id replaced, in one pass; the REDACTED
    markers already there are left as they are (an id `erased` would otherwise grow them)."""
    return REDACTED.join(_TOKEN.sub(lambda m: _named(m.group(), erased), part)
                         for part in text.split(REDACTED))


def redact_erased(text: str, ledger: ErasureLedger) -> str:
    """`text` with every token that is an erased id replaced by REDACTED, as the erasure
    redacts the free text it finds (`without_player`, the same function): an operator's
    reason or a display name written after an erasure must not bring the id back (the
    ledger holds only salted hashes, so each token is hashed and looked up)."""
    if not ledger or not text:
        return text
    return _redact(text, ledger.erased)


def holds_player(path: Path, player_id: str) -> bool:
    """Whether a Parquet file's `player_id` column holds the id: that column only, pruned by
    row-group statistics (most files are never opened further)."""
    return bool(pq.read_table(path, columns=["player_id"],
                              filters=[("player_id", "=", player_id)]).num_rows)


def without_player(path: Path, player_id: str, *, any_text: bool = False,
                   drop_empty: bool = False, redact: tuple[str, ...] = ()) -> int:
    """Rewrite one Parquet file without the rows of `player_id` (its `player_id` column;
    with `any_text`, every row with a text column holding the id as a token, not inside a
    longer id: as a quarantined row's detail may quote it). `redact`: text columns where
    other rows keep their place but the id, as a token, becomes REDACTED (an operator's
    reason for another player's ban, or for a whole match's void, naming the player).
    Atomic; returns the rows removed or redacted (0: the file is not touched).
    `drop_empty`: a file left without rows is deleted instead."""
    # The rows holding the id as a token (removed with `any_text`: `p1.` and `p1:` are
    # other valid ids, so their rows stay), and those naming it in free text, found by
    # Arrow (maybe with a sentence's `.`/`:` after it); the few found are redacted by
    # `_redact`, as text written later is.
    exact = f"(^|[^{_ID_CHARS}]){re.escape(player_id)}($|[^{_ID_CHARS}])"
    token = f"(^|[^{_ID_CHARS}]){re.escape(player_id)}[{_TRAILING}]*($|[^{_ID_CHARS}])"
    if not any_text and not redact and not holds_player(path, player_id):
        return 0
    table = pq.read_table(path)
    if table.num_rows == 0:
        return 0
    hit = pa.array(np.zeros(table.num_rows, dtype=bool))
    for name in (table.column_names if any_text else ["player_id"]):
        if name not in table.column_names:
            continue
        column = table.column(name)
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            continue
        found = (pc.match_substring_regex(column, exact) if any_text
                 else pc.equal(column, player_id))
        hit = pc.or_(hit, pc.fill_null(found, False))
    removed = int(pc.sum(hit).as_py() or 0)
    kept = table.filter(pc.invert(hit)) if removed else table
    redacted = pa.array(np.zeros(kept.num_rows, dtype=bool))
    for name in redact:
        if name not in kept.column_names:
            continue
        column = kept.column(name)
        named = pc.fill_null(pc.match_substring_regex(column, token), False)
        if not pc.any(named).as_py():
            continue
        before = column.to_pylist()
        after = [_redact(v, player_id.__eq__) if hit else v
                 for v, hit in zip(before, named.to_pylist(), strict=True)]
        redacted = pc.or_(redacted, pa.array([a != b for a, b in zip(after, before,
                                                                       strict=True)]))
        kept = kept.set_column(kept.column_names.index(name), name,
                               pa.array(after, column.type))
    changed = removed + int(pc.sum(redacted).as_py() or 0)
    if changed == 0:
        return 0
    with rewriting(path):
        if drop_empty and kept.num_rows == 0:
            path.unlink()
        else:
            atomic_write_parquet(kept, path)
    return changed
