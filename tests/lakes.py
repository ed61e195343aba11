"""Small hand-made lakes for tests: random but seeded event streams landed in batches."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa

from leaderboard.lake import LandedFile, LandingWriter, atomic_write_parquet
from leaderboard.registry import Registry, parse_registry
from leaderboard.schema import TIMESTAMP
from speed_layer.ingest import Ingestor
from speed_layer.service import SpeedLayer

__all__ = ["EVERY_KIND", "EXOTIC", "day", "killed_batch", "land", "random_scores",
           "random_stream", "registry_from", "write_registry"]

#: Every aggregation, both orders, both tie policies, two graces, windows per board, direct
#: boards of min and sum: the registry engine parity and the bench's plain statement run on.
EVERY_KIND = {
    "regions": ["na", "eu", "asia"],
    "modes": ["ranked", "casual"],
    "limits": {"grace": "1d"},
    "board_defaults": {"min_points": 0, "max_points": 100},
    "boards": [
        {"scope": "global"},
        {"scope": "region:*"},
        {"scope": "global", "name": "best", "aggregation": "max", "ties": "earliest"},
        {"scope": "mode:*", "name": "low:*", "aggregation": "min", "order": "asc"},
        {"scope": "mode:*", "name": "latest:*", "aggregation": "last",
         "windows": ["daily", "weekly", "all-time"], "grace": "2h"},
        {"scope": "region:na", "name": "fewest-na", "order": "asc", "ties": "earliest",
         "windows": ["daily", "monthly", "season", "all-time"]},
        # Direct boards (scores submitted to them; the generated season has some of each).
        {"name": "best-lap", "source": "direct", "aggregation": "min", "order": "asc",
         "ties": "earliest", "windows": ["daily", "weekly", "all-time"], "min_points": 1,
         "max_points": 100000},
        {"name": "coins", "source": "direct", "windows": ["daily", "all-time"],
         "min_points": -5, "max_points": 50},
    ],
}

#: A registry exercising every aggregation, both orders, both tie policies, custom windows
#: and a short grace.
EXOTIC = {
    "regions": ["na", "eu"],
    "modes": ["ranked", "casual"],
    "limits": {"grace": "1d"},
    "board_defaults": {"min_points": -50, "max_points": 100},
    "boards": [
        {"scope": "global"},
        {"scope": "global", "name": "best", "aggregation": "max", "ties": "earliest"},
        {"scope": "region:*", "name": "worst:*", "aggregation": "min", "order": "asc"},
        {"scope": "mode:*", "name": "latest:*", "aggregation": "last",
         "windows": ["daily", "weekly", "all-time"], "grace": "2h"},
        {"scope": "mode:ranked", "name": "speedrun", "aggregation": "min", "order": "asc",
         "ties": "earliest", "windows": ["daily", "monthly", "season", "all-time"]},
        # A direct board (scores submitted to it, never match events): deltas of both signs.
        {"name": "coins", "source": "direct", "windows": ["daily", "weekly", "all-time"],
         "min_points": -5, "max_points": 20},
    ],
}


def registry_from(raw: dict) -> Registry:
    return parse_registry(raw, source="test")


def random_stream(seed: int, *, start: datetime, days: int = 3, matches: int = 60,
                  players: int = 25, regions: tuple[str, ...] = ("na", "eu"),
                  modes: tuple[str, ...] = ("ranked", "casual"),
                  points: tuple[int, ...] = (0, 1, 3, 5, 5, 10), late_share: float = 0.1,
                  duplicate_share: float = 0.1) -> list[dict]:
    """Events as dicts with an `ingested_at`: ties, late arrivals and re-deliveries."""
    rng = random.Random(seed)
    events = []
    for number in range(matches):
        event_time = start + timedelta(seconds=rng.randrange(days * 86400))
        region, mode = rng.choice(regions), rng.choice(modes)
        delay = timedelta(seconds=rng.randrange(1, 600))
        if rng.random() < late_share:
            delay = timedelta(hours=rng.choice([3, 30, 200]))
        for player in rng.sample(range(players), rng.randint(2, 4)):
            events.append({
                "match_id": f"m{seed}-{number}", "player_id": f"p{player:03d}",
                "points": rng.choice(points), "event_time": event_time, "region": region,
                "mode": mode, "server_id": "s1", "ingested_at": event_time + delay,
            })
    for event in list(events):
        if rng.random() < duplicate_share:
            again = dict(event)
            again["ingested_at"] = event["ingested_at"] + timedelta(minutes=rng.randrange(1, 3000))
            if rng.random() < 0.3:
                again["points"] = event["points"] + 1  # a retry with other content: first wins
            events.append(again)
    return events


def random_scores(seed: int, registry: Registry, *, start: datetime, days: int = 3,
                  scores: int = 30, players: int = 25) -> list[dict]:
    """Scores submitted to each direct board of the registry (dicts with `board`, as `land`
    takes them): values at the board's bounds and between (ties), some late, some retried
    with another value, some sharing a match id with a match event of random_stream."""
    rng = random.Random(seed)
    found = []
    for board in (b for b in registry.boards if b.direct):
        values = sorted({board.min_points, board.max_points, (board.min_points
                                                              + board.max_points) // 2})
        for number in range(scores):
            event_time = start + timedelta(seconds=rng.randrange(days * 86400))
            delay = timedelta(minutes=rng.randrange(1, 90))
            if rng.random() < 0.1:
                delay = timedelta(days=rng.choice([2, 9]))  # late: past some graces
            found.append({"match_id": f"m{rng.choice([1, 2])}-{number % 7}", "board": board.name,
                          "player_id": f"p{rng.randrange(players):03d}",
                          "points": rng.choice(values), "event_time": event_time,
                          "server_id": "s1", "ingested_at": event_time + delay})
            if rng.random() < 0.1:  # a retry with another value: the first ingested wins
                found.append(dict(found[-1], points=rng.choice(values),
                                  ingested_at=found[-1]["ingested_at"] + timedelta(hours=2)))
    return found


def land(lake: Path, registry: Registry, events: list[dict], *, writer: str = "t",
         batch_minutes: int = 60, speed: SpeedLayer | None = None) -> int:
    """Land events in micro-batches by ingested_at (each batch stamped with its slot end),
    folding them into `speed` too when given. An event with a `board` is a score submitted
    to that direct board (its region and mode are not read); each board's scores of a slot
    are one submission batch, landed after the slot's match events."""
    slots: dict[tuple[datetime, str], list[dict]] = {}
    for event in events:
        at = event["ingested_at"]
        slot = at.replace(minute=0, second=0, microsecond=0) + timedelta(minutes=batch_minutes)
        slots.setdefault((slot, event.get("board") or ""), []).append(event)
    landed = 0
    with LandingWriter(lake, writer) as handle:
        ingestor = Ingestor(registry, handle, speed)
        for slot, board in sorted(slots):
            rows = slots[(slot, board)]
            table = pa.table({
                "match_id": [r["match_id"] for r in rows],
                "player_id": [r["player_id"] for r in rows],
                "points": pa.array([r["points"] for r in rows], pa.int64()),
                "event_time": pa.array([r["event_time"] for r in rows], TIMESTAMP),
                "region": [r.get("region", "") for r in rows],
                "mode": [r.get("mode", "") for r in rows],
                "server_id": [r["server_id"] for r in rows],
            })
            report = ingestor.ingest(table, now=slot, source="test",
                                     board=registry.board(board) if board else None)
            landed += report.accepted
    return landed


