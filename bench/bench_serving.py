"""Benchmark the serving layer: merged rank latency, the batch view's bytes, HTTP throughput.

Starts its own Redis (EmbeddedRedis, no persistence) and prints, as same-run ratios:

1. batch view: a synthetic board-window of --players base players (heavy-tailed scores, many
   ties, ids of the generator's form), loaded as `serving.base.BaseBoard`: resident bytes per
   player (goal <= 32) and build seconds (hash index included).
2. merged rank: `MergedBoard.lookup` (base arrays in process + one Redis script call) for
   random players, --touched of them in the speed state (M and T filled with moved keys),
   p50/p99 against a bare ZREVRANK round trip on the same Redis, interleaved sample by sample
   so both see the same noise (goal: ratio <= 1.5, p99 <= 300 us); and against DuckDB
   `SELECT count(*) FROM standings WHERE sort_key > x` on the same base rows (goal >= 100x).
3. percentiles: `serving.percentiles.keys_at` for the 100-row table (top 1%..100%) and for
   one percent, on the same base and speed state as 2, against DuckDB `quantile_disc` of the
   same 100 fractions over the base rows alone (no speed state). Exact answers both.
4. HTTP (needs wrk on PATH): a real published lake (`leaderboard generate` + `batch`, smaller:
   --http-players), `leaderboard serve --workers 2`, wrk on loopback for top-100 and player
   rank (random players via a wrk Lua script), against a bare FastAPI endpoint returning a
   constant 6 KB JSON on two uvicorn workers, same wrk settings (goals: top-100 >= 5,000
   req/s, rank >= 2,000 req/s).

Figures only, no assertions: the machine is shared, compare the ratios.

Usage: python bench/bench_serving.py [--players 10000000] [--touched 1000000]
       [--samples 20000] [--duckdb-samples 300] [--http-players 100000] [--wrk-seconds 10]
       [--skip base,rank,duckdb,percentiles,http] [--quick]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import redis
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from leaderboard.calendar import Window
from leaderboard.redis_server import EmbeddedRedis
from leaderboard.registry import load_registry
from leaderboard.speed_keys import BoardWindowKeys
from serving.base import BaseBoard
from serving.merge import MergedBoard
from serving.percentiles import keys_at

ROOT = Path(__file__).resolve().parents[1]
console = Console(width=None if sys.stdout.isatty() else 110)


def _row(label: str, value: str) -> None:
    console.print(f"  {label:<62} {value}")


def _percentiles(samples: list[float]) -> tuple[float, float]:
    values = np.array(samples) * 1e6
    return float(np.percentile(values, 50)), float(np.percentile(values, 99))


def synthetic_base(players: int, seed: int) -> tuple[np.ndarray, pa.Array]:
    """Sort keys (descending) and ids in listing order: heavy-tailed sums with many ties."""
    rng = np.random.default_rng(seed)
    keys = np.floor(rng.pareto(1.5, players) * 40).astype(np.int64)
    ids = np.char.add("p", np.char.zfill(rng.permutation(players).astype(str), 9))
    order = np.lexsort((ids, -keys))
    return keys[order], pa.array(ids[order].tolist(), pa.string())


def section_base(keys: np.ndarray, ids: pa.Array) -> BaseBoard:
    started = time.perf_counter()
    board = BaseBoard.of(keys, ids)
    board.position(ids[0].as_py())  # builds the hash index
    seconds = time.perf_counter() - started
    console.print("[bold]1. batch view (BaseBoard)[/]")
    _row("players", f"{board.size:,}")
    _row("resident bytes per player (goal <= 32)", f"{board.nbytes() / board.size:.1f}")
    _row("  of which id bytes (Arrow offsets + data)", f"{ids.nbytes / board.size:.1f}")
    _row("build seconds (keys + hash index)", f"{seconds:.2f}")
    return board


def fill_speed(client: redis.Redis, keys: BoardWindowKeys, board: BaseBoard, touched: int,
               seed: int) -> np.ndarray:
    """Touch `touched` base players: T gets their base key, M a moved key."""
    rng = np.random.default_rng(seed + 1)
    chosen = rng.choice(board.size, size=min(touched, board.size), replace=False)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        task = progress.add_task(f"filling M and T with {len(chosen):,} touched players",
                                 total=len(chosen))
        for start in range(0, len(chosen), 20_000):
            part = chosen[start:start + 20_000]
            names = board.players.take(pa.array(part)).to_pylist()
            base_keys = [board.key_at(int(i)) for i in part]
            moved = rng.integers(0, 50, len(part))
            pipe = client.pipeline(transaction=False)
            pipe.zadd(keys.touched, dict(zip(names, base_keys, strict=True)))
            pipe.zadd(keys.merged, {n: k + int(d) for n, k, d in
                                    zip(names, base_keys, moved, strict=True)})
            pipe.execute()
            progress.advance(task, len(part))
    return chosen


def section_rank(client: redis.Redis, board: BaseBoard, samples: int, seed: int,
                 con: duckdb.DuckDBPyConnection | None, duckdb_samples: int) -> None:
    registry = load_registry()
    spec = registry.board("global")
    from datetime import UTC, datetime
    window = Window(datetime(2026, 1, 1, tzinfo=UTC), "all-time", "all-time", None)
    keys = BoardWindowKeys("global", "all-time", "bench")
    merged = MergedBoard(spec, window, 0, board, client, keys)
    rng = np.random.default_rng(seed + 2)
    picks = rng.integers(0, board.size, samples)
    names = board.players.take(pa.array(picks)).to_pylist()
    touched_names = client.zrandmember(keys.merged, samples)
    for name in names[:200]:  # warm-up: script load, connections, caches
        merged.lookup(name)
        client.zrevrank(keys.merged, name)
    ours, bare = [], []
    for i, name in enumerate(names):
        other = touched_names[i % len(touched_names)]
        started = time.perf_counter()
        merged.lookup(name)
        ours.append(time.perf_counter() - started)
        started = time.perf_counter()
        client.zrevrank(keys.merged, other)
        bare.append(time.perf_counter() - started)
    o50, o99 = _percentiles(ours)
    b50, b99 = _percentiles(bare)
    console.print(f"[bold]2. merged rank[/] ({samples:,} samples, touched "
                  f"{client.zcard(keys.merged):,} of {board.size:,})")
    _row("merged rank (MergedBoard.lookup) p50 / p99 us", f"{o50:.0f} / {o99:.0f}")
    _row("bare ZREVRANK round trip p50 / p99 us", f"{b50:.0f} / {b99:.0f}")
    _row("ratio p50 / p99 (goal <= 1.5; p99 goal <= 300 us)",
         f"{o50 / b50:.2f}x / {o99 / b99:.2f}x")
    if con is None:
        return
    con.execute("SET threads = 2")
    lookups = []
    for name in names[:duckdb_samples]:
        key = merged.lookup(name)[0]
        x = key.sort_key if key else 0
        started = time.perf_counter()
        con.execute("SELECT count(*) FROM standings WHERE sort_key > ?", [x]).fetchall()
        lookups.append(time.perf_counter() - started)
    d50, d99 = _percentiles(lookups)
    _row("DuckDB count(*) WHERE sort_key > x p50 / p99 us", f"{d50:.0f} / {d99:.0f}")
    _row("DuckDB / merged rank, p50 (goal >= 100x)", f"{d50 / o50:.0f}x")


def section_percentiles(client: redis.Redis, board: BaseBoard,
                        con: duckdb.DuckDBPyConnection | None, rounds: int = 20) -> None:
    from datetime import UTC, datetime
    window = Window(datetime(2026, 1, 1, tzinfo=UTC), "all-time", "all-time", None)
    keys = BoardWindowKeys("global", "all-time", "bench")
    merged = MergedBoard(load_registry().board("global"), window, 0, board, client, keys)
    table = [Decimal(y) for y in range(1, 101)]
    keys_at(merged, table)  # warm-up: scripts loaded
    timings: dict[str, list[float]] = {"table": [], "one": []}
    for _ in range(rounds):
        for name, wanted in (("table", table), ("one", [Decimal(1)])):
            started = time.perf_counter()
            keys_at(merged, wanted)
            timings[name].append(time.perf_counter() - started)
    console.print(f"[bold]3. percentiles[/] ({rounds} rounds, base {board.size:,}, M "
                  f"{client.zcard(keys.merged):,}, T {client.zcard(keys.touched):,})")
    t50 = float(np.median(timings["table"])) * 1e3
    _row("100-row table (keys_at) median ms", f"{t50:.1f}")
    _row("one percent median ms", f"{float(np.median(timings['one'])) * 1e3:.1f}")
    if con is None:
        return
    fractions = [y / 100 for y in range(1, 101)]
    lookups = []
    for _ in range(max(3, rounds // 4)):
        started = time.perf_counter()
        con.execute("SELECT quantile_disc(sort_key, ?) FROM standings", [fractions]).fetchall()
        lookups.append(time.perf_counter() - started)
    d50 = float(np.median(lookups)) * 1e3
    _row("DuckDB quantile_disc, 100 fractions, base only, median ms", f"{d50:.1f}")
    _row("DuckDB / merged table", f"{d50 / t50:.1f}x")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_http(url: str, seconds: float = 60) -> None:
    import urllib.request

    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def _wrk(url: str, seconds: int, script: Path | None = None) -> float:
    command = ["wrk", "-t2", "-c64", f"-d{seconds}s", "--latency"]
    if script is not None:
        command += ["-s", str(script)]
    out = subprocess.run([*command, url], capture_output=True, text=True, check=True).stdout
    found = re.search(r"Requests/sec:\s+([\d.]+)", out)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        console.print(f"  [yellow]{errors.group(1)} non-2xx answers from {url}[/]")
    return float(found.group(1)) if found else 0.0


_BARE_APP = '''
from fastapi import FastAPI
from fastapi.responses import Response
app = FastAPI()
BODY = b'{"entries": [' + b",".join(b'{"player_id": "p%09d", "score": 12345, "rank": %d}'
                                    % (i, i) for i in range(110)) + b"]}"
@app.get("/top")
def top() -> Response:
    return Response(BODY, media_type="application/json")
'''


def section_http(players: int, seconds: int, scratch: Path, redis_url: str) -> None:
    if shutil.which("wrk") is None:
        console.print("[yellow]4. HTTP skipped: wrk is not on PATH (apt-get install wrk)[/]")
        return
    cli = [sys.executable, "-m", "app.cli"]
    env = dict(os.environ, LEADERBOARD_DATA=str(scratch / "data"), REDIS_URL=redis_url,
               LEADERBOARD_NOW="2026-11-03T12:00:00+00:00", PYTHONPATH=str(ROOT))
    with console.status(f"generating and publishing {players:,} players"):
        subprocess.run([*cli, "generate", "--players", str(players), "--days", "3",
                        "--events-per-day", str(players * 2), "--start", "2026-11-01",
                        "--seed", "1"], env=env, check=True, capture_output=True)
        subprocess.run([*cli, "batch", "--as-of", "2026-11-02"], env=env, check=True,
                       capture_output=True)
    lua = scratch / "players.lua"
    width = max(7, len(str(players - 1)))
    ids = [f"p{i:0{width}d}" for i in
           np.random.default_rng(3).integers(0, players, 2000)]
    lua.write_text("ids = {" + ",".join(f'"{i}"' for i in ids) + "}\n"
                   "request = function()\n"
                   "  return wrk.format(nil, '/v1/boards/global/players/' .. "
                   "ids[math.random(#ids)])\nend\n")
    bare = scratch / "bare_app.py"
    bare.write_text(_BARE_APP)
    results: dict[str, float] = {}
    port = _free_port()
    server = subprocess.Popen([*cli, "serve", "--port", str(port), "--workers", "2",
                               "--log-level", "warning"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_http(f"{base}/healthz")
        _wrk(f"{base}/v1/boards/global/top?n=100", 2)  # warm-up: caches, base arrays
        _wrk(base, 2, lua)
        results["top"] = _wrk(f"{base}/v1/boards/global/top?n=100", seconds)
        results["rank"] = _wrk(base, seconds, lua)
    finally:
        server.terminate()
        server.wait(30)
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "bare_app:app", "--port",
                               str(port), "--workers", "2", "--log-level", "warning"],
                              cwd=scratch, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_http(f"http://127.0.0.1:{port}/top")
        _wrk(f"http://127.0.0.1:{port}/top", 2)
        results["bare"] = _wrk(f"http://127.0.0.1:{port}/top", seconds)
    finally:
        server.terminate()
        server.wait(30)
    console.print(f"[bold]4. HTTP[/] (wrk -t2 -c64 {seconds}s, 2 uvicorn workers, "
                  f"{players:,} players)")
    _row("bare FastAPI constant ~6 KB JSON, req/s", f"{results['bare']:,.0f}")
    _row("GET top?n=100 req/s (goal >= 5,000)",
         f"{results['top']:,.0f} ({results['top'] / results['bare']:.2f}x bare)")
    _row("GET players/{id} req/s (goal >= 2,000)",
         f"{results['rank']:,.0f} ({results['rank'] / results['bare']:.2f}x bare)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--players", type=int, default=10_000_000)
    parser.add_argument("--touched", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--duckdb-samples", type=int, default=300)
    parser.add_argument("--http-players", type=int, default=100_000)
    parser.add_argument("--wrk-seconds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip", default="")
    parser.add_argument("--quick", action="store_true",
                        help="1M players, 100k touched, 20k HTTP players, 5 s wrk")
    args = parser.parse_args(argv)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if args.quick:
        args.players, args.touched, args.http_players, args.wrk_seconds = (
            1_000_000, 100_000, 20_000, 5)
    console.print(f"[bold]bench_serving[/]: {args.players:,} players, {args.touched:,} "
                  f"touched, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    server = EmbeddedRedis().start()
    try:
        client = redis.Redis.from_url(server.url, protocol=2)
        if not {"base", "rank"} <= skip:
            with console.status("building the synthetic base"):
                keys, ids = synthetic_base(args.players, args.seed)
            board = section_base(keys, ids)
            if "rank" not in skip:
                fill_speed(client, BoardWindowKeys("global", "all-time", "bench"), board,
                           args.touched, args.seed)
                con = None
                if "duckdb" not in skip:
                    con = duckdb.connect()
                    con.register("arrow_t", pa.table({"player_id": ids, "sort_key": keys}))
                    con.execute("CREATE TABLE standings AS SELECT * FROM arrow_t")
                section_rank(client, board, args.samples, args.seed, con, args.duckdb_samples)
                if "percentiles" not in skip:
                    section_percentiles(client, board, con)
            del board, keys, ids
        client.flushall()
        if "http" not in skip:
            with tempfile.TemporaryDirectory(prefix="bench_serving_") as scratch:
                section_http(args.http_players, args.wrk_seconds, Path(scratch), server.url)
    finally:
        server.stop()
    console.print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
