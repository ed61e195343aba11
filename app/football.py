"""The real international football results (CC0) as match events.

Each played match gives two events, one per team (player_id = the team name as an id),
3 points for a win, 1 for a draw, 0 for a loss; mode is a coarse tournament class
(friendly, qualification, finals); event_time is the match date at 12:00 UTC; region is
`world`. Use with the shipped `football` registry and `leaderboard ingest --backfill`.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

__all__ = ["FOOTBALL_HEADER", "football_events", "team_id", "team_profiles", "tournament_mode"]

FOOTBALL_HEADER = ("date", "home_team", "away_team", "home_score", "away_score",
                   "tournament", "city", "country", "neutral")
_NOT_ID = re.compile(r"[^A-Za-z0-9_.:-]+")


def team_id(name: str) -> str:
    """A valid player_id for a team: ASCII-folded, other characters as `_`, at most 64."""
    folded = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    return _NOT_ID.sub("_", folded).strip("_")[:64] or "unknown"


#: Team names the ISO 3166-1 list spells otherwise. England, Scotland, Wales and Northern
#: Ireland have no alpha-2 code of their own (GB is the union): they get no country.
_ISO_ALIASES = {"Russia": "RU", "Ivory Coast": "CI", "DR Congo": "CD", "Czech Republic": "CZ",
                "Turkey": "TR", "Cape Verde": "CV", "Swaziland": "SZ", "Eswatini": "SZ",
                "Macau": "MO", "Palestine": "PS", "Vatican City": "VA",
                "United States Virgin Islands": "VI", "Brunei": "BN", "Laos": "LA"}


def team_profiles(path: Path) -> list[tuple[str, str, str | None]]:
    """(player_id, display name, ISO country or None) for every team of the results file:
    the readable name ("South Korea") of each id the events use ("South_Korea")."""
    from leaderboard.countries import COUNTRIES

    by_name = {name: code for code, name in COUNTRIES.items()}
    raw = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(
        column_types={name: pa.string() for name in FOOTBALL_HEADER}))
    names = sorted(set(raw["home_team"].to_pylist()) | set(raw["away_team"].to_pylist()))
    return [(team_id(name), name, by_name.get(name) or _ISO_ALIASES.get(name))
            for name in names]


def tournament_mode(tournament: str) -> str:
    lowered = tournament.lower()
    if lowered == "friendly":
        return "friendly"
    if "qualification" in lowered:
        return "qualification"
    return "finals"


def football_events(path: Path) -> tuple[pa.Table, int]:
    """Events for every played match, and the number of unplayed fixtures skipped."""
    raw = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(
        column_types={name: pa.string() for name in FOOTBALL_HEADER}))
    played = pc.and_(pc.match_substring_regex(raw["home_score"], r"^\d+$"),
                     pc.match_substring_regex(raw["away_score"], r"^\d+$"))
    skipped = raw.num_rows - pc.sum(pc.cast(played, pa.int64())).as_py()
    raw = raw.filter(played)
    names = sorted(set(raw["home_team"].to_pylist()) | set(raw["away_team"].to_pylist()))
    ids = {name: team_id(name) for name in names}
    clash = len(set(ids.values())) != len(ids)
    if clash:
        raise ValueError("two team names fold to the same player_id; extend team_id()")
    home = np.asarray(pc.cast(raw["home_score"], pa.int64()).to_numpy())
    away = np.asarray(pc.cast(raw["away_score"], pa.int64()).to_numpy())
    home_points = np.where(home > away, 3, np.where(home == away, 1, 0))
    away_points = np.where(away > home, 3, np.where(home == away, 1, 0))
    home_ids = [ids[n] for n in raw["home_team"].to_pylist()]
    away_ids = [ids[n] for n in raw["away_team"].to_pylist()]
    dates = raw["date"].to_pylist()
    match_ids = []
    seen: dict[str, int] = {}
    for d, h, a in zip(dates, home_ids, away_ids, strict=True):
        key = f"{d}:{h}:{a}"
        seen[key] = seen.get(key, 0) + 1
        # The same fixture twice on one day happens in the real data: keep both matches.
        match_ids.append(key if seen[key] == 1 else f"{key}#{seen[key]}")
    modes = [tournament_mode(t) for t in raw["tournament"].to_pylist()]
    times = pc.cast(pc.binary_join_element_wise(raw["date"], pa.scalar("T12:00:00+00:00"), ""),
                    pa.timestamp("us", tz="UTC"))
    n = raw.num_rows
    table = pa.table({
        "match_id": pa.array(match_ids + match_ids, pa.string()),
        "player_id": pa.array(home_ids + away_ids, pa.string()),
        "points": pa.array(np.concatenate([home_points, away_points]), pa.int64()),
        "event_time": pa.concat_arrays([times.combine_chunks(), times.combine_chunks()]),
        "region": pa.array(["world"] * (2 * n), pa.string()),
        "mode": pa.array(modes + modes, pa.string()),
        "server_id": pa.array(["football"] * (2 * n), pa.string()),
    })
    return table, int(skipped)