def day(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def write_registry(path: Path, raw: dict) -> None:
    """Write a registry dict as TOML (enough of TOML for the test registries)."""
    lines = []
    for key in ("regions", "modes"):
        lines.append(f"{key} = {raw[key]!r}".replace("'", '"'))
    for table in ("calendar", "limits", "board_defaults"):
        if table in raw:
            lines.append(f"[{table}]")
            for k, v in raw[table].items():
                if k == "seasons":  # a list of {id, start, end}: inline tables
                    v = "[" + ", ".join("{" + ", ".join(f'{f} = "{s[f]}"' for f in s) + "}"
                                        for s in v) + "]"
                    lines.append(f"{k} = {v}")
                    continue
                lines.append(f"{k} = {v!r}".replace("'", '"'))
    for board in raw["boards"]:
        lines.append("[[boards]]")
        for k, v in board.items():
            lines.append(f"{k} = {v!r}".replace("'", '"'))
    path.write_text("\n".join(lines) + "\n")


def batches(events: list[dict]) -> list[tuple]:
    """Group events into hourly landing batches: [(landing time, table)], as a game server
    would send them."""
    slots: dict = {}
    for event in events:
        slot = event["ingested_at"].replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
        slots.setdefault(slot, []).append(event)
    result = []
    for slot in sorted(slots):
        rows = slots[slot]
        result.append((slot, pa.table({
            "match_id": [r["match_id"] for r in rows], "player_id": [r["player_id"] for r in rows],
            "points": pa.array([r["points"] for r in rows], pa.int64()),
            "event_time": pa.array([r["event_time"] for r in rows], TIMESTAMP),
            "region": [r["region"] for r in rows], "mode": [r["mode"] for r in rows],
            "server_id": ["s1"] * len(rows)})))
    return result


def land_legacy_backfill(lake: Path, writer: str, events: pa.Table,
                         stamps: pa.Array) -> LandedFile:
    """One file as backfills were landed before issue 10 item 4: every row stamped with its
    own ingested_at, no `backfill` column, in the partition of its earliest stamp. Lakes
    landed then still hold such files; compaction and retention must keep their guards."""
    stamped = events.append_column("ingested_at", stamps.cast(TIMESTAMP))
    day = min(stamped.column("ingested_at").to_pylist()).date()
    with LandingWriter(lake, writer) as handle:
        seq = handle._reserve()
        target = handle._target("events", day, seq)
        atomic_write_parquet(stamped, target, sort_by="event_time")
    return LandedFile(writer, seq, day, target, stamped.num_rows)


def killed_batch(data: Path, as_of: date, *, at: str = "batch.standings", cut: bool = True,
                 env: dict[str, str] | None = None) -> str:
    """A batch run of the data dir `data` killed (SIGKILL) at fault checkpoint `at`, in a
    process of its own (`env`: more of its environment, a registry say); returns its run
    id. What it leaves is what a kill leaves: its lock file (the tombstone), and its
    rollup, standings and histogram files no manifest names. `cut`: each of those files
    cut to half its bytes, as the one a writer was writing in place when it was killed
    (any of them may be)."""
    lake = data / "lake"
    before = set((lake / "runs").glob("*.lock"))
    code = ("from datetime import date; from jobs.batch import run_batch; "
            "from leaderboard.settings import Settings; "
            f"run_batch(Settings.from_env(), date.fromisoformat({as_of.isoformat()!r}))")
    process = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
             **(env or {}), "LEADERBOARD_DATA": str(data), "LEADERBOARD_FAULTS": f"{at}=kill"})
    assert process.returncode == -9, process.stderr.decode()[-2000:]
    (lock,) = set((lake / "runs").glob("*.lock")) - before
    run = lock.name.removesuffix(".lock")
    if cut:
        files = list((lake / "rollups" / f"run={run}").glob("*.parquet"))
        for kind in ("standings", "histograms"):
            files += (lake / kind).glob(f"as_of={as_of}/*/*/part-{run}.parquet")
        assert files, "the killed run wrote no file"
        for path in files:
            os.truncate(path, path.stat().st_size // 2)
    return run
