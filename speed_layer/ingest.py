"""The ingest path: validate a batch, land the good rows durably, quarantine the rest.

Every accepted row is in a landed file before this returns; every rejected row is in the
quarantine with its reason; in-batch retries are counted, not landed. (Door idempotency
across batches and the fold into Redis attach here.)
"""

from __future__ import annotations

from collections import Counter
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import redis

from leaderboard import faults
from leaderboard.erasure import ErasureLedger, erasure_dir
from leaderboard.lake import LandedFile, LandingWriter, WriterBusy, landed_files, landing_stamp
from leaderboard.registry import Board, Registry
from leaderboard.timeutil import to_utc
from leaderboard.validation import validate_events, validate_scores
from speed_layer.rate import Held, PlayerRate, held_ids
from speed_layer.service import SpeedLayer

__all__ = ["IngestReport", "Ingestor", "open_writer"]


@dataclass
class IngestReport:
    """What happened to one or more batches; adds up over calls."""

    rows: int = 0
    accepted: int = 0
    rejected: int = 0
    duplicates: int = 0
    retries: int = 0  # dropped at the door: accepted within the idempotency horizon
    #: Held back at the door, not landed: another live writer is landing the same ids right
    #: now (an earlier send of the same rows). Retry them shortly: they are then retries if
    #: that landing succeeded, or land here if it failed.
    in_flight: int = 0
    in_flight_writers: list[str] = field(default_factory=list)
    reasons: Counter[str] = field(default_factory=Counter)
    files: list[LandedFile] = field(default_factory=list)
    quarantine_files: list[LandedFile] = field(default_factory=list)
    #: (row of the table, reason, detail) per rejected row, when asked for (`row_reasons`);
    #: row numbers are per call, so `add` does not carry them over.
    rejections: list[tuple[int, str, str]] = field(default_factory=list)
    #: Set when the rows were landed but the fold into Redis failed: `repair` folds them.
    fold_error: str | None = None

    def add(self, other: IngestReport) -> None:
        self.rows += other.rows
        self.accepted += other.accepted
        self.rejected += other.rejected
        self.duplicates += other.duplicates
        self.retries += other.retries
        self.in_flight += other.in_flight
        self.in_flight_writers = sorted({*self.in_flight_writers, *other.in_flight_writers})
        self.reasons.update(other.reasons)
        self.files.extend(other.files)
        self.quarantine_files.extend(other.quarantine_files)
        self.fold_error = self.fold_error or other.fold_error

    def as_dict(self) -> dict[str, object]:
        return {
            "rows": self.rows, "accepted": self.accepted, "rejected": self.rejected,
            "duplicates": self.duplicates, "retries": self.retries,
            "in_flight": self.in_flight, "in_flight_writers": self.in_flight_writers,
            "reasons": dict(self.reasons.most_common()),
            "files": [str(f.path) for f in self.files],
            "quarantine_files": [str(f.path) for f in self.quarantine_files],
            "fold_error": self.fold_error,
        }


def open_writer(lake: Path, preferred: str) -> LandingWriter:
    """The preferred writer id, or the first free `<preferred>_<n>` if another process has it."""
    for attempt in range(16):
        name = preferred if attempt == 0 else f"{preferred}_{attempt}"
        try:
            return LandingWriter(lake, name)
        except WriterBusy:
            continue
    raise WriterBusy(f"writer ids {preferred} .. {preferred}_15 are all busy; "
                     "pass another --writer")


