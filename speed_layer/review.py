"""Releasing quarantined rows: an operator's "this one is genuine", landed exactly once.

A release takes rows by id (`leaderboard.quarantine`), validates them again as they were
sent (a row whose reason still holds stays in the quarantine, answered with it), and lands
the rest in one events file of the `release` writer, folded at once like any landing, so
the batch and the speed layer each count it once. The quarantined rows stay where they are
(the quarantine is immutable); the ledger marks them released.

Once, whatever the timing:
- one release at a time per lake: the `release` landing writer's lock (an flock on the
  lake, so it holds across the workers and processes of one host; like every landing
  writer's lock, not across hosts sharing a network file system: docs/architecture.md);
- the ledger entry is written before the rows land and counts only once its events file
  exists (`leaderboard.quarantine.read_releases`): a second release of a row is a no-op
  answered `already_released`, and a release that died before landing is simply redone;
- rows held for rate (`implausible_rate`) kept their claim at the door, so a retry of them
  never landed; they land without a new claim. Any other row passes the door like an
  ingest: if the same event was accepted meanwhile (a corrected resend), it is a
  `duplicate` and nothing lands.

A score whose board is no longer a direct board of the registry cannot land: it is
quarantined again with reason `unknown_board` and its old row marked released
(`_requarantine`), so it is never lost and the listing finds it under the reason that holds.
The ledger records the new rows' ids: the old id, released again, answers `requarantined`
naming its new row (nothing landed; that row is the one to release once the board is back).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import redis

from leaderboard.erasure import ErasureLedger, erasure_barrier
from leaderboard.lake import LandingWriter, WriterBusy, landing_stamp
from leaderboard.quarantine import (
    RELEASE_WRITER,
    QuarantineRow,
    Release,
    find_rows,
    moved_ids,
    moved_to,
    released_at,
    released_ids,
    rows_in,
    write_release,
)
from leaderboard.schema import INPUT_FIELDS
from leaderboard.timeutil import format_instant
from leaderboard.validation import (
    REASONS,
    SUBMISSION_REASONS,
    Validated,
    validate_events,
    validate_scores,
)
from speed_layer.rate import IMPLAUSIBLE_RATE
from speed_layer.service import SpeedLayer

__all__ = ["RELEASE_STATUSES", "UNKNOWN_BOARD", "Outcome", "ReleaseBusy", "release_rows"]

#: The reason of a released score whose board is no longer a direct board of the registry.
UNKNOWN_BOARD = "unknown_board"

#: What a release answers per id.
RELEASE_STATUSES = {
    "released": "landed now: it counts on every board it belongs to",
    "already_released": "an earlier release landed it; nothing more lands",
    "duplicate": "the same event (match_id, player_id) already counts, or is earlier in "
                 "this release; nothing lands",
    "rejected": "it still fails validation (see reason); it stays in the quarantine",
    "requarantined": "a score whose board is no longer a direct board of the registry: "
                     "quarantined again with reason unknown_board under the id in detail "
                     "(this row is marked released); nothing landed: release that row once "
                     "the board is back",
    "not_found": "no quarantined row has this id",
    "in_flight": "another writer is landing the same event right now; release it again "
                 "shortly (a duplicate then if that landing succeeded, else it lands)",
}


class ReleaseBusy(RuntimeError):
    """Another release holds the lake's release writer."""


@dataclass(frozen=True)
class Outcome:
    """What a release did with one id."""

    id: str
    status: str
    detail: str
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        answer: dict[str, Any] = {"id": self.id, "status": self.status, "detail": self.detail}
        if self.reason is not None:
            answer["reason"] = self.reason
        return answer


def _open_writer(speed: SpeedLayer, wait: float) -> LandingWriter:
    deadline = time.monotonic() + wait
    while True:
        try:
            return LandingWriter(speed.lake, RELEASE_WRITER)
        except WriterBusy:
            if time.monotonic() >= deadline:
                raise ReleaseBusy("another release is running on this lake; retry when it "
                                  "is done") from None
            time.sleep(0.05)


