"""A deterministic synthetic season: heavy-tailed players, matches, diurnal traffic and dirt.

Feeds the landing zone the way a season of game servers would (micro-batches of matches, with
retries, late backlogs and malformed rows), so that every layer can be exercised and benchmarked
at scale without real data. The same spec always gives the same tables: all randomness comes
from one `numpy.random.Generator(PCG64(seed))` and nothing reads the wall clock.

Everything is vectorised with numpy and pyarrow; the only Python loops run per simulated day and
per landed micro-batch, never per event. This module is the pure simulation (no I/O, no
threads); `app.season` pushes it through the real landing path.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from leaderboard.registry import Board, Registry
from leaderboard.schema import INPUT_FIELDS, TIMESTAMP
from leaderboard.timeutil import duration_us, epoch_us, from_epoch_us

__all__ = ["GenerateSpec", "Injected", "generate_events", "generate_scores", "simulate",
           "total_rows"]

# -- the shape of a season ---------------------------------------------------------------------

#: Home-region mix for the default region names; other names share uniformly.
_REGION_WEIGHTS = {"na": 0.35, "eu": 0.30, "asia": 0.25, "sa": 0.10}
#: UTC offset (hours) of each default region's evening peak; others are spread round the clock.
_REGION_UTC_OFFSET = {"na": -5, "eu": 1, "asia": 8, "sa": -3}
#: Mode mix for the default mode names; other names share uniformly.
_MODE_WEIGHTS = {"casual": 0.55, "ranked": 0.35, "tournament": 0.10}
#: Players per match (2-8); duels and 4-player lobbies are the most common.
_MATCH_SIZES = np.arange(2, 9, dtype=np.int64)
_MATCH_SIZE_WEIGHTS = np.array([0.22, 0.08, 0.30, 0.08, 0.12, 0.05, 0.15])
#: Points per player per match: few distinct values, mostly small, so standings have many ties.
_POINTS = np.array([0, 1, 2, 3, 5, 10, 15, 20, 25, 50, 100], dtype=np.int64)
_POINT_WEIGHTS = np.array([0.12, 0.20, 0.16, 0.12, 0.10, 0.10, 0.06, 0.05, 0.04, 0.03, 0.02])
#: Matches started per local hour of day: quiet before dawn, peaking in the evening.
_LOCAL_HOUR_WEIGHTS = np.array([3.0, 2.0, 1.5, 1.0, 0.8, 0.8, 1.2, 2.0, 2.8, 3.2, 3.6, 4.0,
                                4.5, 4.6, 4.6, 5.0, 5.8, 7.0, 8.5, 10.0, 10.0, 9.0, 7.0, 4.8])
#: Share of a player's seats taken in their preferred mode (the rest: any mode of their region).
_PREFERRED_MODE_SHARE = 0.7
_SERVERS_PER_REGION = 16
#: Submission delay of a match (event_time to arrival): lognormal, seconds to minutes.
_DELAY_MEDIAN_S = 20.0
_DELAY_SIGMA = 1.2
_DELAY_MAX_S = 1800.0
#: Dirt split: retries/re-deliveries, late backlogs, malformed rows.
_DIRT_SPLIT = (0.4, 0.3, 0.3)
#: Retries: this share comes back within seconds (mostly the same batch), the rest minutes to
#: hours later (lognormal).
_RETRY_FAST_SHARE = 0.2
_RETRY_MEDIAN_S = 3600.0
_RETRY_SIGMA = 1.0
_RETRY_MAX_S = 12 * 3600.0
#: Lateness of a late event (landing minus event_time): log-uniform in [1 h, 10 d], so a few
#: percent arrive past the 7-day grace and count only for the long windows.
_LATE_MIN_S = 3600.0
_LATE_MAX_S = 10 * 86400.0
#: Malformed rows: each is a copy of a real row with exactly one defect, so its reason is known.
_MALFORMED_KINDS = ("bad_player_id", "unknown_region", "unknown_mode", "points_out_of_bounds",
                    "event_time_in_future", "missing_field")
_MALFORMED_WEIGHTS = np.array([0.25, 0.10, 0.10, 0.20, 0.15, 0.20])
_BAD_PLAYER_IDS = ("", "p" * 65, "p 0000042", "p\u00e900042", "p\U0001f3ae0042", "player#42")
_BAD_REGIONS = ("mars", "", "NA", "eu west", "antarctica")
_BAD_MODES = ("hardcore", "", "Ranked", "co op", "battle-royale")
_MIN_POOL = 8  # players per region: a full 8-player match must find distinct players

_US = 1_000_000
_DAY_US = 86_400 * _US
_WRITER = re.compile(r"^[a-z0-9_]{1,32}$")
_TABLE_BITS = 12  # categorical draws go through lookup tables of 2**12 entries
_MISSING_NONE = -1


@dataclass(frozen=True)
class GenerateSpec:
    """What to generate; the same spec (and registry) always gives the same tables."""

    players: int = 10_000
    days: int = 7
    events_per_day: int = 100_000
    start: date = date(2026, 11, 1)
    seed: int = 0
    dirty: float = 0.0  # share of dirty rows relative to clean events, 0..0.5
    batch_minutes: int = 60  # simulated landing cadence: one landed file per writer per batch
    writer: str = "gen"


# -- the population ----------------------------------------------------------------------------


def _weights(names: tuple[str, ...], known: dict[str, float]) -> npt.NDArray[np.float64]:
    """Weights for the registry's names: the known mix when every name is known, else uniform."""
    if all(name in known for name in names):
        raw = np.array([known[name] for name in names], dtype=np.float64)
    else:
        raw = np.ones(len(names), dtype=np.float64)
    raw /= raw.sum()
    return raw


