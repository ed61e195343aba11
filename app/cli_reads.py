"""The `leaderboard` reads beyond top, rank, around and percentiles, and player profiles:
`friends`, `history`, `boards`, `profile set|get|import`. Each prints a table for people or the
HTTP API's JSON with `--json`, through the same serving code the API reads with.

Registered on the main parser by `app.cli` (`register`); kept apart so that the commands
other work adds to `app/cli.py` and these do not edit the same lines.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.table import Table

from app.cli import (
    UsageError,
    _bounded,
    _emit,
    _leaderboards,
    _player,
    _query,
    _read_command,
    _ReadFailed,
    _settings,
    day_flag,
    err,
    name_of,
    out,
)

__all__ = ["register", "render_boards", "render_friends", "render_history", "render_profile"]

Add = Callable[[str, Callable[[argparse.Namespace], int], str], argparse.ArgumentParser]


# -- friends --------------------------------------------------------------------------------

def render_friends(answer: dict[str, Any]) -> Table | str:
    """A `friends` answer: the friends in board order, with their board rank, then who is
    unranked."""
    where = f"{answer['board']} {answer['window']}"
    unranked = answer["unranked"]
    if not answer["entries"]:
        return f"none of {', '.join(unranked)} is ranked on {where}"
    table = Table(title=f"{where}: {len(answer['entries'])} friends ranked together",
                  title_justify="left",
                  caption=f"unranked: {', '.join(unranked)}" if unranked else None,
                  caption_justify="left")
    table.add_column("#", justify="right")
    table.add_column("rank", justify="right")
    table.add_column("player")
    table.add_column("name")
    table.add_column("score", justify="right")
    for entry in answer["entries"]:
        table.add_row(str(entry["friend_rank"]), f"{entry['rank']:,}", entry["player_id"],
                      name_of(entry), f"{entry['score']:,}")
    return table


@_read_command
def _cmd_friends(args: argparse.Namespace) -> int:
    from serving.service import MAX_FRIENDS

    players = [_player(p) for p in args.players]
    _bounded(len(players), "the number of players", 1, MAX_FRIENDS)
    answer = _query(args, lambda boards: boards.friends(args.board, players, args.window))
    return _emit(args, answer, render_friends)


# -- history --------------------------------------------------------------------------------

def render_history(answer: dict[str, Any]) -> Table | str:
    """A `history` answer: the player's rank on each published day."""
    who = f"{answer['player_id']} on {answer['board']} ({answer['window']} windows)"
    if not answer["history"]:
        return f"no published day for {who}: run `leaderboard batch` first"
    table = Table(title=f"{who}: rank on each published day", title_justify="left")
    table.add_column("as of")
    table.add_column("window")
    table.add_column("rank", justify="right")
    table.add_column("score", justify="right")
    table.add_column("percentile", justify="right")
    for row in answer["history"]:
        ranked = row["rank"] is not None
        table.add_row(row["as_of"], row["window"], f"{row['rank']:,}" if ranked else "-",
                      f"{row['score']:,}" if ranked else "-",
                      f"{row['percentile']:.2f}" if ranked else "-")
    return table


@_read_command
def _cmd_history(args: argparse.Namespace) -> int:
    _player(args.player)
    first, last = day_flag(args.first, "--from"), day_flag(args.last, "--to")
    if first and last and first > last:
        raise UsageError(f"--from {first} is after --to {last}")
    settings = _settings(args)
    try:
        board = settings.registry.board(args.board)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.window not in board.windows:
        raise UsageError(f"board {board.name} has no {args.window} window; it has "
                         f"{', '.join(board.windows)}")
    history = _leaderboards(settings).history(board.name, args.player, args.window, first, last)
    answer = {"board": board.name, "player_id": args.player, "window": args.window,
              "history": history}
    return _emit(args, answer, render_history)


# -- boards ---------------------------------------------------------------------------------