def release_rows(speed: SpeedLayer, ids: Sequence[str], now: datetime, *,
                 wait: float = 10.0) -> tuple[list[Outcome], str | None]:
    """Release the rows `ids` name, at `now`: (an outcome per distinct id, in the order
    given; the fold's error when the rows landed but Redis failed while folding them, which
    `speed repair` or the next ingest mends). The erasure ledger's check (validating the
    rows again) and the landing hold the erasure barrier shared: an erasure between them
    would finish, and the release then bring the id back into the lake and Redis."""
    unique = list(dict.fromkeys(ids))
    with erasure_barrier(speed.lake, exclusive=False), _open_writer(speed, wait) as writer:
        rows = find_rows(speed.lake, unique)
        done = released_ids(speed.lake)
        moved = moved_ids(speed.lake)
        outcomes: dict[str, Outcome] = {}
        todo: list[QuarantineRow] = []
        for row_id in unique:
            row = rows.get(row_id)
            if row is None:
                outcomes[row_id] = Outcome(row_id, "not_found",
                                           f"no quarantined row {row_id}: list them with "
                                           "`leaderboard quarantine list`")
            elif row.reason == "erased":  # it holds a hash of the id, never the id
                outcomes[row_id] = Outcome(row_id, "rejected",
                                           "the player's data was erased; this row keeps only "
                                           "a hash of the id and can never land", "erased")
            elif row.reason == "bad_type":
                outcomes[row_id] = Outcome(row_id, "rejected", _mistyped(row), "bad_type")
            elif row.reason in SUBMISSION_REASONS:
                outcomes[row_id] = Outcome(row_id, "rejected", (
                    f"{REASONS[row.reason]}: the submission does not say what was meant, "
                    "and a release cannot change it; it stays in the quarantine (the game "
                    "server sends the score again, corrected)"), row.reason)
            elif (new := moved_to(moved, row)) is not None:
                outcomes[row_id] = Outcome(row_id, "requarantined", _moved(new),
                                           UNKNOWN_BOARD)
            elif (at := released_at(done, row)) is not None:
                outcomes[row_id] = Outcome(row_id, "already_released",
                                           f"released at {format_instant(at)}; "
                                           "nothing more lands")
            else:
                todo.append(row)
        fold_error = None
        if todo:
            # The door's claims are in flight only while this runs; never stamped before
            # an open day's cut (its batch may have read the lake: `settle_landings`).
            with writer.landing() as floor:
                stamp = landing_stamp(now, floor)
                fold_error = _land(speed, writer, todo, stamp, outcomes)
    return [outcomes[i] for i in unique], fold_error


def _mistyped(row: QuarantineRow) -> str:
    """Why a `bad_type` row never lands. A type is a fact of the row as sent, which no
    registry edit or clock changes; and the quarantine keeps values as text, which can lose
    the type (a JSON number or a Parquet float in a text field reads as valid text), so
    validating the text again could land what ingest refused."""
    return (f"{REASONS['bad_type']} ({row.detail}): a release lands a row as it was sent, "
            "and a type stays wrong; it stays in the quarantine (send the row again, "
            "corrected)")


def _validated(speed: SpeedLayer, board: str | None, group: list[QuarantineRow],
               now: datetime) -> Validated | str:
    """The group's rows (all match events, or all scores to `board`) validated again as sent,
    against the erasure ledger too (a row of a player erased since it was quarantined is
    refused); a string when the board no longer takes scores (why)."""
    table = pa.table({name: pa.array([r.values[name] for r in group], pa.string())
                      for name in INPUT_FIELDS})
    erased = ErasureLedger.load(speed.lake)
    source = f"release:{RELEASE_WRITER}"
    if board is None:
        return validate_events(table, speed.registry, now=now, ingested_at=now,
                               source=source, erased=erased)
    found = next((b for b in speed.registry.boards if b.name == board), None)
    if found is None or not found.direct:
        return (f"board {board} is no longer a direct board of the registry; the score "
                "cannot land (submit it to a direct board)")
    return validate_scores(table, speed.registry, found, now=now, source=source,
                           erased=erased)


