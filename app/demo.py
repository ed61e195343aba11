"""`leaderboard demo`: the main job on embedded defaults, end to end on one machine.

Generates a deterministic season into the data dir (once: a marker records the spec, so a
rerun reuses it), lands it through the validating landing path, runs the nightly batch for
every past day (incrementally after the first), refreshes the analysts' warehouse, folds
today's events so far into the speed layer, and prints the game's answers (top 10, a player's
rank with its move since yesterday, percentile and neighbours); `leaderboard demo` then serves
HTTP unless --no-serve.
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from leaderboard.settings import Settings, SettingsError

if TYPE_CHECKING:
    from app.generate import GenerateSpec

__all__ = ["DemoKeys", "demo_keys", "next_steps", "run_demo"]

#: The demo's game server: the credential its printed `curl` uses.
DEMO_SERVER = "demo"


@dataclass(frozen=True)
class DemoKeys:
    """The keys file the demo serves with (created once under the data dir)."""

    path: Path
    server_key: str
    admin_key: str


def demo_keys(data_dir: Path) -> DemoKeys:
    """`<data>/demo-keys.toml`: one server key and an admin key, random, made on first use.

    Without keys `serve` answers 403 to every POST, so the demo would show an API nobody can
    write to. The file is written once (mode 0600, temp + rename) and reused, so a key
    printed by an earlier run stays valid; it is read back through the HTTP app's own loader.
    """
    import os
    import secrets

    from app.http.auth import ApiKeys

    path = data_dir / "demo-keys.toml"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write("# Made by `leaderboard demo` for local use only: never deploy it.\n"
                         f'admin_key = "{secrets.token_urlsafe(24)}"\n'
                         f'[servers]\n{DEMO_SERVER} = "{secrets.token_urlsafe(24)}"\n')
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    keys = ApiKeys.load(path)
    server_key = {c.server_id: c.key for c in keys.servers}.get(DEMO_SERVER)
    if not server_key or keys.admin_key is None:
        raise SettingsError(f"{path} has no key for server {DEMO_SERVER!r} or no admin_key; "
                            "delete the file and rerun the demo to make a new one")
    return DemoKeys(path, server_key, keys.admin_key)


def next_steps(url: str | None, keys: DemoKeys | None, now: datetime) -> str:
    """What to try next: with the API served at `url`, a working POST (with `keys`), a read
    and the admin header; always the CLI, with the line that puts it on PATH if needed."""
    lines = ["", "Try it (in another terminal):" if url else "Try next:"]
    if url is not None and keys is not None:
        event = {"match_id": f"try-{now:%Y%m%d%H%M%S}", "player_id": "you", "points": 500,
                 "event_time": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "region": "na",
                 "mode": "ranked"}
        lines += [
            f"  server key ({DEMO_SERVER}): {keys.server_key}   admin key: {keys.admin_key}",
            f"  (in {keys.path}; `leaderboard serve` uses it with "
            f"LEADERBOARD_API_KEYS={keys.path})",
            f"  curl -s -X POST {url}/v1/events -H 'Authorization: Bearer {keys.server_key}' \\",
            f"       -H 'Content-Type: application/json' -d '{json.dumps({'events': [event]})}'",
            f"  curl -s {url}/v1/boards/global/players/you",
            f"  curl -s -X POST {url}/v1/admin/bans -H 'X-Admin-Key: {keys.admin_key}' \\",
            "       -H 'Content-Type: application/json' -d '{\"player_id\": \"you\"}'",
        ]
    if url is not None:
        lines += [f"  curl -s '{url}/v1/boards/global/top?n=5'"]
    activate = _activation()
    if activate:
        lines += [f"  {activate}     # puts `leaderboard` on PATH"]
    lines += ["  leaderboard top global -n 5    leaderboard speed status    leaderboard sql"]
    return "\n".join(lines)


def _activation() -> str | None:
    """The line that puts this interpreter's `leaderboard` on PATH, if it is not already."""
    import shutil
    import sys

    scripts = Path(sys.executable).parent
    found = shutil.which("leaderboard")
    if found and Path(found).parent == scripts:
        return None
    activate = scripts / "activate"
    if not activate.exists():
        return f"export PATH={scripts}:$PATH"
    try:
        shown = activate.relative_to(Path.cwd())
    except ValueError:
        shown = activate
    return f". {shown}"


