"""The `leaderboard` command: one entry point for people, demos and operators.

Usage: leaderboard [--data DIR] [--config REGISTRY] [--now ISO] COMMAND ...

Exit codes: 0 done (rows may still have been rejected: see the report), 1 an input could not
be read or a step failed, 2 bad usage or configuration.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from leaderboard.calendar import WindowError
from leaderboard.lake import WriterBusy
from leaderboard.registry import RegistryError
from leaderboard.settings import Settings, SettingsError
from leaderboard.timeutil import format_instant

__all__ = ["main"]

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


class UsageError(Exception):
    """Bad usage or configuration: exit code 2 with the message."""


def _settings(args: argparse.Namespace) -> Settings:
    settings = Settings.from_env(
        data_dir=getattr(args, "data", None), config=getattr(args, "config", None),
        redis_url=getattr(args, "redis_url", None), engine=getattr(args, "engine", None),
        now_override=getattr(args, "now", None),
    )
    from leaderboard.binding import bind_registry

    # Validate the registry before any work starts, and refuse one the data dir is not
    # bound to (`lake rebind` rebinds on purpose).
    bind_registry(settings.lake_dir, settings.registry,
                  rebind=(getattr(args, "command", None), getattr(args, "action", None))
                  == ("lake", "rebind"))
    return settings


def _speed_layer(settings: Settings, *, start: bool = True) -> Any:
    """The speed layer on REDIS_URL or the local server (started if `start`), or None."""
    import redis

    from leaderboard.speed_keys import connect
    from speed_layer.service import SpeedLayer

    if (settings.redis_url is None and not start
            and not (settings.data_dir / "redis" / "server.json").exists()):
        return None
    try:
        client = connect(settings)
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError, RuntimeError) as exc:
        err.print(f"[yellow]warning:[/yellow] speed layer unreachable ({exc}); events are "
                  "landed and the batch will absorb them; run `leaderboard speed repair` "
                  "when Redis is back")
        return None
    return SpeedLayer(client, settings.registry, settings.lake_dir)


def day_flag(text: str | None, flag: str) -> date | None:
    """A YYYY-MM-DD flag's date (None when not given); anything else is bad usage that
    names the flag, not a traceback."""
    if text is None:
        return None
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise UsageError(f"{flag} `{text}` is not a calendar date; use YYYY-MM-DD") from None


def _print_reasons(title: str, reasons: dict[str, int]) -> None:
    if not reasons:
        return
    table = Table(title=title, title_justify="left")
    table.add_column("reason")
    table.add_column("rows", justify="right")
    for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1])[:10]:
        table.add_row(reason, f"{count:,}")
    out.print(table)


# -- generate ---------------------------------------------------------------------------------

def _cmd_generate(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from app.generate import GenerateSpec
    from app.season import generate_season

    settings = _settings(args)
    start = day_flag(args.start, "--start") or (
        settings.now().date() - timedelta(days=args.days))
    spec = GenerateSpec(players=args.players, days=args.days, events_per_day=args.events_per_day,
                        start=start, seed=args.seed, dirty=args.dirty, writer=args.writer)
    with Progress(TextColumn("generating"), BarColumn(), TextColumn("{task.completed:,} rows"),
                  TimeRemainingColumn(), console=err, transient=True) as progress:
        task = progress.add_task("generate", total=spec.days * spec.events_per_day)

        def advance(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        try:
            report = generate_season(spec, settings.registry, settings.lake_dir,
                                     progress=advance)
        except ValueError as exc:
            if not str(exc).startswith("GenerateSpec."):
                raise
            # A spec refused before anything lands: named by its flag, not the field.
            raise UsageError(re.sub(r"GenerateSpec\.(\w+)=",
                                    lambda m: f"--{m.group(1).replace('_', '-')} ",
                                    str(exc))) from None
    summary = {
        "players": spec.players, "days": spec.days, "start": spec.start.isoformat(),
        "events": report.events, "rows": report.rows, "accepted": report.accepted,
        "rejected": report.rejected, "duplicates_in_batch": report.duplicates_in_batch,
        "files": report.files, "quarantine_files": report.quarantine_files,
        "seconds": round(report.seconds, 3),
        "events_per_second": round(report.rows / report.seconds) if report.seconds else None,
        "reasons": report.reasons, "lake": str(settings.lake_dir),
    }
    if args.json:
        print(json.dumps(summary))
        return 0
    out.print(f"generated {report.rows:,} rows ({report.events:,} clean events, "
              f"{spec.players:,} players, {spec.days} days from {spec.start}) in "
              f"{report.seconds:.1f} s = {summary['events_per_second'] or 0:,} rows/s")
    out.print(f"landed {report.accepted:,} events in {report.files:,} files under "
              f"{settings.lake_dir}; quarantined {report.rejected:,}; "
              f"{report.duplicates_in_batch:,} in-batch retries dropped")
    _print_reasons("quarantine reasons", report.reasons)
    return 0


# -- ingest -----------------------------------------------------------------------------------

def _cmd_ingest(args: argparse.Namespace) -> int:
    from app.sources import SourceError, read_source
    from speed_layer.ingest import Ingestor, IngestReport, open_writer

    settings = _settings(args)
    total = IngestReport()
    per_file: list[dict[str, Any]] = []
    failures: list[str] = []
    writer = open_writer(settings.lake_dir, args.writer)
    speed = None if args.no_speed else _speed_layer(settings)
    try:
        if speed is not None:
            repaired = _repair(speed, settings)
            if repaired:
                err.print(f"speed layer: folded {repaired} landed file(s) left pending")
        ingestor = Ingestor(settings.registry, writer, speed)
        for name in args.files:
            path = Path(name)
            try:
                batch = read_source(path)
            except SourceError as exc:
                failures.append(str(exc))
                err.print(f"[red]error:[/red] {exc}")
                continue
            report = ingestor.ingest(
                batch.table, now=settings.now(), source=str(path), backfill=args.backfill,
                default_server_id=args.server_id, unparseable=batch.unparseable,
            )
            total.add(report)
            per_file.append({"file": str(path), "format": batch.format,
                             "skipped": batch.skipped, **report.as_dict()})
    finally:
        writer.close()
    if args.json:
        print(json.dumps({"files": per_file, "total": total.as_dict(), "errors": failures}))
    else:
        for item in per_file:
            extra = f", {item['skipped']:,} unplayed fixtures skipped" if item["skipped"] else ""
            out.print(f"{item['file']} ({item['format']}): {item['rows']:,} rows, "
                      f"{item['accepted']:,} accepted, {item['rejected']:,} rejected, "
                      f"{item['duplicates']:,} in-batch retries dropped, {item['retries']:,} "
                      f"retries dropped at the door{extra}")
        out.print(f"total: {total.accepted:,} accepted in {len(total.files)} landed file(s), "
                  f"{total.rejected:,} quarantined" + (" (backfill)" if args.backfill else ""))
        _print_reasons("top rejection reasons", dict(total.reasons))
    if total.fold_error:
        err.print(f"[yellow]warning:[/yellow] rows were landed but the fold into the speed "
                  f"layer failed ({total.fold_error}); run `leaderboard speed repair` when "
                  "Redis is back")
    if not args.json and (total.reasons.get("unknown_mode")
                          or total.reasons.get("unknown_region")):
        err.print("hint: rows name regions/modes the registry does not have; for the "
                  "football results use --config football")
    if total.in_flight:
        err.print(f"[yellow]retry:[/yellow] {total.in_flight:,} row(s) were not landed: "
                  f"writer(s) {', '.join(total.in_flight_writers)} are landing the same ids "
                  "right now; run the same ingest again shortly (rows already landed count as "
                  "retries then)")
        return 75  # EX_TEMPFAIL: try again later
    return 1 if failures else 0


# -- batch ----------------------------------------------------------------------------------

def _cmd_batch(args: argparse.Namespace) -> int:
    from jobs.batch import FullAfterRetention, OpenNightRefused, run_batch
    from jobs.publish import PublishError, RewindRefused, not_published
    from jobs.warehouse import refresh_warehouse

    settings = _settings(args)
    as_of = day_flag(args.as_of, "--as-of") or (settings.now().date() - timedelta(days=1))
    with err.status(f"batch as of {as_of}") as status:

        def step(message: str) -> None:
            status.update(message)
            err.log(message)

        try:
            OpenNightRefused.check_clock(settings.now(), args.allow_open_day)
            result = run_batch(settings, as_of, full=args.full, step=step,
                               allow_rewind=args.allow_rewind, now=settings.now(),
                               allow_open_day=args.allow_open_day)
        except (RewindRefused, FullAfterRetention, OpenNightRefused) as exc:
            raise UsageError(str(exc)) from None
        except PublishError as exc:
            err.print(f"[red]error:[/red] {not_published(settings.lake_dir, as_of, exc)}")
            return 1
        status.update("refreshing the analysts' warehouse")
        warehouse = refresh_warehouse(settings.data_dir, settings.registry)
        speed = _speed_layer(settings, start=False)
        rebased = None
        if speed is not None:
            status.update("rebasing the speed layer")
            rebased = speed.rebase(result.manifest).version
    manifest = result.manifest
    summary = {"version": manifest.version, "as_of": manifest.as_of, "mode": result.mode,
               "engine": manifest.engine, "new_events": result.events,
               "events": manifest.inputs.get("events"), "windows_built": result.windows_built,
               "rows_written": result.standings_rows, "seconds": round(result.seconds, 3),
               "warehouse": str(warehouse), "boards": manifest.boards,
               "speed_rebased_to": rebased}
    if args.json:
        print(json.dumps(summary))
        return 0
    out.print(f"published {manifest.version} ({result.mode}, {manifest.engine}): "
              f"{result.events:,} new events, {result.windows_built:,} board-windows rebuilt, "
              f"{result.standings_rows:,} standings rows in {result.seconds:.1f} s")
    out.print(f"warehouse: {warehouse} (query it: leaderboard sql, read-only)")
    if rebased:
        out.print(f"speed layer rebased onto {rebased}")
    return 0


# -- sql ------------------------------------------------------------------------------------

def _cmd_sql(args: argparse.Namespace) -> int:
    from app.sql_shell import SqlError, WarehouseMissing, open_warehouse, read_sql, run_once, shell

    settings = _settings(args)
    _bounded(args.max_rows, "--max-rows", 1, 1_000_000)
    try:
        con = open_warehouse(settings.data_dir)
    except WarehouseMissing as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 1
    try:
        sql = read_sql(args.query, args.file)
        if sql is None:
            return shell(con, out=out, err=err, limit=args.max_rows)
        run_once(con, sql, out=out, as_json=args.json, limit=args.max_rows)
        return 0
    except SqlError as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 1
    except OSError as exc:
        raise UsageError(f"cannot read --file {args.file}: {exc.strerror}") from None
    finally:
        con.close()


# -- speed layer ------------------------------------------------------------------------------

def _require_speed(settings: Settings) -> Any:
    speed = _speed_layer(settings)
    if speed is None:
        raise UsageError("the speed layer needs Redis: set REDIS_URL or leave it unset for the "
                         "local server under the data dir")
    return speed


def _repair(speed: Any, settings: Settings) -> int:
    """Fold what is pending; a speed state that lost its past (Redis lost its data) is
    rebuilt from the lake first, as the operator running this would expect."""
    from leaderboard.speed_keys import StateLost

    try:
        return int(speed.repair())
    except StateLost as exc:
        err.print(f"speed layer: {str(exc).split(';')[0]}: rebuilding it from the lake")
        return int(speed.rebuild(settings.now()))


def _status_value(key: str, value: Any) -> str:
    """One speed-status field for people: counts with separators, bytes in MB, per-writer
    maps as `writer seq` pairs, nothing as `none`."""
    if value is None or value == {} or value == []:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) and key.endswith("bytes"):
        return f"{value / 1e6:,.1f} MB"
    if isinstance(value, int | float):
        return f"{value:,}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_status_value(k, v)}" for k, v in sorted(value.items()))
    if isinstance(value, list | tuple):
        return ", ".join(_status_value(key, v) for v in value)
    return str(value)


#: Labels for the speed status fields a person may not guess; others are spelt out as named.
_STATUS_LABELS = {"version": "batch version (base)", "watermark": "watermark",
                  "board_windows": "live board-windows", "lag_files": "files not yet folded",
                  "holes": "files left unfolded behind later ones", "state": "speed state",
                  "newest_landed": "newest landed file per writer",
                  "folded": "folded through, per writer", "keys": "Redis keys",
                  "memory_bytes": "Redis memory", "banned": "banned players",
                  "open_day_cut_ahead": "open-day cut ahead of the clock (stamps landings)"}


def render_speed_status(status: dict[str, Any]) -> Table:
    """`speed status` as a two-column table (the JSON keys stay as they are for --json)."""
    table = Table(title="speed layer", title_justify="left", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for key, value in status.items():
        table.add_row(_STATUS_LABELS.get(key, key.replace("_", " ")), _status_value(key, value))
    return table


def _cmd_speed(args: argparse.Namespace) -> int:
    settings = _settings(args)
    speed = _require_speed(settings)
    if args.action == "status":
        status = speed.status().as_dict()
        if args.json:
            print(json.dumps(status))
        else:
            out.print(render_speed_status(status))
        return 0
    if args.action == "rebuild":
        with err.status("rebuilding the speed state from the lake"):
            folded = speed.rebuild(settings.now())
            _leaderboards(settings).profiles.reload(settings.now())  # the serving cache too
        version = speed.current().version
        if args.json:
            print(json.dumps({"action": "rebuild", "version": version, "folded_files": folded}))
        else:
            out.print(f"rebuilt {version or 'no batch yet'}: folded {folded} file(s)")
        return 0
    if args.action == "rebase":
        from leaderboard.manifest import read_current

        manifest = read_current(settings.lake_dir)
        if manifest is None:
            raise UsageError("no batch version is published yet; run `leaderboard batch`")
        version = speed.rebase(manifest).version
        if args.json:
            print(json.dumps({"action": "rebase", "version": version}))
        else:
            out.print(f"speed layer on {version}")
        return 0
    folded = _repair(speed, settings)
    if args.json:
        print(json.dumps({"action": "repair", "folded_files": folded}))
    else:
        out.print(f"folded {folded} pending file(s)")
    return 0


@contextmanager
def _not_erased(settings: Settings, player: str | None) -> Iterator[None]:
    """The action's block, refused for an erased player: the check and the write under the
    erasure barrier (`app.erasure.unless_erased`)."""
    from app.erasure import ErasedPlayer, unless_erased

    try:
        with unless_erased(settings.lake_dir, player):
            yield
    except ErasedPlayer as exc:
        raise UsageError(str(exc)) from None


def _cmd_ban(args: argparse.Namespace) -> int:
    _player(args.player)
    if len(getattr(args, "reason", None) or "") > 500:  # as POST /v1/admin/bans
        raise UsageError(f"--reason is {len(args.reason):,} characters; use at most 500")
    settings = _settings(args)
    speed = _require_speed(settings)
    with _not_erased(settings, args.player):
        if args.command == "ban":
            count = speed.ban(args.player, settings.now(), args.reason or "")
        else:
            count = speed.unban(args.player, settings.now())
    if args.command == "ban":
        out.print(f"banned {args.player}: gone from {count} live board-window(s)")
    else:
        out.print(f"unbanned {args.player}: restored in {count} live board-window(s)")
    return 0


def _cmd_void(args: argparse.Namespace) -> int:
    """Void a match (or one player's result in it), or list the voids (`--list`)."""
    settings = _settings(args)
    if args.list and (args.player is not None or args.reason is not None):
        raise UsageError("--list takes only a match id (whose voids to list); --player and "
                         "--reason are for voiding")
    if args.list:
        from leaderboard.voids import read_voids

        found = [v.as_dict() for v in reversed(read_voids(settings.lake_dir))
                 if args.match is None or v.match_id == args.match]
        if args.json:
            print(json.dumps({"total": len(found), "voids": found}))
            return 0
        table = Table(title=f"{len(found)} void(s), newest first")
        for column in ("at", "match_id", "player_id", "reason"):
            table.add_column(column)
        for row in found:
            table.add_row(str(row["at"]), str(row["match_id"]),
                          str(row["player_id"] or "(every player)"), str(row["reason"]))
        out.print(table)
        return 0
    if args.match is None or not args.reason:
        raise UsageError("give the match to void and --reason (or --list to see the voids)")
    if len(args.reason) > 500:  # as POST /v1/admin/voids
        raise UsageError(f"--reason is {len(args.reason):,} characters; use at most 500")
    from leaderboard.validation import MATCH_ID_PATTERN

    if len(args.match) > 128 or not re.match(MATCH_ID_PATTERN, args.match):
        raise UsageError("match_id must be 1-128 printable characters, not all whitespace")
    if args.player is not None:
        _player(args.player)
    speed = _require_speed(settings)
    with _not_erased(settings, args.player):
        applied = speed.void_applied(args.match, args.player, settings.now(), args.reason)
    players, limit, earlier = applied.players, applied.limit, applied.earlier
    if args.json:
        print(json.dumps(applied.as_dict(args.match, args.player)))
        return 0
    whose = f"{args.player}'s result in " if args.player else ""
    if earlier is not None:
        out.print(f"already voided: {earlier.describe()} at {format_instant(earlier.at)} "
                  f"(reason: {earlier.reason or '(none)'}); nothing new is recorded, "
                  + (f"and its unfinished application is done now: {len(players)} "
                     "player(s)' live standings changed" if players else "nothing changed"))
    else:
        out.print(f"voided {whose}match {args.match}: {len(players)} player(s)' live standings "
                  "changed" + ("" if applied.landed else
                               " (not landed yet: its events will not count)"))
    if limit is not None:
        out.print(limit.message())
    return 0


def _cmd_score(args: argparse.Namespace) -> int:
    """Submit one score to a direct board: the same door, landing and fold as
    `POST /v1/boards/{board}/scores`."""
    import pyarrow as pa

    from speed_layer.ingest import Ingestor, open_writer

    _player(args.player)
    settings = _settings(args)
    board = settings.registry.board(args.board)
    if not board.direct:
        direct = [b.name for b in settings.registry.boards if b.direct]
        raise UsageError(f"board {board.name} is fed by match events (`leaderboard ingest`); "
                         "scores go to a direct board: "
                         + (", ".join(direct) or "the registry has none (source = \"direct\")"))
    field = board.score_field
    event_time = args.event_time or settings.now().isoformat()
    table = pa.table({"match_id": [args.match], "player_id": [args.player],
                      "points": pa.array([args.value], pa.int64()),
                      "event_time": [event_time], "server_id": [args.server_id]})
    writer = open_writer(settings.lake_dir, args.writer)
    speed = None if args.no_speed else _speed_layer(settings)
    try:
        if speed is not None:
            _repair(speed, settings)
        report = Ingestor(settings.registry, writer, speed).ingest(
            table, now=settings.now(), source="cli:score", row_reasons=True, board=board)
    finally:
        writer.close()
    answer: dict[str, Any] = {
        "board": board.name, "player_id": args.player, "match_id": args.match,
        field: args.value, "accepted": report.accepted == 1, "retry": report.retries == 1,
        "folded": (speed is not None and report.accepted + report.retries == 1
                   and report.fold_error is None)}
    if report.rejections:
        _, reason, detail = report.rejections[0]
        answer.update(error=reason, message=detail.replace("points", field, 1))
    if args.json:
        print(json.dumps(answer))
    elif report.rejections:
        err.print(f"[red]refused[/red] ({answer['error']}): {answer['message']}")
    elif answer["retry"]:
        out.print(f"{board.name}: {args.player}'s {field} of match {args.match} was already "
                  "accepted; counted once")
    else:
        out.print(f"{board.name}: {field} {args.value:,} for {args.player} (match "
                  f"{args.match}) accepted" + ("" if answer["folded"] else
                                              "; landed, the batch will absorb it"))
    if report.fold_error:
        err.print(f"[yellow]warning:[/yellow] landed, but the fold into the speed layer "
                  f"failed ({report.fold_error}); run `leaderboard speed repair`")
    return 1 if report.rejections else 0


def _cmd_erase(args: argparse.Namespace) -> int:
    """Erase a player everywhere (right to erasure): see app/erasure.py."""
    from app.erasure import ErasureStopped, erase_player
    from app.http.service import ERASURE_SETTLE

    _player(args.player)
    if not args.yes:
        raise UsageError(f"erasing {args.player} cannot be undone; add --yes to confirm")
    settings = _settings(args)
    speed = _require_speed(settings)
    try:
        result = erase_player(settings, speed, args.player, settle=ERASURE_SETTLE,
                              say=(lambda m: None) if args.json else out.print)
    except ErasureStopped as exc:
        err.print(f"erasure of {args.player} {exc}")
        return 1
    if args.json:
        print(json.dumps(result))
    elif result["status"] == "incomplete":
        err.print(f"erasure of {args.player} {result['remains']}")
    else:
        lake = result["lake"]
        out.print(f"erased {args.player}: {lake['rows']} row(s) in {lake['files']} file(s), "
                  f"{lake['versions']} version(s)"
                  + (" (finishing an erasure of the id stopped part-way)"
                     if lake["resumed"] else "")
                  + "; later events of the id are refused (reason erased)")
    return 0 if result["status"] == "erased" else 1


def _cmd_report(args: argparse.Namespace) -> int:
    from jobs.report import ReportError, score_distribution_png

    settings = _settings(args)
    registry = settings.registry
    board = registry.board(args.board)
    as_of = day_flag(args.as_of, "--as-of")
    moment = settings.now() if as_of is None else datetime.combine(as_of, time(12), UTC)
    window = registry.calendar.resolve(args.window, moment)
    if window.kind not in board.windows:
        raise UsageError(f"board {board.name} has no {window.kind} window")
    target = Path(args.out) if args.out else (
        settings.data_dir / "reports" / f"{board.name.replace(':', '_')}-"
        f"{window.id.replace(':', '_')}-{as_of or 'current'}.png")
    try:
        chart = score_distribution_png(settings.lake_dir, board, window.id, as_of, target)
    except ReportError as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 1
    scale = "log score axis (heavy tail)" if chart.log_scale else "linear score axis"
    out.print(f"wrote {chart.path}: {chart.players:,} players, {scale}")
    for mark in chart.marks:
        out.print(f"  {mark}")
    return 0


# -- reads (the serving layer) -----------------------------------------------------------------

def _leaderboards(settings: Settings) -> Any:
    """The serving layer on REDIS_URL or the local server: the code the HTTP API reads with."""
    import redis

    from leaderboard.speed_keys import connect
    from serving.service import Leaderboards

    try:
        client = connect(settings)
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError, RuntimeError) as exc:
        raise _ReadFailed(f"the speed layer (Redis) is unreachable ({exc}); set REDIS_URL or "
                          "leave it unset for the local server under the data dir") from None
    return Leaderboards(settings.lake_dir, settings.registry, client, now=settings.now,
                        base_cache_bytes=settings.base_cache_bytes)