def _land(speed: SpeedLayer, writer: LandingWriter, todo: list[QuarantineRow], now: datetime,
          outcomes: dict[str, Outcome]) -> str | None:
    # Match events in one group, each direct board's scores in another: a score is validated
    # as a score to its board, and lands carrying it.
    groups: dict[str | None, list[QuarantineRow]] = {}
    for row in todo:
        groups.setdefault(row.board, []).append(row)
    passed: list[QuarantineRow] = []
    tables: list[pa.Table] = []
    for board, group in sorted(groups.items(), key=lambda item: item[0] or ""):
        validated = _validated(speed, board, group, now)
        if isinstance(validated, str):
            _requarantine(speed, writer, group, validated, now, outcomes)
            continue
        failed = set(validated.rejected_rows.tolist())
        for k, reason, detail in zip(validated.rejected_rows.tolist(),
                                     validated.rejected.column("reason").to_pylist(),
                                     validated.rejected.column("detail").to_pylist(),
                                     strict=True):
            outcomes[group[k].id] = Outcome(group[k].id, "rejected",
                                            f"{detail}; it stays in the quarantine", reason)
        # validate_events keeps the first of equal identities, in order: the same walk here.
        first: dict[tuple[str | None, ...], str] = {}
        count = len(passed)
        for k, row in enumerate(group):
            if k in failed:
                continue
            if row.identity in first:
                outcomes[row.id] = Outcome(row.id, "duplicate",
                                           f"the same event as {first[row.identity]} in this "
                                           "release; nothing more lands")
                continue
            first[row.identity] = row.id
            passed.append(row)
        table = validated.accepted
        if "board" not in table.column_names:
            table = table.append_column("board", pa.nulls(table.num_rows, pa.string()))
        assert table.num_rows == len(passed) - count
        tables.append(table)
    if not passed:
        return None
    accepted = pa.concat_tables(tables)
    held = np.array([r.reason == IMPLAUSIBLE_RATE for r in passed], dtype=bool)
    others = accepted.filter(pa.array(~held))
    admitted = speed.claim(others, now, RELEASE_WRITER, writer.next_seq)
    kept, claim = admitted.rows, admitted.claim
    claimed, busy = _identities(kept), _identities(admitted.in_flight_rows)
    landing: list[QuarantineRow] = []
    for row, is_held in zip(passed, held.tolist(), strict=True):
        if is_held or row.identity in claimed:
            landing.append(row)
        elif row.identity in busy:
            outcomes[row.id] = Outcome(row.id, "in_flight", RELEASE_STATUSES["in_flight"])
        else:
            outcomes[row.id] = Outcome(row.id, "duplicate",
                                       "this event already counts (accepted within the "
                                       "idempotency horizon); nothing more lands")
    if not landing:
        return None
    to_land = pa.concat_tables([accepted.filter(pa.array(held)), kept])
    release = Release(writer.next_seq, now, tuple(r.id for r in landing),
                      keys=tuple(r.key for r in landing))
    write_release(speed.lake, release)
    prev = writer.last_event_seq
    try:
        files = writer.land(to_land, now)
    except BaseException:
        if claim.groups:
            with suppress(redis.RedisError):  # else the writer's next claim recovers it
                speed.recover_claims(RELEASE_WRITER)
        raise
    write_release(speed.lake, replace(release, landed=True))
    with suppress(redis.RedisError):  # else the writer's next claim recovers it
        claim.settle()
    for row in landing:
        outcomes[row.id] = Outcome(row.id, "released",
                                   "landed now: it counts on every board it belongs to")
    try:
        # Held rows land on their claim from the first landing, which may be older than
        # the horizon: remember them again at this landing.
        speed.door.remember(accepted.filter(pa.array(held)), now)
        speed.after_land(files, prev=prev)
    except redis.RedisError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _requarantine(speed: SpeedLayer, writer: LandingWriter, group: list[QuarantineRow],
                  why: str, now: datetime, outcomes: dict[str, Outcome]) -> None:
    """Scores whose board is no longer a direct board: quarantined again with reason
    `unknown_board` (so `?reason=unknown_board` finds them) and the old rows marked released
    in the ledger, so each such score is listed once under the reason that holds now. The
    new rows are written before the ledger entry: a crash between leaves the score listed
    twice (a release of either lands it once: the door), never lost. A row already of that
    reason stays where it is."""
    moving = [row for row in group if row.reason != UNKNOWN_BOARD]
    for row in group:
        if row.reason == UNKNOWN_BOARD:
            outcomes[row.id] = Outcome(row.id, "rejected", f"{why}; it stays in the quarantine",
                                       UNKNOWN_BOARD)
    if not moving:
        return
    table = pa.table({
        **{name: pa.array([r.values[name] for r in moving], pa.string())
           for name in INPUT_FIELDS},
        "reason": pa.array([UNKNOWN_BOARD] * len(moving), pa.string()),
        "detail": pa.array([why] * len(moving), pa.string()),
        "source": pa.array([f"release:{RELEASE_WRITER}"] * len(moving), pa.string()),
        "board": pa.array([r.board for r in moving], pa.string())})
    files = writer.quarantine(table, now)
    new_ids = tuple(r.id for f in files for r in rows_in(f))
    # Marked landed at once: no events file backs it (its seq is the first new file's; the
    # new ids name every file the rows were split into).
    write_release(speed.lake, Release(files[0].seq, now, tuple(r.id for r in moving), True,
                                      tuple(r.key for r in moving), new_ids))
    for row, new in zip(moving, new_ids, strict=True):
        outcomes[row.id] = Outcome(row.id, "requarantined", f"{why}; {_moved(new)}",
                                   UNKNOWN_BOARD)


def _moved(new_id: str) -> str:
    return (f"quarantined again as {new_id} with reason {UNKNOWN_BOARD}; nothing landed: "
            "release that row once the board is back")


def _identities(table: pa.Table) -> set[tuple[str | None, ...]]:
    """The (board, match_id, player_id) of each row (board null: a match event)."""
    boards = (table.column("board").to_pylist() if "board" in table.column_names
              else [None] * table.num_rows)
    return set(zip(boards, table.column("match_id").to_pylist(),
                   table.column("player_id").to_pylist(), strict=True))