def run_demo(settings: Settings, args: argparse.Namespace, *, out: Console, err: Console) -> int:
    from app.generate import GenerateSpec
    from app.season import generate_season

    lake = settings.lake_dir
    marker = settings.data_dir / "demo.json"
    if args.fresh and lake.exists():
        shutil.rmtree(lake)
        marker.unlink(missing_ok=True)
    start = settings.now().date() - timedelta(days=args.days)
    spec = GenerateSpec(players=args.players, days=args.days, events_per_day=args.events_per_day,
                        start=start, seed=args.seed, dirty=args.dirty, writer="demo")
    wanted = {"players": spec.players, "days": spec.days, "events_per_day": spec.events_per_day,
              "start": spec.start.isoformat(), "seed": spec.seed, "dirty": spec.dirty,
              "registry": settings.registry.fingerprint}
    if marker.exists() and json.loads(marker.read_text()) == wanted:
        err.print(f"season already generated in {lake} (same spec); reusing it")
    else:
        if marker.exists() or (lake / "events").exists():
            err.print(f"[red]error:[/red] {lake} holds other data than this demo spec; rerun "
                      "with --fresh to replace it, or point LEADERBOARD_DATA elsewhere")
            return 2
        err.print(f"generating {spec.days} days x {spec.events_per_day:,} events for "
                  f"{spec.players:,} players from {spec.start} into {lake} ...")
        report = generate_season(spec, settings.registry, lake)
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps(wanted))
        out.print(f"generated {report.rows:,} rows in {report.seconds:.1f} s "
                  f"({report.rows / max(report.seconds, 1e-9):,.0f} rows/s): "
                  f"{report.accepted:,} landed in {report.files:,} files, "
                  f"{report.rejected:,} quarantined, {report.duplicates_in_batch:,} "
                  "in-batch retries dropped")
    _summarise_lake(settings, out)
    _run_batches(settings, spec.start, settings.now().date() - timedelta(days=1), out, err)
    _fold_today(settings, spec, out, err)
    _show_answers(settings, out)
    url = f"http://{args.host}:{args.port}/"
    if args.serve:
        out.print(f"console: {url}  (live boards, players, distribution, operations)")
    else:
        out.print(f"console: {url} once `leaderboard serve --port {args.port}` runs")
    return 0


