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
from datetime import date, datetime, timedelta

from rich.console import Console

from leaderboard.settings import Settings

__all__ = ["run_demo"]


def run_demo(settings: Settings, args: argparse.Namespace, *, out: Console, err: Console) -> int:
    from app.generate import GenerateSpec, generate_season

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



def _fold_today(settings: Settings, season: object, out: Console, err: Console) -> None:
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
    today = replace(season, start=now.date(), days=1, seed=season.seed + 1,  # type: ignore[type-var]
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
    out.print(f"speed layer ({client.connection_pool.connection_kwargs.get('port')}): "
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
    return pq.read_table(newest.path, columns=["ingested_at"]).column("ingested_at")[0].as_py()


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
