"""Quarantine review for people and the API: one answer per action, shared by
`GET /v1/admin/quarantine`, `POST /v1/admin/quarantine/release` and `leaderboard
quarantine list|release` (tables for people, `--json` for scripts)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich import box
from rich.table import Table

from leaderboard.quarantine import (
    StaleCursor,
    list_quarantine,
    moved_ids,
    moved_to,
    released_at,
    released_ids,
)
from leaderboard.timeutil import to_utc
from leaderboard.validation import REASONS

__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "MAX_RELEASE", "add_quarantine_command",
           "parse_since", "quarantine_page", "release_answer", "render_page",
           "render_release"]

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_RELEASE = 1000


def parse_since(text: str) -> datetime:
    """A date (YYYY-MM-DD, its midnight UTC) or an RFC 3339 instant; an instant whose
    offset pushes it past year 1 or 9999 is taken as the first or last instant there is."""
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"since: `{text}` is not a date (YYYY-MM-DD) or an RFC 3339 instant "
                         "(2026-12-01T12:00:00Z)") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    try:
        return to_utc(parsed)
    except OverflowError:
        return (datetime.min if parsed.year == 1 else datetime.max).replace(tzinfo=UTC)


def quarantine_page(lake: Path, *, reason: str | None = None, since: datetime | None = None,
                    limit: int = DEFAULT_LIMIT, cursor: str | None = None) -> dict[str, Any]:
    """One page of quarantined rows (oldest file first), each with its id, whether a
    release landed it, the id a release quarantined it again as (`moved_to`: a score whose
    board left the registry; nothing landed), and the cursor of the next page (null on the
    last)."""
    rows, next_cursor = list_quarantine(lake, reason=reason, since=since, limit=limit,
                                        after=cursor)
    released = released_ids(lake) if rows else {}
    moved = moved_ids(lake) if released else {}
    listed = []
    for row in rows:
        new = moved_to(moved, row)
        listed.append(row.as_dict(
            released=new is None and released_at(released, row) is not None, moved_to=new))
    return {"count": len(rows), "next_cursor": next_cursor, "rows": listed}


def release_answer(speed: Any, ids: Sequence[str], now: datetime) -> dict[str, Any]:
    """Release the rows; the answer counts what landed and says per id what happened."""
    from speed_layer.review import release_rows

    outcomes, fold_error = release_rows(speed, ids, now)
    answer: dict[str, Any] = {
        "released": sum(o.status == "released" for o in outcomes),
        "results": [o.as_dict() for o in outcomes]}
    if fold_error:
        answer["warning"] = (f"landed durably, but the fold into the speed layer failed "
                             f"({fold_error}); `leaderboard speed repair` folds it")
    return answer


def render_page(answer: dict[str, Any]) -> Any:
    """A page as three columns that fit an 80-column terminal: the id and reason whole
    (to copy), then the row as sent (player, match, points, a score's board) with whether a
    release landed it or moved it on a line of its own; the ids moved rows were quarantined
    again as are listed under the table, whole."""
    if not answer["rows"]:
        return "no quarantined rows match"
    table = Table(title=f"{answer['count']:,} quarantined rows (--json: values, detail, "
                        "ingested_at)", title_justify="left", box=box.SIMPLE)
    table.add_column("id", no_wrap=True)
    table.add_column("reason", no_wrap=True)
    table.add_column("player  match  points", overflow="fold")
    for row in answer["rows"]:
        sent = "  ".join(str(row[name] or "-") for name in ("player_id", "match_id", "points"))
        if row["board"]:  # a direct score's (a match event's has none)
            sent += f"  on {row['board']}"
        if row["released"]:
            sent += "\nreleased"
        elif row["moved_to"]:
            sent += "\nmoved (below)"
        table.add_row(row["id"], row["reason"], sent)
    notes = [f"{row['id']} moved to {row['moved_to']}" for row in answer["rows"]
             if row["moved_to"] and not row["released"]]
    if answer["next_cursor"]:
        notes.append(f"more: --cursor {answer['next_cursor']}")
    if notes:
        table.caption = "\n".join(notes)
        table.caption_justify = "left"
    return table


def render_release(answer: dict[str, Any]) -> Any:
    table = Table(title=f"released {answer['released']:,}", title_justify="left")
    table.add_column("id", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("detail", overflow="fold")
    for row in answer["results"]:
        table.add_row(row["id"], row["status"], row["detail"])
    if answer.get("warning"):
        table.caption = answer["warning"]
    return table


def _cmd_quarantine(args: argparse.Namespace) -> int:
    from app.cli import UsageError, _settings, _speed_layer, out

    settings = _settings(args)
    if args.action == "list":
        if args.ids:
            raise UsageError("quarantine list takes no ids (use --reason, --since, --cursor)")
        if not 1 <= args.limit <= MAX_LIMIT:
            raise UsageError(f"--limit {args.limit}: use 1 to {MAX_LIMIT}")
        try:
            since = None if args.since is None else parse_since(args.since)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        try:
            answer = quarantine_page(settings.lake_dir, reason=args.reason, since=since,
                                     limit=args.limit, cursor=args.cursor)
        except StaleCursor as exc:
            raise UsageError(str(exc)) from None
        render: Callable[[dict[str, Any]], Any] = render_page
        code = 0
    else:
        if not args.ids:
            raise UsageError("quarantine release needs the ids of the rows to release (see "
                             "`leaderboard quarantine list`)")
        if len(args.ids) > MAX_RELEASE:
            raise UsageError(f"{len(args.ids):,} ids; release at most {MAX_RELEASE:,} at once")
        speed = _speed_layer(settings)
        if speed is None:
            raise UsageError("a release needs the speed layer (Redis): start it or set "
                             "REDIS_URL")
        from speed_layer.review import ReleaseBusy

        try:
            answer = release_answer(speed, args.ids, settings.now())
        except ReleaseBusy as exc:
            raise UsageError(str(exc)) from None
        render = render_release
        code = 1 if any(r["status"] in ("not_found", "rejected", "requarantined", "in_flight")
                        for r in answer["results"]) else 0
    if args.json:
        print(json.dumps(answer))
    else:
        out.print(render(answer))
    return code


def add_quarantine_command(add: Callable[..., argparse.ArgumentParser]) -> None:
    """`leaderboard quarantine list|release` on the CLI's parser (`add` is its helper)."""
    sub = add("quarantine", _cmd_quarantine,
              "Review the quarantine: list rows by reason and time; release chosen rows "
              "(validated again, landed once).")
    sub.add_argument("action", choices=["list", "release"])
    sub.add_argument("ids", nargs="*", metavar="ID", help="release: the rows' ids")
    sub.add_argument("--reason", choices=sorted(REASONS), metavar="REASON",
                     help=f"list: only this reason ({', '.join(sorted(REASONS))})")
    sub.add_argument("--since", help="list: landed at or after (YYYY-MM-DD or RFC 3339)")
    sub.add_argument("--limit", type=int, default=DEFAULT_LIMIT,
                     help=f"list: rows per page (1-{MAX_LIMIT}, default {DEFAULT_LIMIT})")
    sub.add_argument("--cursor", help="list: the next_cursor of the previous page")
    sub.add_argument("--json", action="store_true")