def _show_answers(settings: Settings, out: Console) -> None:
    """The game's questions, answered by the serving layer (batch view + speed layer)."""
    from app.cli import render_around, render_rank, render_top
    from leaderboard.speed_keys import connect
    from serving.service import Leaderboards, encode_cursor

    boards = Leaderboards(settings.lake_dir, settings.registry, connect(settings),
                          now=settings.now)
    top = boards.top("global", 10, "all-time")
    out.print(render_top(top))
    if not top["entries"]:
        return
    # A player from the middle of the board: someone whose rank moves today.
    middle = boards.top("global", 1, "all-time",
                        encode_cursor(max(0, top["total"] // 2)))["entries"]
    player = (middle or top["entries"])[0]["player_id"]
    out.print(render_rank(boards.player("global", player, "all-time")))
    out.print(render_around(boards.around("global", player, 3, "all-time"), player))
    weekly = boards.player("global", player, "weekly")
    out.print(render_rank(weekly))
    for board in settings.registry.boards:
        if board.direct:  # fed by score submissions (the generated laps), not by matches
            out.print(render_top(boards.top(board.name, 5, "all-time")))



def _fold_today(settings: Settings, season: GenerateSpec, out: Console, err: Console) -> None:
    """Today's events so far, through the live ingest path: door, landing, fold into Redis."""
    from dataclasses import replace

    from app.generate import generate_events
    from leaderboard.manifest import read_current
    from leaderboard.speed_keys import connect
    from speed_layer.ingest import Ingestor, open_writer
    from speed_layer.service import SpeedLayer

    now = settings.now()
    client = connect(settings)
    speed = SpeedLayer(client, settings.registry, settings.lake_dir)
    published = read_current(settings.lake_dir)
    if published is not None:
        speed.rebase(published)  # a no-op when the speed layer is already on it
    repaired = speed.repair()
    today = replace(season, start=now.date(), days=1, seed=season.seed + 1,
                    writer="live")
    accepted = retries = 0
    with err.status("folding today's events into the speed layer"):
        writer = open_writer(settings.lake_dir, "live")
        try:
            ingestor = Ingestor(settings.registry, writer, speed)
            landed_until = _landed_until(settings)
            for landing_time, batch in generate_events(today, settings.registry):
                if landing_time > now:
                    break
                if landed_until is not None and landing_time <= landed_until:
                    continue  # a rerun: this batch is already in the lake
                report = ingestor.ingest(batch, now=landing_time, source="demo:live")
                accepted += report.accepted
                retries += report.retries
        finally:
            writer.close()
    status = speed.status()
    out.print(f"speed layer (Redis port {client.connection_pool.connection_kwargs.get('port')}): "
              f"{accepted:,} of today's events folded ({retries:,} retries dropped at the door"
              f"{f', {repaired} pending file(s) repaired' if repaired else ''}); "
              f"{status.board_windows} live board-windows, {status.keys} keys, "
              f"{status.memory_bytes / 1e6:.1f} MB, base {status.version}")


def _landed_until(settings: Settings) -> datetime | None:
    """The newest ingested_at landed by the demo's live writer (reruns skip those batches)."""
    import pyarrow.parquet as pq

    from leaderboard.lake import landed_files

    live = [f for f in landed_files(settings.lake_dir) if f.writer == "live"]
    if not live:
        return None
    newest = max(live, key=lambda f: f.seq)
    stamp: datetime = pq.read_table(newest.path, columns=["ingested_at"]).column(
        "ingested_at")[0].as_py()
    return stamp


def _run_batches(settings: Settings, first: date, last: date, out: Console,
                 err: Console) -> None:
    """The nightly batch for every past day not yet published (incremental after the first)."""
    from rich.table import Table

    from jobs.batch import run_batch
    from jobs.warehouse import refresh_warehouse
    from leaderboard.batch_view import open_current
    from leaderboard.manifest import list_versions

    done = {m.as_of for m in list_versions(settings.lake_dir)}
    day = first
    with err.status("nightly batches") as status:
        while day <= last:
            if day.isoformat() not in done:
                status.update(f"batch as of {day}")
                result = run_batch(settings, day)
                err.log(f"batch {day}: {result.mode}, {result.events:,} new events, "
                        f"{result.windows_built} board-windows in {result.seconds:.1f} s")
            day += timedelta(days=1)
        status.update("refreshing the analysts' warehouse")
        warehouse = refresh_warehouse(settings.data_dir, settings.registry)
    view = open_current(settings.lake_dir)
    if view is None:
        return
    table = Table(title=f"global all-time, batch as of {view.as_of}", title_justify="left")
    for name in ("rank", "player", "score", "percentile", "matches"):
        table.add_column(name, justify="right" if name != "player" else "left")
    standings = view.standings("global", "all-time")
    for row in (standings.slice(0, 10).to_pylist() if standings is not None else []):
        table.add_row(str(row["rank"]), row["player_id"], f"{row['score']:,}",
                      f"{row['percentile']:.2f}", f"{row['matches']:,}")
    out.print(table)
    out.print(f"analysts' warehouse: {warehouse}  (query it: leaderboard sql)")


def _summarise_lake(settings: Settings, out: Console) -> None:
    import duckdb
    from rich.table import Table

    events = settings.lake_dir / "events" / "*" / "*.parquet"
    quarantine = settings.lake_dir / "quarantine" / "*" / "*.parquet"
    con = duckdb.connect()
    try:
        rows = con.execute(
            "SELECT count(*), count(DISTINCT player_id), count(DISTINCT (match_id, player_id)),"
            " min(event_time), max(event_time), count(DISTINCT filename) "
            "FROM read_parquet(?, filename = true)", [str(events)]).fetchall()[0]
        table = Table(title="landing zone", title_justify="left")
        for name in ("rows", "players", "distinct events", "first event", "last event", "files"):
            table.add_column(name, justify="right")
        table.add_row(*(f"{v:,}" if isinstance(v, int) else str(v) for v in rows))
        out.print(table)
        if list(settings.lake_dir.glob("quarantine/*/*.parquet")):
            reasons = con.execute(
                "SELECT reason, count(*) FROM read_parquet(?) GROUP BY 1 ORDER BY 2 DESC",
                [str(quarantine)]).fetchall()
            table = Table(title="quarantine", title_justify="left")
            table.add_column("reason")
            table.add_column("rows", justify="right")
            for reason, count in reasons:
                table.add_row(reason, f"{count:,}")
            out.print(table)
    finally:
        con.close()
