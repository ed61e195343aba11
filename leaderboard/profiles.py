"""Player profiles: what a profile may hold, and its durable record in the lake.

A profile is a display name (1-32 printable characters after NFC normalisation), an optional
ISO 3166-1 alpha-2 country and an optional https avatar URL. Every write is one row appended
to the profile log, `lake/profiles/<stamp>-<write_id>.parquet` (temp file + fsync + rename,
like a ban tombstone), so the history of every player's profile is kept; the latest write
per player wins, ordered by `order` (the write's time, then a tie-breaker). `compact_log`
folds the small files into one (same rows, history kept), and a reader drops the duplicate
rows a crash between its two steps can leave, by `write_id`.

The serving cache of the latest profiles (`serving.profiles`) is rebuilt from this log; the
Redis key it uses is named here so every layer agrees on it.
"""

from __future__ import annotations

import fcntl
import secrets
import time
import unicodedata
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq

from leaderboard.countries import COUNTRIES, country_problem
from leaderboard.erasure import ErasureLedger, erasure_barrier, redact_erased
from leaderboard.lake import atomic_write_parquet, fsync_dir
from leaderboard.schema import TIMESTAMP
from leaderboard.timeutil import format_instant, to_utc

__all__ = ["AVATAR_URL_MAX", "COUNTRY_CODES", "DISPLAY_NAME_MAX", "DISPLAY_NAME_RAW_MAX",
           "PROFILES_KEY", "PROFILE_SCHEMA", "Profile", "ProfileError", "check_not_erased",
           "compact_log", "history_of", "latest_profiles", "parse_profile", "profiles_dir",
           "read_log", "write_profile", "write_profiles"]

#: The serving cache: a Redis hash player_id -> `<order>\n<profile JSON>` (serving.profiles).
PROFILES_KEY = "lb:profiles"
DISPLAY_NAME_MAX = 32
#: The most code points a display name may have as sent (before NFC): NFC can only merge a
#: name's combining marks, so anything longer than this cannot become 32 characters.
DISPLAY_NAME_RAW_MAX = 128
AVATAR_URL_MAX = 2048
#: Listings of the log a reader takes before giving up on files vanishing under it (each
#: retry means a compaction or an erasure finished meanwhile).
_READ_ATTEMPTS = 5
COUNTRY_CODES = tuple(COUNTRIES)

PROFILE_SCHEMA = pa.schema([
    pa.field("player_id", pa.string(), nullable=False),
    pa.field("display_name", pa.string(), nullable=False),
    pa.field("country", pa.string()),
    pa.field("avatar_url", pa.string()),
    pa.field("updated_at", TIMESTAMP, nullable=False),
    pa.field("source", pa.string(), nullable=False),  # who wrote it: a server id, "cli"
    pa.field("order", pa.string(), nullable=False),   # latest wins by this, as text
    pa.field("write_id", pa.string(), nullable=False),
])


class ProfileError(ValueError):
    """A profile field that breaks the rules: `code` is the API's error code, the message
    names the value and says what is allowed."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Profile:
    """One player's profile as stored (display name NFC-normalised)."""

    player_id: str
    display_name: str
    country: str | None = None
    avatar_url: str | None = None
    updated_at: datetime | None = None
    order: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"player_id": self.player_id, "display_name": self.display_name,
                "country": self.country, "avatar_url": self.avatar_url,
                "updated_at": None if self.updated_at is None
                else format_instant(self.updated_at)}


def _display_name(raw: Any) -> str:
    if not isinstance(raw, str):
        raise ProfileError("invalid_display_name", "display_name must be a string of 1-32 "
                                                   "printable characters")
    if len(raw) > DISPLAY_NAME_RAW_MAX:
        raise ProfileError("invalid_display_name",
                           f"display_name is {len(raw)} characters; use 1-{DISPLAY_NAME_MAX}")
    name = unicodedata.normalize("NFC", raw)
    if not 1 <= len(name) <= DISPLAY_NAME_MAX:
        raise ProfileError("invalid_display_name",
                           f"display_name is {len(name)} characters (after NFC "
                           f"normalisation); use 1-{DISPLAY_NAME_MAX}")
    for char in name:
        if not char.isprintable():
            raise ProfileError(
                "invalid_display_name",
                f"display_name holds U+{ord(char):04X} ({unicodedata.category(char)}), which "
                "is not printable (control, format, separator or surrogate characters are "
                "refused): send visible text")
    if name.strip() != name:
        raise ProfileError("invalid_display_name", "display_name starts or ends with a space; "
                                                   "send it trimmed")
    return name