def render_boards(answer: dict[str, Any]) -> Table:
    """`boards`: each board, how it ranks, and its windows open now with their next reset."""
    table = Table(title="boards", title_justify="left")
    table.add_column("board")
    table.add_column("ranks by")
    table.add_column("window open now")
    table.add_column("next reset (UTC)")
    for board in answer["boards"]:
        how = f"{board['aggregation']} {board['order']}, ties {board['ties']}"
        if board.get("source") == "direct":  # fed by `score submit`, not by match events
            how += "; fed by scores"
        for i, window in enumerate(board["windows"]):
            reset = window["next_reset"]
            table.add_row(board["board"] if i == 0 else "", how if i == 0 else "",
                          window["window"], "never" if reset is None
                          else reset.replace("T", " ").removesuffix(":00Z"))
    return table


@_read_command
def _cmd_boards(args: argparse.Namespace) -> int:
    return _emit(args, {"boards": _leaderboards(_settings(args)).boards()}, render_boards)


# -- profiles -------------------------------------------------------------------------------

def render_profile(answer: dict[str, Any]) -> Table | str:
    """A profile (and, with --history, every write of it, oldest first)."""
    player = answer["player_id"]
    writes = answer.get("history") or ([answer["profile"]] if answer["profile"] else [])
    if not writes:
        return f"{player} has no profile; set one with `leaderboard profile set {player} " \
               "--name NAME`"
    table = Table(title=f"profile of {player}" + (" (every write, oldest first)"
                                                  if "history" in answer else ""),
                  title_justify="left")
    for column in ("updated at", "display name", "country", "avatar URL"):
        table.add_column(column)
    for write in writes:
        table.add_row(write["updated_at"], write["display_name"], write["country"] or "-",
                      write["avatar_url"] or "-")
    return table