class Ingestor:
    """Validate -> door -> land -> quarantine -> fold, for one landing writer.

    Without a speed layer it only lands (the batch absorbs everything anyway).
    """

    def __init__(self, registry: Registry, writer: LandingWriter,
                 speed: SpeedLayer | None = None) -> None:
        self.registry = registry
        self.writer = writer
        self.speed = speed
        per_minute = registry.player_events_per_minute
        self.rate = (PlayerRate(speed.client, per_minute)
                     if speed is not None and per_minute is not None else None)
        self._ledger = ErasureLedger(b"", frozenset())
        self._ledger_stamp: int | None = -1  # the ledger file's mtime when read (None: none)

    def _erased(self) -> ErasureLedger:
        """The lake's erasure ledger, read again only when its file changed."""
        path = erasure_dir(self.writer.lake) / "ledger.json"
        try:
            stamp = path.stat().st_mtime_ns
        except FileNotFoundError:
            stamp = None
        if self._ledger_stamp != stamp:
            self._ledger = ErasureLedger.load(self.writer.lake)
            self._ledger_stamp = stamp
        return self._ledger

    def ingest(
        self,
        table: pa.Table,
        *,
        now: datetime,
        source: str,
        backfill: bool = False,
        default_server_id: str | None = None,
        unparseable: pa.Table | None = None,
        row_reasons: bool = False,
        board: Board | None = None,
    ) -> IngestReport:
        """Ingest one batch landed at `now`.

        Rows another live writer is landing right now are held back, not landed
        (`in_flight`: the caller answers "retry later"); rows settled within the horizon
        are dropped (`retries`).

        `backfill` (trusted historical imports) is stamped at landing like any event and
        flagged: it is the one exception to the lateness rule (it counts in every window its
        event_time falls in) and is folded at once. It passes the door like any event, so the
        same import re-run within the horizon lands nothing twice. `unparseable` rows
        (already in quarantine form) from the reader are quarantined alongside.
        `row_reasons` lists why each row of `table` was rejected (the HTTP API answers per
        row). A failure of Redis before landing
        raises (nothing landed); after landing it is reported in `fold_error` (the rows are
        durable, and `SpeedLayer.repair` folds them later).
        `board`: the rows are scores submitted to this direct board (`points` the score or
        delta), not match events; they take the same door, landing and fold, and count on
        that board only.

        The writer's landing lock is held throughout (`LandingWriter.landing`): ids this
        call claimed and left in flight (a settle or release lost to a Redis error) are
        recovered by any writer that meets them once this returns.
        """
        with self.writer.landing() as floor:
            # Never stamped before an open day's cut: its batch may have read the lake.
            now = landing_stamp(now, floor)
            return self._ingest(table, now=now, source=source, backfill=backfill,
                                default_server_id=default_server_id, unparseable=unparseable,
                                row_reasons=row_reasons, board=board)

    def _ingest(self, table: pa.Table, *, now: datetime, source: str, backfill: bool,
                default_server_id: str | None, unparseable: pa.Table | None,
                row_reasons: bool, board: Board | None) -> IngestReport:
        if board is not None:
            if backfill:
                raise ValueError("direct scores are not backfilled; submit them as scores")
            validated = validate_scores(table, self.registry, board, now=now,
                                        default_server_id=default_server_id, source=source,
                                        erased=self._erased())
        else:
            validated = validate_events(
                # A backfill is checked as if landed at its own event_time: never late.
                table, self.registry, now=now, ingested_at="event_time" if backfill else now,
                default_server_id=default_server_id, source=source,
                erased=self._erased(),
            )
        rejected = validated.rejected
        if unparseable is not None and unparseable.num_rows:
            rejected = pa.concat_tables([rejected, _with_server(
                unparseable.select(rejected.column_names).cast(rejected.schema),
                default_server_id)])
        accepted, claim, admitted = validated.accepted, None, None
        prev = self.writer.last_event_seq
        if self.speed is not None:
            admitted = self.speed.claim(accepted, now, self.writer.writer,
                                        self.writer.next_seq)
            accepted, claim = admitted.rows, admitted.claim
        held: Held | None = None
        if board is not None:  # a release of a refused score lands it on its board
            rejected = rejected.append_column(
                "board", pa.array([board.name] * rejected.num_rows, pa.string()))
        if self.rate is not None and not backfill:
            # After the door (a retry is no new event), before landing: held rows go to the
            # quarantine first, so a crash leaves their claims backed by the lake. A held
            # direct score keeps its board there (a release lands it on that board).
            held = self.rate.split(accepted, now, source)
            accepted = held.kept
        report = IngestReport(
            rows=table.num_rows + (0 if unparseable is None else unparseable.num_rows),
            accepted=accepted.num_rows, rejected=rejected.num_rows,
            duplicates=validated.duplicates,
            retries=0 if admitted is None else admitted.retries,
            in_flight=0 if admitted is None else admitted.in_flight,
            in_flight_writers=[] if admitted is None else list(admitted.holders),
            reasons=Counter(rejected.column("reason").to_pylist()),
        )
        if row_reasons:
            report.rejections = list(zip(
                validated.rejected_rows.tolist(),
                validated.rejected.column("reason").to_pylist(),
                validated.rejected.column("detail").to_pylist(), strict=True))
        if held is not None and held.held.num_rows:
            _count_held(report, held, table, validated.rejected_rows, row_reasons)
        first_seq = self.writer.next_seq
        try:
            faults.checkpoint("ingest.after_claim")
            if held is not None and held.held.num_rows:
                report.quarantine_files = self.writer.quarantine(held.held, now)
            report.files = self.writer.land(accepted, now, backfill=backfill)
        except BaseException:
            if held is not None:
                # Only what did not land: the rows of files landed before the failure count
                # in the minute. If the lake cannot be read, nothing is given back (the
                # minute holds more than it must until it expires, never too little).
                with suppress(redis.RedisError, OSError):
                    self.rate.give_back(  # type: ignore[union-attr]
                        held, _written_since(self.writer, first_seq, now))
            if claim is not None and claim.groups:
                # A retry must be accepted for every row that did not land (a landing over
                # several files may have landed some): settle from the lake, and fold
                # what landed (a resend at another writer calls those rows retries).
                # On a Redis error the claim stays in flight: this writer's next claim, or
                # any writer's claim that meets it once this landing is over, recovers it;
                # the landing failure is what the caller must see.
                with suppress(redis.RedisError):
                    self.speed.recover_writer(self.writer.writer)  # type: ignore[union-attr]
            raise
        faults.checkpoint("ingest.after_land")
        if claim is not None:
            # On a Redis error the claim stays in flight: recovered by the next claim that
            # meets it (this writer's, or another's once this landing is over) or a repair.
            with suppress(redis.RedisError):
                claim.settle()
        report.quarantine_files += self.writer.quarantine(rejected, now)
        if self.speed is not None and report.files:
            try:
                self.speed.after_land(report.files, prev=prev)
            except redis.RedisError as exc:
                report.fold_error = f"{type(exc).__name__}: {exc}"
        return report