def _avatar_url(raw: Any) -> str:
    if not isinstance(raw, str) or len(raw) > AVATAR_URL_MAX:
        raise ProfileError("invalid_avatar_url", f"avatar_url must be an https URL of at most "
                                                 f"{AVATAR_URL_MAX} characters")
    if not raw.isascii() or not raw.isprintable() or " " in raw:
        raise ProfileError("invalid_avatar_url", "avatar_url must be an ASCII URL without "
                                                 "spaces or control characters (percent-encode "
                                                 "the rest)")
    try:
        parts = urlsplit(raw)
        host = parts.hostname
    except ValueError:
        host, parts = None, None
    if parts is None or parts.scheme != "https" or not host:
        raise ProfileError("invalid_avatar_url", f"avatar_url `{raw[:80]}` is not an https URL "
                                                 "with a host (https://cdn.example/a.png); "
                                                 "http and other schemes are refused")
    return raw


def parse_profile(player_id: str, fields: dict[str, Any]) -> Profile:
    """A profile from a request's fields (display_name required; country and avatar_url
    optional, null or absent clearing them). Raises ProfileError naming what is wrong."""
    unknown = set(fields) - {"display_name", "country", "avatar_url"}
    if unknown:
        raise ProfileError("invalid_profile", f"unknown field `{min(map(str, unknown))}`; a "
                                              "profile has display_name, country and "
                                              "avatar_url")
    if fields.get("display_name") is None:
        raise ProfileError("invalid_display_name", "display_name is required (1-32 printable "
                                                   "characters)")
    name = _display_name(fields["display_name"])
    country = fields.get("country")
    if country is not None:
        problem = (country_problem(country) if isinstance(country, str)
                   else "country must be a string")
        if problem is not None:
            raise ProfileError("invalid_country", problem)
    avatar = fields.get("avatar_url")
    return Profile(player_id, name, country, None if avatar is None else _avatar_url(avatar))


def profiles_dir(lake: Path) -> Path:
    return lake / "profiles"


def _orders(at: datetime, count: int) -> list[str]:
    """Texts that sort as the writes happened: the write's time (the product clock, so a
    replayed `--now` orders as told), then the wall clock in ns, then 32 random bits. The
    writes of one call take the clock once and count up from it, so a later one of them
    wins even when the clock reads the same ns twice or steps back between them."""
    micros = int(to_utc(at).timestamp() * 1_000_000) + (1 << 60)  # positive before 1970
    ns = time.time_ns()
    return [f"{micros:016x}{ns + i:016x}{secrets.randbits(32):08x}" for i in range(count)]


def check_not_erased(erased: ErasureLedger, player_id: str) -> None:
    """ProfileError `erased` when the ledger (`ErasureLedger.load`) holds the id: a profile
    of an erased player is refused, as its events are, so no write brings the id back."""
    if erased.erased(player_id):
        raise ProfileError("erased", f"player {player_id}'s data was erased (right to "
                                     "erasure): a profile of the id is refused, as its events "
                                     "are")


def write_profile(lake: Path, profile: Profile, at: datetime, source: str) -> Profile:
    """Append one write to the profile log (durable when this returns); the profile as
    stored, with its time and order."""
    return write_profiles(lake, [profile], at, source)[0]


def write_profiles(lake: Path, profiles: Sequence[Profile], at: datetime, source: str
                   ) -> list[Profile]:
    """Append writes of many profiles as one file of the log (an import: one fsync, not
    one per player); later profiles of the same player in `profiles` win. ProfileError
    `erased`, writing nothing, when one is of an erased player; an erased id inside a
    display name becomes `[erased]`, as the erasure leaves it."""
    if not profiles:
        return []
    erased = ErasureLedger.load(lake)
    for profile in profiles:
        check_not_erased(erased, profile.player_id)
    at = to_utc(at)
    stored = [Profile(p.player_id, redact_erased(p.display_name, erased), p.country,
                      p.avatar_url, at, order)
              for p, order in zip(profiles, _orders(at, len(profiles)), strict=True)]
    write_ids = [uuid.uuid4().hex for _ in stored]
    table = pa.table({"player_id": [p.player_id for p in stored],
                      "display_name": [p.display_name for p in stored],
                      "country": [p.country for p in stored],
                      "avatar_url": [p.avatar_url for p in stored],
                      "updated_at": pa.array([at] * len(stored), TIMESTAMP),
                      "source": [source] * len(stored), "order": [p.order for p in stored],
                      "write_id": write_ids}, schema=PROFILE_SCHEMA)
    atomic_write_parquet(table, profiles_dir(lake) /
                         f"{stored[-1].order}-{write_ids[-1][:12]}.parquet")
    return stored


