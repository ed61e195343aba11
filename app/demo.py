"""`leaderboard demo`: the main job on embedded defaults, end to end on one machine.

Generates a deterministic season into the data dir (once: a marker records the spec, so a
rerun reuses it), lands it through the validating landing path, and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import shutil
from datetime import timedelta

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
    return 0


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