def _lookup(weights: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """A 2**_TABLE_BITS table mapping a uniform integer to a category by weight (O(1) draws)."""
    cdf = np.cumsum(weights / weights.sum())
    grid = (np.arange(1 << _TABLE_BITS) + 0.5) / (1 << _TABLE_BITS)
    return np.minimum(np.searchsorted(cdf, grid, side="right"), len(weights) - 1).astype(np.int64)


def _apportion(total: int, weights: npt.NDArray[np.float64], floor: int) -> npt.NDArray[np.int64]:
    """Split `total` by weight (largest remainder), each share at least `floor`."""
    spare = total - floor * len(weights)
    exact = weights * spare
    counts = np.floor(exact).astype(np.int64)
    short = spare - int(counts.sum())
    counts[np.argsort(-(exact - counts), kind="stable")[:short]] += 1
    return counts + floor


def _texts(values: list[str]) -> pa.Array:
    return pa.array(values, pa.string())


@dataclass(frozen=True)
class _Population:
    """Players, their home regions and preferred modes, matchmaking pools and string tables."""

    players: int
    player_width: int  # digits of a player id: p0000123
    regions: tuple[str, ...]
    modes: tuple[str, ...]
    region_table: npt.NDArray[np.int64]  # lookup: uniform -> region
    mode_table: npt.NDArray[np.int64]  # lookup: uniform -> mode
    size_table: npt.NDArray[np.int64]  # lookup: uniform -> match size
    hour_table: npt.NDArray[np.int64]  # lookup: uniform -> local hour
    points_table: npt.NDArray[np.int64]  # (region * modes + mode) << bits | uniform -> points
    utc_offset_us: npt.NDArray[np.int64]  # per region
    pool_members: npt.NDArray[np.int32]  # every pool's players, keenest first
    pool_offset: npt.NDArray[np.int64]
    pool_size: npt.NDArray[np.int64]
    preferred_pool: npt.NDArray[np.int64]  # (region * modes + mode) -> pool id
    bad_player_ids: pa.Array  # malformed ids; a player index >= players picks one
    region_names: pa.Array  # the registry's regions, then unknown ones
    mode_names: pa.Array  # the registry's modes, then unknown ones
    server_ids: pa.Array  # region * servers + k -> "na-gs07"
    points_low: int  # the lowest min_points of any board: below it, every board refuses
    points_high: int  # the highest max_points of any board: above it, every board refuses


def _points_table(registry: Registry) -> tuple[npt.NDArray[np.int64], int, int]:
    """Points lookup per (region, mode): the tie-heavy set clipped to every board's bounds."""
    tables = []
    for region in registry.regions:
        for mode in registry.modes:
            boards = registry.boards_for(region, mode)
            low = max((b.min_points for b in boards), default=0)
            high = min((b.max_points for b in boards), default=int(_POINTS[-1]))
            if low > high:
                raise ValueError(
                    f"no points value is valid for region {region!r} and mode {mode!r}: its "
                    f"boards' bounds do not overlap ([{low}, {high}]); fix the registry "
                    f"({registry.source})"
                )
            allowed = _POINTS
            inside = (allowed >= low) & (allowed <= high)
            if inside.any():
                values, weights = allowed[inside], _POINT_WEIGHTS[inside]
            else:  # bounds far from the usual set: spread over the allowed range instead
                values = np.unique(np.linspace(low, high, num=min(11, high - low + 1))
                                   .round().astype(np.int64))
                weights = 1.0 / (1.0 + np.arange(len(values)))
            tables.append(values[_lookup(weights)])
    low = min(b.min_points for b in registry.boards)
    high = max(b.max_points for b in registry.boards)
    return np.concatenate(tables), low, high


def _grouped(keenest_first: npt.NDArray[np.int64], group: npt.NDArray[np.int64],
             groups: int) -> npt.NDArray[np.int64]:
    """Players grouped by `group`, keenest first within each group (a stable, linear sort)."""
    key = group[keenest_first]
    if groups < 1 << 16:  # numpy sorts small unsigned keys stably by radix, in linear time
        key = key.astype(np.uint16)
    return keenest_first[np.argsort(key, kind="stable")]


def _population(spec: GenerateSpec, registry: Registry, rng: np.random.Generator) -> _Population:
    regions, modes = registry.regions, registry.modes
    n_regions, n_modes, n = len(regions), len(modes), spec.players
    region_weights = _weights(regions, _REGION_WEIGHTS)
    mode_weights = _weights(modes, _MODE_WEIGHTS)

    # Keenness is a random order of the players, so keen players are spread over the ids.
    keenest_first = rng.permutation(n)
    counts = _apportion(n, region_weights, _MIN_POOL)
    home = np.repeat(np.arange(n_regions), counts)[rng.permutation(n)]
    preferred = _lookup(mode_weights)[rng.integers(0, 1 << _TABLE_BITS, n)]

    # Pools, each keenest first: one per region, then one per (region, preferred mode).
    by_region = _grouped(keenest_first, home, n_regions)
    by_preference = _grouped(keenest_first, home * n_modes + preferred, n_regions * n_modes)
    region_sizes = np.bincount(home, minlength=n_regions)
    preference_sizes = np.bincount(home * n_modes + preferred, minlength=n_regions * n_modes)
    pool_size = np.concatenate([region_sizes, preference_sizes]).astype(np.int64)
    pool_offset = np.concatenate([[0], np.cumsum(pool_size)[:-1]]).astype(np.int64)
    preferred_pool = np.arange(n_regions * n_modes) + n_regions
    empty = preference_sizes == 0
    preferred_pool[empty] = (np.arange(n_regions * n_modes) // n_modes)[empty]

    offsets = []
    for index, name in enumerate(regions):
        hours = _REGION_UTC_OFFSET.get(name, round(24 * index / n_regions) - 12)
        offsets.append(hours * 3600 * _US)

    servers = [f"{region}-gs{k:02d}" for region in regions for k in range(_SERVERS_PER_REGION)]
    points_table, low, high = _points_table(registry)
    return _Population(
        players=n, player_width=max(7, len(str(n - 1))), regions=regions, modes=modes,
        region_table=_lookup(region_weights), mode_table=_lookup(mode_weights),
        size_table=_MATCH_SIZES[_lookup(_MATCH_SIZE_WEIGHTS)],
        hour_table=_lookup(_LOCAL_HOUR_WEIGHTS), points_table=points_table,
        utc_offset_us=np.array(offsets, dtype=np.int64),
        pool_members=np.concatenate([by_region, by_preference]).astype(np.int32),
        pool_offset=pool_offset, pool_size=pool_size, preferred_pool=preferred_pool,
        bad_player_ids=_texts(list(_BAD_PLAYER_IDS)),
        region_names=_texts([*regions, *(r for r in _BAD_REGIONS if r not in regions)]),
        mode_names=_texts([*modes, *(m for m in _BAD_MODES if m not in modes)]),
        server_ids=_texts(servers), points_low=low, points_high=high,
    )


# -- rows --------------------------------------------------------------------------------------

#: Row columns while generating: indexes into the population's string tables, and integers.
_COLUMNS = {"match": np.int64, "player": np.int32, "points": np.int64, "time": np.int64,
            "region": np.int16, "mode": np.int16, "server": np.int32, "slot": np.int64,
            "missing": np.int8}
_Rows = dict[str, npt.NDArray[Any]]


def _empty_rows() -> _Rows:
    return {name: np.empty(0, dtype=dtype) for name, dtype in _COLUMNS.items()}


def _concat(parts: list[_Rows]) -> _Rows:
    return {name: np.concatenate([p[name] for p in parts]) for name in _COLUMNS}


def _take(rows: _Rows, index: npt.NDArray[np.integer]) -> _Rows:
    return {name: values[index] for name, values in rows.items()}


def _match_sizes(rng: np.random.Generator, pop: _Population, total: int) -> npt.NDArray[np.int64]:
    """Match sizes (2-8) summing to exactly `total` (>= 2) rows."""
    sizes = np.empty(0, dtype=np.int64)
    while int(sizes.sum()) < total:
        guess = int(total / 4.0) + 16
        sizes = np.concatenate([sizes, pop.size_table[rng.integers(0, 1 << _TABLE_BITS, guess)]])
    ends = np.cumsum(sizes)
    whole = int(np.searchsorted(ends, total, side="right"))
    sizes = sizes[:whole]
    rest = total - (int(ends[whole - 1]) if whole else 0)
    if rest >= 2:
        sizes = np.append(sizes, rest)
    elif rest == 1:
        growable = np.flatnonzero(sizes < _MATCH_SIZES[-1])
        if growable.size:
            sizes[growable[-1]] += 1
        else:  # every match is full: 8 + 1 = 7 + 2
            sizes[-1] -= 1
            sizes = np.append(sizes, 2)
    return sizes


def _keen(u: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """u**4, in place: uniform draws to pool positions crowded at the keen end (Zipf-like).

    A pool member at position r (0 = keenest) of n is drawn when floor(n * u**4) = r, so the top
    1% of a pool take 0.01**(1/4), about 32%, of its seats and most members play rarely. Two
    squarings cost much less per seat than a general power.
    """
    np.multiply(u, u, out=u)
    return np.multiply(u, u, out=u)


def _seat_players(rng: np.random.Generator, pop: _Population, region: npt.NDArray[np.int64],
                  mode: npt.NDArray[np.int64],
                  seat: npt.NDArray[np.int64]) -> npt.NDArray[np.int32]:
    """Fill every seat with a distinct player of the match's region, keen players more often."""
    n = len(region)
    pool = np.where(rng.random(n) < _PREFERRED_MODE_SHARE,
                    pop.preferred_pool[region * len(pop.modes) + mode], region)
    size = pop.pool_size[pool]
    position = np.minimum((size * _keen(rng.random(n))).astype(np.int64), size - 1)
    player = pop.pool_members[pop.pool_offset[pool] + position]
    for attempt in range(64):  # a repeated player in a match is re-seated; converges fast
        repeat = np.zeros(n, dtype=bool)
        for lag in range(1, int(_MATCH_SIZES[-1])):
            same = player[lag:] == player[:-lag]
            repeat[lag:] |= same & (seat[lag:] >= lag)
        again = np.flatnonzero(repeat)
        if again.size == 0:
            return player
        # After a few tries (tiny pools), draw uniformly from the whole region instead.
        u = rng.random(again.size)
        own = region[again]
        size = pop.pool_size[own]
        pick = np.minimum((size * (_keen(u) if attempt < 4 else u)).astype(np.int64), size - 1)
        player[again] = pop.pool_members[pop.pool_offset[own] + pick]
    raise AssertionError("could not seat distinct players; regions need >= 8 players each")


def _matches(rng: np.random.Generator, pop: _Population, total: int, day_us: int,
             first_match: int) -> tuple[_Rows, npt.NDArray[np.int64]]:
    """`total` rows of whole matches started on the day at `day_us`, and each row's arrival."""
    sizes = _match_sizes(rng, pop, total)
    m = len(sizes)
    draws = rng.integers(0, 1 << _TABLE_BITS, (4, m))
    region = pop.region_table[draws[0]]
    mode = pop.mode_table[draws[1]]
    local = pop.hour_table[draws[2]] * 3600 * _US + rng.integers(0, 3600 * _US, m)
    start = day_us + (local - pop.utc_offset_us[region]) % _DAY_US
    delay_s = np.minimum(rng.lognormal(math.log(_DELAY_MEDIAN_S), _DELAY_SIGMA, m), _DELAY_MAX_S)
    arrival = start + (delay_s * _US).astype(np.int64)
    server = region * _SERVERS_PER_REGION + draws[3] % _SERVERS_PER_REGION
    # Number matches in start order: rows then come out almost in landing order, so the later
    # sort into micro-batches finds long runs and moves memory sequentially, not at random.
    order = np.argsort(start, kind="stable")
    sizes, region, mode, start = sizes[order], region[order], mode[order], start[order]
    arrival, server = arrival[order], server[order]

    match_of_row = np.repeat(np.arange(m), sizes)
    seat = np.arange(total) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    row_region = region[match_of_row]
    row_mode = mode[match_of_row]
    players = _seat_players(rng, pop, row_region, row_mode, seat)
    combo = row_region * len(pop.modes) + row_mode
    points = pop.points_table[(combo << _TABLE_BITS) | rng.integers(0, 1 << _TABLE_BITS, total)]
    rows: _Rows = {
        "match": first_match + match_of_row,
        "player": players,
        "points": points,
        "time": start[match_of_row],
        "region": row_region.astype(np.int16),
        "mode": row_mode.astype(np.int16),
        "server": server[match_of_row].astype(np.int32),
        "slot": np.zeros(total, dtype=np.int64),  # set by the caller from the arrival
        "missing": np.full(total, _MISSING_NONE, dtype=np.int8),
    }
    return rows, arrival[match_of_row]


# -- the season --------------------------------------------------------------------------------


@dataclass
class Injected:
    """Dirt injected so far: the simulation fills it in as it runs; the landing pipeline
    (`app.season.generate_season`) reports it."""

    duplicates: int = 0
    late: int = 0
    malformed: int = 0


def _dirt_counts(spec: GenerateSpec) -> tuple[int, int, int]:
    """Per day: retries, late rows, malformed rows (a late backlog is whole matches, >= 2 rows)."""
    total = round(spec.dirty * spec.events_per_day)
    duplicates = round(total * _DIRT_SPLIT[0])
    late = round(total * _DIRT_SPLIT[1])
    late = late if late >= 2 else 0
    return duplicates, late, total - duplicates - late


def _check(spec: GenerateSpec, registry: Registry) -> None:
    """Refuse a spec that cannot be generated, naming the field and what to use."""
    minimum = _MIN_POOL * len(registry.regions)
    if spec.players < minimum:
        raise ValueError(f"GenerateSpec.players={spec.players} is too few: every region needs "
                         f"{_MIN_POOL} players for a full match; use >= {minimum}")
    if spec.days < 1:
        raise ValueError(f"GenerateSpec.days={spec.days} must be >= 1")
    if spec.events_per_day < 0:
        raise ValueError(f"GenerateSpec.events_per_day={spec.events_per_day} must be >= 0")
    if spec.events_per_day == 1:
        raise ValueError("GenerateSpec.events_per_day=1 cannot form a match; use 0 or >= 2")
    if not 0.0 <= spec.dirty <= 0.5:
        raise ValueError(f"GenerateSpec.dirty={spec.dirty} must be a share in [0, 0.5]")
    if spec.batch_minutes < 1:
        raise ValueError(f"GenerateSpec.batch_minutes={spec.batch_minutes} must be >= 1")
    if not _WRITER.match(spec.writer):
        raise ValueError(f"GenerateSpec.writer={spec.writer!r} must be 1-32 chars of [a-z0-9_]")


def _micros(day: date) -> int:
    midnight = datetime.combine(day, datetime.min.time(), UTC)
    return epoch_us(midnight)


def _dirt(rng: np.random.Generator, pop: _Population, spec: GenerateSpec, registry: Registry,
          clean: _Rows, arrival: npt.NDArray[np.int64], day_us: int, origin_us: int,
          first_match: int) -> tuple[list[_Rows], int]:
    """Retries, late backlogs and malformed rows for one day; returns them and matches used."""
    slot_us = spec.batch_minutes * 60 * _US
    n_dup, n_late, n_bad = _dirt_counts(spec)
    parts: list[_Rows] = []
    n = len(arrival)

    # Retries: exact copies of the day's rows, re-delivered seconds to hours after the original.
    source = rng.integers(0, n, n_dup)
    fast = rng.random(n_dup) < _RETRY_FAST_SHARE
    wait_s = np.where(fast, rng.uniform(1.0, 30.0, n_dup),
                      np.minimum(rng.lognormal(math.log(_RETRY_MEDIAN_S), _RETRY_SIGMA, n_dup),
                                 _RETRY_MAX_S))
    retries = _take(clean, source)
    retries["slot"] = (arrival[source] + (wait_s * _US).astype(np.int64) - origin_us) // slot_us
    parts.append(retries)

    # Late backlogs: whole new matches arriving today, played 1 hour to 10 days earlier.
    used = 0
    if n_late:
        late, _ = _matches(rng, pop, n_late, day_us, first_match)
        used = int(late["match"][-1]) - first_match + 1
        match_index = late["match"] - first_match
        late_arrival = (day_us + rng.integers(0, _DAY_US, used))[match_index]
        lateness = np.exp(rng.uniform(math.log(_LATE_MIN_S), math.log(_LATE_MAX_S), used))
        late["time"] = late_arrival - (lateness * _US).astype(np.int64)[match_index]
        late["slot"] = (late_arrival - origin_us) // slot_us
        parts.append(late)

    # Malformed rows: copies of real rows with exactly one defect each.
    if n_bad:
        source = rng.integers(0, n, n_bad)
        bad = _take(clean, source)
        bad["slot"] = (arrival[source] - origin_us) // slot_us
        kind = _lookup(_MALFORMED_WEIGHTS)[rng.integers(0, 1 << _TABLE_BITS, n_bad)]
        pick = rng.integers(0, 1 << 30, n_bad)
        for index, name in enumerate(_MALFORMED_KINDS):
            rows = np.flatnonzero(kind == index)
            if rows.size == 0:
                continue
            if name == "bad_player_id":
                bad["player"][rows] = pop.players + pick[rows] % len(_BAD_PLAYER_IDS)
            elif name == "unknown_region":
                extra = len(pop.region_names) - len(pop.regions)
                bad["region"][rows] = len(pop.regions) + pick[rows] % extra
            elif name == "unknown_mode":
                extra = len(pop.mode_names) - len(pop.modes)
                bad["mode"][rows] = len(pop.modes) + pick[rows] % extra
            elif name == "points_out_of_bounds":
                step = 1 + pick[rows] % 1000
                bad["points"][rows] = np.where(pick[rows] % 2 == 0, pop.points_high + step,
                                               pop.points_low - step)
            elif name == "event_time_in_future":
                landing = origin_us + (bad["slot"][rows] + 1) * slot_us
                skew_us = duration_us(registry.future_skew)
                bad["time"][rows] = landing + skew_us + 60 * _US + pick[rows] % (2 * _DAY_US)
            else:
                bad["missing"][rows] = pick[rows] % len(INPUT_FIELDS)
        parts.append(bad)
    return parts, used


def _fixed_ids(numbers: npt.NDArray[Any], prefix: str, width: int,
               missing: npt.NDArray[np.bool_] | None) -> pa.Array:
    """`prefix` + zero-padded decimal ids as an Arrow string array, built straight from bytes.

    Fixed-width ids need no per-row formatting: a digits matrix and arithmetic offsets, several
    times faster than casting integers to text and joining a prefix.
    """
    head = np.frombuffer(prefix.encode(), dtype=np.uint8)
    n, w = len(numbers), len(head) + width
    if n and int(numbers.max()) >= 10**width:
        raise AssertionError(f"id {int(numbers.max())} does not fit {width} digits")
    chars = np.empty((n, w), dtype=np.uint8)
    chars[:, : len(head)] = head
    rest = numbers.astype(np.uint64 if width > 9 else np.uint32)
    digit = np.empty_like(rest)
    for column in range(w - 1, len(head) - 1, -1):
        np.remainder(rest, 10, out=digit)
        digit += 48
        chars[:, column] = digit
        np.floor_divide(rest, 10, out=rest)
    large = (n + 1) * w >= 2**31  # past int32 offsets: large_string, cast back below
    offsets = np.arange(0, (n + 1) * w, w, dtype=np.int64 if large else np.int32)
    validity, nulls = None, 0
    if missing is not None and missing.any():
        validity = pa.py_buffer(np.packbits(~missing, bitorder="little"))
        nulls = int(missing.sum())
    ids = pa.Array.from_buffers(pa.large_string() if large else pa.string(), n,
                                [validity, pa.py_buffer(offsets), pa.py_buffer(chars)],
                                null_count=nulls)
    return ids.cast(pa.string()) if large else ids


def _arrow(rows: _Rows, pop: _Population, prefix: str, match_width: int) -> pa.Table:
    """The raw batch table (typed columns) for rows; malformed rows become bad values or nulls."""
    missing = rows["missing"]
    masks: dict[str, npt.NDArray[np.bool_] | None] = dict.fromkeys(INPUT_FIELDS)
    if (missing != _MISSING_NONE).any():
        masks = {name: missing == index for index, name in enumerate(INPUT_FIELDS)}

    def indexed(values: pa.Array, index: npt.NDArray[np.generic], name: str) -> pa.Array:
        return values.take(pa.array(index, mask=masks[name]))

    player = rows["player"]
    bad = player >= pop.players  # malformed: an index past the players picks a bad id
    if bad.any():
        player_ids = _fixed_ids(np.where(bad, 0, player), "p", pop.player_width,
                                masks["player_id"])
        player_ids = pc.replace_with_mask(
            player_ids, pa.array(bad), pop.bad_player_ids.take(player[bad] - pop.players))
    else:
        player_ids = _fixed_ids(player, "p", pop.player_width, masks["player_id"])
    return pa.table({
        "match_id": _fixed_ids(rows["match"], prefix, match_width, masks["match_id"]),
        "player_id": player_ids,
        "points": pa.array(rows["points"], mask=masks["points"]),
        "event_time": pa.array(rows["time"].view("M8[us]"), TIMESTAMP, mask=masks["event_time"]),
        "region": indexed(pop.region_names, rows["region"], "region"),
        "mode": indexed(pop.mode_names, rows["mode"], "mode"),
        "server_id": indexed(pop.server_ids, rows["server"], "server_id"),
    })


def _landing_order(rows: _Rows) -> _Rows:
    """Rows by (slot, event_time): batches in landing order, each sorted as the lake stores it.

    Rows come almost in this order already (matches are numbered by arrival), so numpy's
    stable sort (timsort on one packed integer key) mostly finds runs; the lake's own sort by
    event_time then meets sorted input, which is its cheapest case.
    """
    slots, times = rows["slot"], rows["time"]
    if len(slots) == 0:
        return rows
    slot_rel = slots - slots.min()
    time_rel = times - times.min()
    bits = int(time_rel.max()).bit_length()
    if int(slot_rel.max()).bit_length() + bits <= 63:
        order = np.argsort((slot_rel << bits) | time_rel, kind="stable")
    else:
        order = np.lexsort((times, slots))
    return _take(rows, order)


def _batches(spec: GenerateSpec, registry: Registry,
             injected: Injected) -> Iterator[tuple[datetime, pa.Table]]:
    """The season as (landing_time, raw_batch), in landing-time order; counts its dirt."""
    _check(spec, registry)
    rng = np.random.Generator(np.random.PCG64(spec.seed))
    pop = _population(spec, registry, rng)
    origin_us = _micros(spec.start)
    slot_us = spec.batch_minutes * 60 * _US
    prefix = f"m{spec.seed}-"
    # Fewest digits that can number every match: at least two rows per match.
    n_dup, n_late, n_bad = _dirt_counts(spec)
    match_width = len(str(max(spec.days * (spec.events_per_day + n_late) // 2, 1)))
    pending = _empty_rows()
    next_match = 0

    def emit(rows: _Rows) -> Iterator[tuple[datetime, pa.Table]]:
        """One table per slot present; rows are already in landing order."""
        slots = rows["slot"]
        if len(slots) == 0:
            return
        table = _arrow(rows, pop, prefix, match_width)
        bounds = [0, *(np.flatnonzero(np.diff(slots)) + 1).tolist(), len(slots)]
        for begin, end in itertools.pairwise(bounds):
            slot = int(slots[begin])
            landing = from_epoch_us(origin_us + (slot + 1) * slot_us)
            yield landing, table.slice(begin, end - begin)

    for day in range(spec.days):
        day_us = origin_us + day * _DAY_US
        parts = [pending]
        if spec.events_per_day:
            clean, arrival = _matches(rng, pop, spec.events_per_day, day_us, next_match)
            next_match = int(clean["match"][-1]) + 1
            clean["slot"] = (arrival - origin_us) // slot_us
            parts.append(clean)
            if spec.dirty > 0:
                dirt, used = _dirt(rng, pop, spec, registry, clean, arrival, day_us, origin_us,
                                   next_match)
                next_match += used
                parts.extend(dirt)
                injected.duplicates += n_dup
                injected.late += n_late
                injected.malformed += n_bad
        rows = _landing_order(_concat(parts))
        # Every later row arrives at or after the next day's start: earlier slots are complete.
        cut = int(np.searchsorted(rows["slot"], (day_us + _DAY_US - origin_us) // slot_us))
        yield from emit({name: values[:cut] for name, values in rows.items()})
        pending = {name: values[cut:] for name, values in rows.items()}
    yield from emit(pending)


def generate_events(spec: GenerateSpec, registry: Registry) -> Iterator[tuple[datetime, pa.Table]]:
    """Yield (landing_time, raw_batch) per simulated micro-batch in landing order; pure, no I/O.

    A raw batch has the client's typed columns (no ingested_at: landing stamps it); malformed
    rows carry bad strings, out-of-range values or nulls, never a wrong column type.
    """
    return simulate(spec, registry)[0]


def simulate(spec: GenerateSpec, registry: Registry
             ) -> tuple[Iterator[tuple[datetime, pa.Table]], Injected]:
    """`generate_events`, with the count of dirt injected, filled in as the batches are drawn.

    The spec is checked here, so a bad one fails at the call, not at the first batch.
    """
    _check(spec, registry)
    injected = Injected()
    return _batches(spec, registry, injected), injected


def total_rows(spec: GenerateSpec) -> int:
    """Rows the season offers to landing: its events plus the dirt (for progress totals)."""
    events = spec.days * spec.events_per_day
    dirt_per_day = sum(_dirt_counts(spec)) if spec.dirty > 0 and spec.events_per_day else 0
    return events + spec.days * dirt_per_day


# -- direct boards: scores submitted per board ------------------------------------------------

#: Scores per day on each direct board, per match event of the day.
_SCORES_PER_EVENT = 0.02


def generate_scores(spec: GenerateSpec, registry: Registry
                    ) -> Iterator[tuple[datetime, Board, pa.Table]]:
    """Yield (landing_time, board, raw_batch) of score submissions to each direct board of
    the registry (laps, for the default `best-lap`), in landing order; pure, no I/O.

    The players are the season's (same ids); about 2 scores a day per 100 match events.
    Scores cluster near the low tenth of the board's bounds (a lap time well above the
    fastest possible), deltas are spread over the bounds. Deterministic like the events, from
    the seed and the board's place in the registry.
    """
    direct = [b for b in registry.boards if b.direct]
    if not direct or spec.days <= 0 or spec.events_per_day <= 0:
        return iter(())
    width = max(7, len(str(spec.players - 1)))
    slot_us = spec.batch_minutes * 60 * _US
    per_day = max(1, round(spec.events_per_day * _SCORES_PER_EVENT))
    batches: list[tuple[int, int, pa.Table]] = []
    for number, board in enumerate(direct):
        rng = np.random.Generator(np.random.PCG64([spec.seed, 1 + number]))
        total = per_day * spec.days
        day = np.repeat(np.arange(spec.days, dtype=np.int64), per_day)
        at = _micros(spec.start) + day * _DAY_US + rng.integers(0, _DAY_US, total)
        low, high = board.min_points, board.max_points
        if board.aggregation == "sum":
            points = rng.integers(low, high, total, endpoint=True)
        else:
            typical = low + (high - low) // 10
            spread = rng.lognormal(0.0, 0.15, total)
            points = np.clip(np.round(typical * spread), low, high).astype(np.int64)
        players = rng.integers(0, spec.players, total)
        landing = (at // slot_us + 1) * slot_us  # the end of the event's landing slot
        order = np.argsort(landing, kind="stable")
        table = pa.table({
            "match_id": _fixed_ids(np.arange(total), f"s{spec.seed}-{number}-", len(str(total)),
                                   None),
            "player_id": _fixed_ids(players, "p", width, None),
            "points": pa.array(points, pa.int64()),
            "event_time": pa.array(at.view("M8[us]"), TIMESTAMP),
            "server_id": pa.array([f"{board.name}-gs"] * total, pa.string()),
        }).take(pa.array(order))
        landing = landing[order]
        starts = np.flatnonzero(np.concatenate([[True], landing[1:] != landing[:-1]]))
        ends = np.append(starts[1:], total)
        for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
            batches.append((int(landing[start]), number, table.slice(start, end - start)))
    batches.sort(key=lambda b: (b[0], b[1]))
    return ((from_epoch_us(at_us), direct[number], batch) for at_us, number, batch in batches)