def read_log(lake: Path) -> pa.Table:
    """Every write of the log, each once (a compaction interrupted between writing its file
    and deleting the originals leaves rows twice), ordered by `order`.

    Readers take no lock: a compaction or an erasure may delete a listed file before it is
    read. Its rows are then in a file written before the deletion (the compaction's) or
    erased, so the log is listed and read again."""
    for attempt in range(_READ_ATTEMPTS):
        files = sorted(profiles_dir(lake).glob("*.parquet"))
        if not files:
            return PROFILE_SCHEMA.empty_table()
        try:
            return _unique([pq.read_table(f, schema=PROFILE_SCHEMA) for f in files])
        except FileNotFoundError:
            if attempt == _READ_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def _unique(tables: list[pa.Table]) -> pa.Table:
    """The rows of `tables`, each write once, ordered by `order`."""
    table = pa.concat_tables(tables)
    seen: set[str] = set()
    keep = []
    for i, write_id in enumerate(table.column("write_id").to_pylist()):
        if write_id not in seen:
            seen.add(write_id)
            keep.append(i)
    table = table.take(pa.array(keep, pa.int64())) if len(keep) < table.num_rows else table
    return table.sort_by([("order", "ascending")])


def _profiles_of(rows: Iterable[dict[str, Any]]) -> list[Profile]:
    return [Profile(r["player_id"], r["display_name"], r["country"], r["avatar_url"],
                    r["updated_at"], r["order"]) for r in rows]


def latest_profiles(lake: Path) -> dict[str, Profile]:
    """Each player's latest profile (the write with the greatest order)."""
    latest: dict[str, Profile] = {}
    for profile in _profiles_of(read_log(lake).to_pylist()):
        latest[profile.player_id] = profile  # the log is in order: the last one wins
    return latest


def history_of(lake: Path, player_id: str) -> list[Profile]:
    """Every write of one player's profile, oldest first."""
    import pyarrow.compute as pc

    table = read_log(lake)
    return _profiles_of(table.filter(pc.equal(table.column("player_id"), player_id)).to_pylist())


@contextmanager
def _rewriting(lake: Path) -> Iterator[Path]:
    """Hold the log's rewrite lock (two compactions, one at a time: each would fold the
    same files). An erasure is kept out by the erasure barrier instead, which a compaction
    holds shared (`compact_log`). Appending a write needs no lock: it is a new file."""
    folder = profiles_dir(lake)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".rewrite.lock", "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield folder
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def compact_log(lake: Path, *, min_files: int = 2) -> int:
    """Fold the log's files into one (every row kept: the history stays); returns how many
    files it replaced (0 when there were fewer than `min_files`). The new file is durable
    before any original is deleted, and readers drop the rows that are in both meanwhile, so
    every state in between reads the same log. A write landing during the compaction is a
    new file the listing did not take: it stays as it is. It holds the erasure barrier
    shared: an erasure (which rewrites these files without the erased player) between its
    read and its write would see its folded file put the erased rows back."""
    if len(list(profiles_dir(lake).glob("*.parquet"))) < min_files:
        return 0
    with erasure_barrier(lake, exclusive=False), _rewriting(lake) as folder:
        files = sorted(folder.glob("*.parquet"))
        if len(files) < min_files:
            return 0
        table = _unique([pq.read_table(f, schema=PROFILE_SCHEMA) for f in files])
        # Named after the newest write it holds, so it sorts among the files it replaced.
        last = table.column("order")[-1].as_py()
        target = folder / f"{last}-compact-{uuid.uuid4().hex[:12]}.parquet"
        atomic_write_parquet(table, target)
        for path in files:
            if path != target:
                path.unlink(missing_ok=True)
        fsync_dir(folder)
    return len(files)