def _profile_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of an import file: the football results CSV (each team's readable name and
    country, by its header), else a CSV or JSONL with player_id, display_name and
    optionally country and avatar_url."""
    import csv

    from app.football import FOOTBALL_HEADER, team_profiles

    try:
        with open(path, encoding="utf-8", newline="") as handle:
            if path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
                rows = [json.loads(line) for line in handle if line.strip()]
            else:
                reader = csv.DictReader(handle)
                if tuple(h.strip() for h in reader.fieldnames or ()) == FOOTBALL_HEADER:
                    return [{"player_id": pid, "display_name": name, "country": country}
                            for pid, name, country in team_profiles(path)]
                rows = [{k: (v or None) for k, v in row.items()} for row in reader]
    except OSError as exc:
        raise UsageError(f"cannot read profiles from {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"cannot read profiles from {path}: {exc}") from None
    if not all(isinstance(row, dict) for row in rows):
        raise UsageError(f"{path}: every line must be a JSON object with player_id and "
                         "display_name")
    return rows


def _import_profiles(args: argparse.Namespace, settings: Any) -> int:
    """`profile import FILE`: every valid row as one file of the log, then the cache; the
    invalid rows are reported by line and land nothing."""
    from leaderboard.erasure import erasure_barrier

    with erasure_barrier(settings.lake_dir, exclusive=False):  # as `profile set`
        return _import_rows(args, settings)


def _import_rows(args: argparse.Namespace, settings: Any) -> int:
    from leaderboard.erasure import ErasureLedger
    from leaderboard.profiles import (
        ProfileError,
        check_not_erased,
        parse_profile,
        write_profiles,
    )
    from leaderboard.validation import id_problem

    good, bad = [], []
    erased = ErasureLedger.load(settings.lake_dir)
    for number, row in enumerate(_profile_rows(Path(args.player)), start=1):
        player = row.get("player_id")
        fields = {k: v for k, v in row.items() if k != "player_id"}
        problem = id_problem(player) if isinstance(player, str) else "player_id is missing"
        if None in row:  # csv.DictReader keys a row's cells past its header by None
            problem = "the row has more cells than the header has columns"
        if problem is None and isinstance(player, str):
            try:
                check_not_erased(erased, player)
                good.append(parse_profile(player, fields))
            except ProfileError as exc:
                problem = str(exc)
        if problem is not None:
            bad.append({"row": number, "player_id": player, "problem": problem})
    stored = write_profiles(settings.lake_dir, good, settings.now(), "cli")
    warning = _cache(settings, stored)
    answer = {"file": args.player, "imported": len(stored), "rejected": bad}
    if args.json:
        print(json.dumps(answer))
    else:
        out.print(f"imported {len(stored):,} profile(s) from {args.player}; "
                  f"{len(bad):,} row(s) rejected")
        for item in bad[:10]:
            err.print(f"  row {item['row']}: {item['problem']}")
    return 1 if warning else 0


def _cache(settings: Any, stored: list[Any]) -> bool:
    """Put stored profiles in the serving cache; False when done, True (after a warning
    saying what to do) when Redis could not be reached."""
    import redis

    try:
        _leaderboards(settings).profiles.store(stored)
    except (_ReadFailed, redis.RedisError) as exc:
        err.print(f"[yellow]warning:[/yellow] saved in the lake, but the serving cache was "
                  f"not updated ({exc}); run the same command again when Redis is back so "
                  "listings show it")
        return True
    return False


def _cmd_profile(args: argparse.Namespace) -> int:
    from leaderboard.erasure import erasure_barrier
    from leaderboard.profiles import ProfileError, history_of, parse_profile, write_profile

    settings = _settings(args)
    if args.action == "import":
        return _import_profiles(args, settings)
    _player(args.player)
    if args.action == "get":
        writes = [p.as_dict() for p in history_of(settings.lake_dir, args.player)]
        answer: dict[str, Any] = {"player_id": args.player,
                                  "profile": writes[-1] if writes else None}
        if args.history:
            answer["history"] = writes
        return _emit(args, answer, render_profile)
    if args.name is None:
        raise UsageError("profile set needs --name (1-32 printable characters)")
    # The ledger's check (in `write_profile`), the lake's write and the cache's hold the
    # erasure barrier shared: an erasure between them would finish, and the writes then
    # bring the id back into the lake and Redis.
    with erasure_barrier(settings.lake_dir, exclusive=False):
        try:
            profile = parse_profile(args.player, {"display_name": args.name,
                                                  "country": args.country,
                                                  "avatar_url": args.avatar})
            stored = write_profile(settings.lake_dir, profile, settings.now(), "cli")
        except ProfileError as exc:
            raise UsageError(str(exc)) from None
        if _cache(settings, [stored]):
            return 1
    return _emit(args, {"player_id": args.player, "profile": stored.as_dict()}, render_profile)


# -- registration ---------------------------------------------------------------------------

def register(add: Add, window_flag: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add these commands to the `leaderboard` parser (`add` as `app.cli._parser` defines
    it)."""
    friends = add("friends", _cmd_friends, "A list of players ranked together on a board.")
    friends.add_argument("board")
    friends.add_argument("players", nargs="+", metavar="PLAYER", help="1-500 player ids")
    window_flag(friends)

    history = add("history", _cmd_history,
                  "A player's rank on each published day (the batch's history).")
    history.add_argument("board")
    history.add_argument("player")
    history.add_argument("--window", default="all-time",
                         choices=["daily", "weekly", "monthly", "season", "all-time"],
                         help="window kind (default all-time)")
    history.add_argument("--from", dest="first", metavar="YYYY-MM-DD")
    history.add_argument("--to", dest="last", metavar="YYYY-MM-DD")
    history.add_argument("--json", action="store_true")

    boards = add("boards", _cmd_boards, "The boards, their windows open now and next resets.")
    boards.add_argument("--json", action="store_true")

    profile = add("profile", _cmd_profile, "A player's profile: set it (latest write wins, "
                                           "every write kept in the lake), get it, or import "
                                           "many (CSV or JSONL of player_id, display_name, "
                                           "country, avatar_url; or the football results, "
                                           "for the teams' names).")
    profile.add_argument("action", choices=["set", "get", "import"])
    profile.add_argument("player", metavar="PLAYER|FILE", help="the player (set, get) or the "
                                                               "file (import)")
    profile.add_argument("--name", help="set: the display name (1-32 printable characters)")
    profile.add_argument("--country", help="set: ISO 3166-1 alpha-2 code, e.g. KR")
    profile.add_argument("--avatar", help="set: an https URL of the avatar")
    profile.add_argument("--history", action="store_true", help="get: every write, oldest first")
    profile.add_argument("--json", action="store_true")