def _with_server(rows: pa.Table, default_server_id: str | None) -> pa.Table:
    """The reader's refused rows with the batch's default server_id where they lack one, as
    the validated rows beside them get it: one file's rows name one server, whatever their
    reason (a row without it would be listed and released as `missing_field`)."""
    if default_server_id is None:
        return rows
    index = rows.schema.get_field_index("server_id")
    return rows.set_column(index, "server_id",
                           pc.fill_null(rows.column(index), default_server_id))


def _written_since(writer: LandingWriter, seq: int, now: datetime) -> list[pa.Table]:
    """The ids (match_id, player_id, a score's board) of the files `writer` landed from
    `seq` on, events and rows held for rate alike: what a landing that failed part-way
    wrote (every file of a landing is in the partition of its landing day)."""
    found = []
    for kind in ("events", "quarantine"):
        for landed in landed_files(writer.lake, kind=kind, days=[to_utc(now).date()]):
            if landed.writer != writer.writer or landed.seq < seq:
                continue
            if kind == "quarantine":
                found.append(held_ids(landed.path))
            else:
                names = pq.read_schema(landed.path).names
                found.append(pq.read_table(landed.path, columns=[
                    c for c in ("match_id", "player_id", "board") if c in names]))
    return found


def _count_held(report: IngestReport, held: Held, table: pa.Table,
                rejected_rows: npt.NDArray[np.int64], row_reasons: bool) -> None:
    """Held rows are rejected rows with reason implausible_rate (`report.accepted` already
    leaves them out); with `row_reasons`, each is answered at its row of the input (the
    first valid row with its identity)."""
    report.rejected += held.held.num_rows
    report.reasons.update(held.held.column("reason").to_pylist())
    if not row_reasons:
        return
    wanted = set(zip(held.held.column("match_id").to_pylist(),
                     held.held.column("player_id").to_pylist(), strict=True))
    invalid = set(rejected_rows.tolist())
    found: dict[tuple[str, str], int] = {}
    columns = [table.column(name).to_pylist() if name in table.column_names
               else [None] * table.num_rows for name in ("match_id", "player_id")]
    for row, identity in enumerate(zip(*columns, strict=True)):
        key = (str(identity[0]), str(identity[1]))
        if row not in invalid and key in wanted and key not in found:
            found[key] = row
    for identity, detail in zip(zip(held.held.column("match_id").to_pylist(),
                                    held.held.column("player_id").to_pylist(), strict=True),
                                held.held.column("detail").to_pylist(), strict=True):
        at = found.get(identity)
        if at is not None:
            report.rejections.append((at, "implausible_rate", detail))
    report.rejections.sort()