class _ReadFailed(Exception):
    """A read that could not be answered (Redis down): exit code 1."""


def _bounded(value: int, name: str, low: int, high: int) -> int:
    if not low <= value <= high:
        raise UsageError(f"{name} {value} is out of range; use {low}..{high}")
    return value


def _query(args: argparse.Namespace, ask: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """Run one read; an unknown board or window is bad usage (exit 2)."""
    from serving.service import QueryError

    settings = _settings(args)
    try:
        settings.registry.board(args.board)
        return ask(_leaderboards(settings))
    except QueryError as exc:
        raise UsageError(str(exc)) from None


def _read_command(handler: Callable[[argparse.Namespace], int]
                  ) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except _ReadFailed as exc:
            err.print(f"[red]error:[/red] {exc}")
            return 1
    return run


def name_of(entry: dict[str, Any]) -> str:
    """A listed player's display name for a table ('' when unset)."""
    return entry.get("display_name") or ""


def _entries_table(title: str, entries: list[dict[str, Any]], mark: str | None = None) -> Table:
    """Ranked entries; a `name` column when any listed player has a display name."""
    named = any(entry.get("display_name") for entry in entries)
    table = Table(title=title, title_justify="left")
    table.add_column("rank", justify="right")
    table.add_column("player")
    if named:
        table.add_column("name")
    table.add_column("score", justify="right")
    for entry in entries:
        style = "bold" if entry["player_id"] == mark else None
        table.add_row(str(entry["rank"]), entry["player_id"],
                      *([name_of(entry)] if named else []), f"{entry['score']:,}", style=style)
    return table


def render_top(answer: dict[str, Any]) -> Table:
    """A `top` answer as a table (the CLI and the demo print the same); the cursor of the
    next page, if any, under it."""
    entries = answer["entries"]
    first = entries[0]["rank"] if entries else 0
    shown = (f"top {len(entries)}" if first <= 1 else
             f"{len(entries)} from rank {first:,}")
    table = _entries_table(f"{answer['board']} {answer['window']}: {shown} "
                           f"of {answer['total']:,}", entries)
    if answer.get("next_cursor"):
        table.caption = f"next page: --cursor {answer['next_cursor']}"
        table.caption_justify = "left"
    return table


def render_rank(answer: dict[str, Any]) -> str:
    """A `rank` answer as one line, with the move since the batch view's day."""
    player, where = answer["player_id"], f"{answer['board']} {answer['window']}"
    if answer.get("display_name"):
        player = f"{player} ({answer['display_name']})"
    if answer["status"] != "ranked":
        return f"{player} is unranked on {where} ({answer['total']:,} players)"
    line = (f"{player} on {where}: rank {answer['rank']:,} of {answer['total']:,}, "
            f"score {answer['score']:,}, percentile {answer['percentile']:.2f}")
    yesterday = answer["as_of_yesterday"]
    if yesterday is not None:
        change = answer["change"]
        moved = "no change" if change == 0 else (f"up {change}" if change > 0
                                                 else f"down {-change}")
        line += (f"; as of {yesterday['as_of']}: rank {yesterday['rank']:,}, score "
                 f"{yesterday['score']:,} ({moved})")
    return line


def render_around(answer: dict[str, Any], player: str) -> Table | str:
    where = f"{answer['board']} {answer['window']}"
    if answer["player"] is None:
        return f"{player} is unranked on {where}"
    return _entries_table(f"{where}: around {player}",
                          [*answer["above"], answer["player"], *answer["below"]], mark=player)


def render_percentiles(answer: dict[str, Any]) -> Table | str:
    """A `percentiles` answer as a table: the score needed now for each top-x%."""
    where = f"{answer['board']} {answer['window']}"
    if not answer["top_percent"]:
        return f"{where} has no players yet"
    table = Table(title=f"{where}: score needed for the top x% of {answer['total']:,} players",
                  title_justify="left")
    table.add_column("top %", justify="right")
    table.add_column("score", justify="right")
    table.add_column("players", justify="right")
    for row in answer["top_percent"]:
        table.add_row(f"{row['top_percent']:g}", f"{row['score']:,}", f"{row['players']:,}")
    return table


def _emit(args: argparse.Namespace, answer: dict[str, Any],
          render: Callable[[dict[str, Any]], Any]) -> int:
    """A read's answer as JSON (--json) or rendered for people."""
    if args.json:
        print(json.dumps(answer))
    else:
        out.print(render(answer))
    return 0


@_read_command
def _cmd_top(args: argparse.Namespace) -> int:
    from serving.service import MAX_TOP_N

    n = _bounded(args.n, "-n", 1, MAX_TOP_N)
    answer = _query(args, lambda boards: boards.top(args.board, n, args.window, args.cursor))
    return _emit(args, answer, render_top)


def _player(value: str) -> str:
    """A player id as the HTTP API checks it: a bad one is bad usage (exit 2), not unranked."""
    from leaderboard.validation import id_problem

    problem = id_problem(value)
    if problem is not None:
        raise UsageError(problem)
    return value


@_read_command
def _cmd_rank(args: argparse.Namespace) -> int:
    _player(args.player)
    answer = _query(args, lambda boards: boards.player(args.board, args.player, args.window))
    return _emit(args, answer, render_rank)


@_read_command
def _cmd_around(args: argparse.Namespace) -> int:
    from serving.service import MAX_AROUND_K

    k = _bounded(args.k, "-k", 1, MAX_AROUND_K)
    _player(args.player)
    answer = _query(args, lambda boards: boards.around(args.board, args.player, k, args.window))
    return _emit(args, answer, lambda found: render_around(found, args.player))


@_read_command
def _cmd_percentiles(args: argparse.Namespace) -> int:
    tops = args.top or [1, 5, 10, 25, 50, 75, 90, 100]
    answer = _query(args, lambda boards: boards.percentiles(args.board, args.window, tops))
    return _emit(args, answer, render_percentiles)


# -- serve ------------------------------------------------------------------------------------

def serve_banner(url: str, settings: Settings, redis_url: str, workers: int, *,
                 local_redis: bool) -> str:
    """What `serve` prints before it binds: every value labelled, paths absolute."""
    where = f" (the local server under {settings.data_dir.resolve() / 'redis'})" \
        if local_redis else " (REDIS_URL)"
    return "\n".join([
        f"serving the HTTP API on {url}  (Ctrl-C stops)",
        f"  API docs:  {url}/docs",
        f"  data dir:  {settings.data_dir.resolve()}",
        f"  registry:  {settings.config or 'default'}",
        f"  Redis:     {redis_url}{where}",
        f"  workers:   {workers}",
    ])


def _cmd_serve(args: argparse.Namespace) -> int:
    import os

    settings = _settings(args)
    try:
        import uvicorn

        from app.http import HttpConfig
    except ImportError as exc:
        raise UsageError(f"`serve` needs the serve extra ({exc.name} is missing): "
                         "pip install -e '.[serve]'") from None
    if args.workers < 1:
        raise UsageError(f"--workers {args.workers}: use 1 or more")
    config = HttpConfig.from_env()  # a bad keys file or TTL is exit 2 before binding
    # Each worker builds its app from the environment: hand it the settings resolved here.
    os.environ["LEADERBOARD_DATA"] = str(settings.data_dir.resolve())
    if settings.config is not None:
        os.environ["LEADERBOARD_CONFIG"] = settings.config
    if settings.now_override is not None:
        os.environ["LEADERBOARD_NOW"] = settings.now_override.isoformat()
    redis_url = settings.redis_url
    if redis_url is None:
        # Started here, once; REDIS_URL stays unset so each worker follows the local server
        # (to another port, if it is restarted on one) instead of pinning this URL.
        from leaderboard.redis_server import ensure_local_server

        redis_url = ensure_local_server(settings.data_dir)
    if not config.keys.servers:
        err.print("[yellow]warning:[/yellow] no server keys (LEADERBOARD_API_KEYS): "
                  "POST /v1/events answers 403 to everyone")
    err.print(serve_banner(f"http://{args.host}:{args.port}", settings, redis_url,
                           args.workers, local_redis=settings.redis_url is None))
    from app.http.transport import JSON_HTTP

    # JSON_HTTP: uvicorn's own 400s (a request that is not valid HTTP) in the API's shape.
    # ws="none": the API has no WebSocket route, and uvicorn's WebSocket handling would
    # answer any request with `Upgrade: websocket` itself, in text; without it the route
    # answers, in JSON.
    uvicorn.run("app.http:create_app_from_env", factory=True, host=args.host, port=args.port,
                workers=args.workers, log_level=args.log_level, http=JSON_HTTP, ws="none")
    return 0


# -- demo ---------------------------------------------------------------------------------

def _cmd_demo(args: argparse.Namespace) -> int:
    import os

    from app.demo import demo_keys, next_steps, run_demo

    settings = _settings(args)
    status = run_demo(settings, args, out=out, err=err)
    if status != 0:
        return status
    keys = None
    if args.serve and not os.environ.get("LEADERBOARD_API_KEYS"):
        # Ingest would be closed to everyone: serve with the demo's own keys file.
        keys = demo_keys(settings.data_dir)
        os.environ["LEADERBOARD_API_KEYS"] = str(keys.path)
    url = f"http://{args.host}:{args.port}" if args.serve else None
    out.print(next_steps(url, keys, settings.now()))
    if not args.serve:
        return 0
    return _cmd_serve(args)


# -- lake upkeep ------------------------------------------------------------------------------

def _cmd_lake(args: argparse.Namespace) -> int:
    settings = _settings(args)  # `rebind` binds the data dir to this registry
    if args.action == "sweep":
        from jobs.sweep import SweepRefused, sweep_orphans

        try:
            swept = sweep_orphans(settings.lake_dir)
        except SweepRefused as exc:
            raise UsageError(str(exc)) from None
        if args.json:
            print(json.dumps(swept.as_dict()))
        else:
            out.print(f"swept {swept.files:,} file(s), {swept.bytes:,} bytes, of "
                      f"{len(swept.runs)} killed batch run(s)"
                      + (f": {', '.join(swept.runs)}" if swept.runs else ""))
        return 0
    from leaderboard.binding import rebind_summary

    registry = settings.registry
    out.print(f"{settings.data_dir} is bound to the board registry {registry.source} "
              f"(fingerprint {registry.fingerprint})")
    if summary := rebind_summary(settings.lake_dir, registry):
        out.print(summary)
    return 0


# -- parser ---------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    # SUPPRESS: a flag given before the command is not reset by the command's own parser.
    common = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    common.add_argument("--data", help="data dir (env LEADERBOARD_DATA, default ./data)")
    common.add_argument("--config", help="board registry: TOML path or shipped name "
                                         "(env LEADERBOARD_CONFIG, default: default)")
    common.add_argument("--now", help="ISO 8601 instant replacing the wall clock "
                                      "(env LEADERBOARD_NOW)")
    parser = argparse.ArgumentParser(
        prog="leaderboard", description="Lambda-architecture leaderboards: batch standings, "
        "a Redis speed layer and merged rank queries.", parents=[common])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, handler: Callable[[argparse.Namespace], int], text: str
            ) -> argparse.ArgumentParser:
        # argparse %-formats a help string (not a description): a literal % is doubled.
        sub = commands.add_parser(name, help=text.replace("%", "%%"), description=text,
                                  parents=[common])
        sub.set_defaults(handler=handler)
        return sub

    gen = add("generate", _cmd_generate, "Generate a deterministic synthetic season and land it.")
    gen.add_argument("--players", type=int, default=10_000)
    gen.add_argument("--days", type=int, default=7)
    gen.add_argument("--events-per-day", type=int, default=100_000)
    gen.add_argument("--start", help="first day YYYY-MM-DD (default: --days before today)")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--dirty", type=float, default=0.0,
                     help="share of dirty rows: retries, late events, malformed rows")
    gen.add_argument("--writer", default="gen", help="landing writer id")
    gen.add_argument("--json", action="store_true")

    ing = add("ingest", _cmd_ingest, "Validate, land and quarantine event files "
                                     "(JSONL, CSV, Parquet, or the football results CSV).")
    ing.add_argument("files", nargs="+", metavar="FILE")
    ing.add_argument("--backfill", action="store_true",
                     help="trusted historical import: ingested_at taken from event_time")
    ing.add_argument("--server-id", default="file", help="server_id for rows without one")
    ing.add_argument("--writer", default="cli", help="landing writer id")
    ing.add_argument("--no-speed", action="store_true",
                     help="land only; do not fold into the speed layer")
    ing.add_argument("--json", action="store_true")

    bat = add("batch", _cmd_batch, "Recompute, check and publish the standings as of a date.")
    bat.add_argument("--as-of", help="YYYY-MM-DD (default: yesterday by the clock)")
    bat.add_argument("--engine", choices=["duckdb", "spark"],
                     help="batch engine (env LEADERBOARD_ENGINE, default duckdb)")
    bat.add_argument("--full", action="store_true", help="recompute everything")
    bat.add_argument("--allow-rewind", action="store_true",
                     help="publish even if the live version is of a later night (moves "
                          "manifests/current.json back in time)")
    bat.add_argument("--allow-open-day", action="store_true",
                     help="allow --as-of today, a night that has not ended: the version absorbs "
                          "what landed before the batch read the lake; later events stay live")
    bat.add_argument("--json", action="store_true")

    sql = add("sql", _cmd_sql, "Read-only SQL on the analysts' warehouse, printed as tables "
                               "(interactive without a query).")
    sql.add_argument("query", nargs="*", metavar="SQL",
                     help="statements to run once, separated by ';' (default: read stdin, "
                          "or an interactive shell on a terminal)")
    sql.add_argument("--file", "-f", help="run the statements in this file ('-': stdin)")
    sql.add_argument("--max-rows", type=int, default=40,
                     help="rows printed per result (default 40; --json prints all)")
    sql.add_argument("--json", action="store_true",
                     help="one JSON object per statement: columns, rows")

    spd = add("speed", _cmd_speed, "Speed layer: status, repair, rebuild from the lake, rebase.")
    spd.add_argument("action", choices=["status", "repair", "rebuild", "rebase"])
    spd.add_argument("--json", action="store_true")

    ban = add("ban", _cmd_ban, "Ban a player: a tombstone in the lake, gone from live boards.")
    ban.add_argument("player")
    ban.add_argument("--reason")
    unban = add("unban", _cmd_ban, "Unban a player and restore their standings exactly.")
    unban.add_argument("player")

    void = add("void", _cmd_void, "Void a match, or one player's result in it: a record in "
               "the lake, dropped from live boards at once and from the next batch version "
               "(published versions stay). A corrected result is a new submission with a new "
               "match_id. --list shows the voids.")
    void.add_argument("match", nargs="?", help="the match_id to void")
    void.add_argument("--player", help="only this player's result (default: every player)")
    void.add_argument("--reason", help="why (required to void; kept in the lake)")
    void.add_argument("--list", action="store_true", help="list the voids, newest first")
    void.add_argument("--json", action="store_true")


    score = add("score", _cmd_score, "Submit a score to a direct board (source = \"direct\" "
                "in the registry): `score` for a max|min|last board, a `delta` for a sum.")
    score.add_argument("action", choices=["submit"])
    score.add_argument("board")
    score.add_argument("player")
    score.add_argument("value", type=int, help="the score (or the delta, on a sum board)")
    score.add_argument("--match", required=True,
                       help="what it came from (a race, a run): with the board and player "
                            "its identity, so a retry counts once")
    score.add_argument("--event-time", help="ISO 8601 instant scored (default: now)")
    score.add_argument("--server-id", default="cli", help="who submitted it")
    score.add_argument("--writer", default="cli", help="landing writer id")
    score.add_argument("--no-speed", action="store_true",
                       help="land only; do not fold into the speed layer")
    score.add_argument("--json", action="store_true")


    erase = add("erase", _cmd_erase, "Erase a player everywhere (right to erasure): the lake's "
                "events, quarantine, logs, rollups and every version, Redis (AOF rewritten) "
                "and the warehouse; the ledger keeps a salted hash, and later events of the "
                "id are refused.")
    erase.add_argument("player")
    erase.add_argument("--yes", action="store_true", help="confirm (it cannot be undone)")
    erase.add_argument("--json", action="store_true")

    lake = add("lake", _cmd_lake, "Lake upkeep: rebind the data dir to an edited registry; "
               "sweep the files of killed batch runs (every batch also does at its start).")
    lake.add_argument("action", choices=["rebind", "sweep"])
    lake.add_argument("--json", action="store_true")

    from app.review import add_quarantine_command

    add_quarantine_command(add)  # leaderboard quarantine list|release

    rep = add("report", _cmd_report, "Chart a board-window's score distribution as a PNG.")
    rep.add_argument("board")
    rep.add_argument("--window", default="all-time",
                     help="daily|weekly|monthly|season|all-time or a window id")
    rep.add_argument("--as-of", help="YYYY-MM-DD (default: the live version)")
    rep.add_argument("--out", help="PNG path (default under DATA/reports/)")

    def window_flag(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--window", default=None,
                         help="daily|weekly|monthly|season|all-time (open now) or a window "
                              "id (default all-time)")
        sub.add_argument("--json", action="store_true")

    top = add("top", _cmd_top, "The top N of a board (batch merged with the speed layer).")
    top.add_argument("board")
    top.add_argument("-n", type=int, default=10, help="how many (1-1000, default 10)")
    top.add_argument("--cursor", help="the next page: next_cursor of the previous answer")
    window_flag(top)
    rank = add("rank", _cmd_rank, "A player's live rank, score, percentile and change.")
    rank.add_argument("board")
    rank.add_argument("player")
    window_flag(rank)
    around = add("around", _cmd_around, "The players listed around a player.")
    around.add_argument("board")
    around.add_argument("player")
    around.add_argument("-k", type=int, default=5, help="players above and below (1-50)")
    window_flag(around)
    pct = add("percentiles", _cmd_percentiles,
              "The score needed now to be in the top x percent of a board (batch + speed).")
    pct.add_argument("board")
    pct.add_argument("--top", type=float, action="append", metavar="X",
                     help="a top percent in (0, 100]; repeat for more (default 1 5 10 25 50 "
                          "75 90 100)")
    window_flag(pct)

    from app.cli_reads import register

    register(add, window_flag)  # friends, history, boards, profile

    serve = add("serve", _cmd_serve, "Serve the HTTP API (OpenAPI docs at /docs).")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--workers", type=int, default=1, help="worker processes")
    serve.add_argument("--log-level", default="info",
                       choices=["critical", "error", "warning", "info", "debug"])

    demo = add("demo", _cmd_demo, "The main job on embedded defaults.")
    demo.add_argument("--players", type=int, default=20_000)
    demo.add_argument("--days", type=int, default=14)
    demo.add_argument("--events-per-day", type=int, default=200_000)
    demo.add_argument("--seed", type=int, default=7)
    demo.add_argument("--dirty", type=float, default=0.02)
    demo.add_argument("--fresh", action="store_true", help="delete the demo's lake first")
    demo.add_argument("--no-serve", dest="serve", action="store_false",
                      help="exit after printing the answers instead of serving HTTP")
    demo.add_argument("--host", default="127.0.0.1")
    demo.add_argument("--port", type=int, default=8000)
    demo.add_argument("--workers", type=int, default=1)
    demo.add_argument("--log-level", default="warning")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except (SettingsError, RegistryError, UsageError, WindowError, WriterBusy) as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 2
    except Exception as exc:
        # Redis lost the speed state (or never had it): its message says what to run. Looked
        # up only if raised, so that commands without Redis do not import it.
        speed_keys = sys.modules.get("leaderboard.speed_keys")
        if speed_keys is None or not isinstance(exc, speed_keys.StateLost):
            raise
        err.print(f"[red]error:[/red] {exc}")
        return 1
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130


if __name__ == "__main__":
    # `python -m app.cli` runs this file as __main__, a second copy of the module: commands
    # in other modules (app.cli_reads, app.review) raise app.cli's UsageError, which this
    # copy's `except` would not catch (a traceback instead of `error: ...`, exit 1 not 2).
    from app.cli import main as imported_main

    sys.exit(imported_main())
