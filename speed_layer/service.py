"""The speed layer as one object: admit (door), after-land (remember, fold), repair, rebase,
rebuild, bans and status. The CLI, the HTTP app and the DAG all go through it.
"""

from __future__ import annotations

import errno
import threading
import uuid
from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import redis

from leaderboard import faults
from leaderboard.bans import banned_players, write_tombstone
from leaderboard.batch_view import BatchView
from leaderboard.lake import (
    LandedFile,
    compaction_records,
    held_landing,
    idle_landing,
    landed_files,
    landing_floor,
    parse_landed_name,
    read_listed,
)
from leaderboard.manifest import Manifest, read_current, read_version
from leaderboard.profiles import PROFILES_KEY
from leaderboard.registry import Registry
from leaderboard.retained import Tally, deleted_through, kept_after, redoable
from leaderboard.speed_keys import (
    BANNED,
    BANS_GENERATION,
    CURRENT,
    VOIDS,
    BoardWindowKeys,
    SpeedVersion,
    StateLost,
    bans_key,
    read_current_version,
    read_live_version,
    voids_key,
    windows_key,
)
from leaderboard.voids import ALL_PLAYERS, Void, VoidIndex, VoidLimit, read_voids, write_void
from speed_layer.dedupe import Counted, absorbed_files, ingest_order, match_ids
from speed_layer.door import Admission, Claim, ClaimPending, Door, RecordLost
from speed_layer.fold import FOLD_SCRIPT, Folder, plan_updates, predecessors
from speed_layer.rate import held_ids, rate_key
from speed_layer.seed import player_rollups, seed_updates

__all__ = ["Admitted", "RebuildRunning", "SpeedLayer", "SpeedStatus", "VoidApplied"]

_EXPIRE_OLD_VERSION = 3600

#: KEYS: a lock. ARGV: the owner's token. Deletes the lock only while that owner holds it.
_RELEASE_IF_OWNER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
#: KEYS: a lock. ARGV: the owner's token, milliseconds. Extends the lock only while that
#: owner holds it; returns 0 if it does not.
#: KEYS: the version pointer, a lock. ARGV: the pointer the writer read, the new pointer,
#: the lock owner's token ('' for none). Moves the pointer only if it still holds what the
#: writer read (and the lock is still the writer's): a flush (Redis lost its data) or another
#: writer in between refuses, never a pointer written back over an empty state.
_SET_POINTER_IF = """
if redis.call('GET', KEYS[1]) ~= (ARGV[1] ~= '' and ARGV[1] or false) then return 0 end
if ARGV[3] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[3] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
return 1
"""
_EXTEND_IF_OWNER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
#: Held while a rebuild runs (one at a time across processes); expires if its process dies,
#: and is extended every third of this while the rebuild runs (a rebuild may take longer).
#: Hash-tagged into the version pointer's slot (`lb:current`): the pointer is written in one
#: script that checks this lock, also on a Redis Cluster.
_REBUILDING = "{lb:current}:rebuilding"
_REBUILD_LOCK_SECONDS = 600
#: Keys whose MEMORY USAGE `status` sums (the console polls it): past this it extrapolates.
_STATUS_MEMORY_SAMPLE = 5000


class _LockKeeper:
    """Keeps a lock in Redis while its owner works: a thread extends it every third of its
    ttl, so a rebuild longer than the ttl keeps it, while a dead process's lock still
    expires. `lost` turns True if the lock was gone (expired, or taken) at a beat."""

    def __init__(self, client: redis.Redis, key: str, token: str, seconds: float) -> None:
        self.client, self.key, self.token, self.seconds = client, key, token, seconds
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"keep {key}", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.seconds / 3):
            try:
                if not self.client.eval(_EXTEND_IF_OWNER, 1, self.key, self.token,
                                        int(self.seconds * 1000)):
                    self.lost = True
                    return
            except redis.RedisError:
                continue  # a blip: the next beat retries (the ttl leaves room for two)

    def __enter__(self) -> _LockKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class RebuildRunning(StateLost):
    """Another process is rebuilding the speed state right now."""

    def __init__(self, detail: str) -> None:
        redis.RedisError.__init__(self, detail)


def _is_version_key(key: str) -> bool:
    """Whether a key belongs to one speed version: `lb:{k}:V:...` or `lb:V:...` (not the
    global `lb:current`, `lb:banned`, the door's or the profiles')."""
    return key.startswith("lb:{") or (key.count(":") >= 2 and key.split(":", 2)[1][:1].isdigit()
                                      ) or key.startswith("lb:none:")


def _glob_escape(text: str) -> str:
    """`text` as a literal in a SCAN MATCH pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


@dataclass(frozen=True)
class Admitted:
    """What the door let through of a batch: the rows to land (claimed by `claim`), the
    retries dropped, and the rows held back because another live writer (`holders`) is
    landing them right now (the caller answers those "retry later")."""

    rows: pa.Table
    retries: int
    in_flight_rows: pa.Table
    holders: tuple[str, ...]
    claim: Claim

    @property
    def in_flight(self) -> int:
        return int(self.in_flight_rows.num_rows)


@dataclass(frozen=True)
class SpeedStatus:
    #: "ok (epoch ...)", or "lost: <why and what to run>" (Redis lost its data).
    state: str
    version: str | None
    watermark: str | None
    board_windows: int
    lag_files: int
    #: Pending files with a later file of the same writer folded (folds that failed).
    holes: int
    newest_landed: dict[str, int]
    #: Per writer: every events file up to this seq is folded (or before the watermark).
    folded: dict[str, int]
    keys: int
    memory_bytes: int
    banned: int
    #: The open day's cut recorded by `batch --allow-open-day` while it is ahead of the wall
    #: clock: every landing is stamped at it until then (`leaderboard.lake.landing_floor`).
    open_day_cut_ahead: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def _cut_ahead(lake: Path) -> str | None:
    """The recorded open day's cut when it is ahead of the wall clock (None otherwise)."""
    floor = landing_floor(lake)
    return floor.isoformat() if floor is not None and floor > datetime.now(UTC) else None


def _applied_key(void: Void) -> str:
    """A void's member in a version's set of applied voids (`voids_key`)."""
    return f"{void.match_id}\x00{void.player_id or ALL_PLAYERS}"


@dataclass(frozen=True)
class VoidApplied:
    """A void's answer: the players whose live standings changed, and what it could not
    remove (None: everything it names is removed, or will be when it lands). `earlier`:
    the void already recorded that covers this one (the same result, or its whole match),
    when there is one: nothing new is recorded, and `players` is empty unless that void's
    own application had not finished (a Redis failure part-way) and this one finished it.
    `landed`: some event of it is in the lake (else it waits for them: they will not
    count)."""

    players: list[str]
    limit: VoidLimit | None
    earlier: Void | None = None
    landed: bool = True

    def as_dict(self, match_id: str, player_id: str | None) -> dict[str, object]:
        """The answer of `POST /v1/admin/voids` and `leaderboard void --json`."""
        return {"match_id": match_id, "player_id": player_id,
                "status": "voided" if self.earlier is None else "already_voided",
                "players": self.players,
                "not_removed": None if self.limit is None else self.limit.as_dict(),
                "earlier": None if self.earlier is None else self.earlier.as_dict()}


@dataclass(frozen=True)
class _Seed:
    """A player's base part recomputed: raw rows (every void applied) and rollup rows of the
    live version (the event dates not recomputed from raw rows; none before retention)."""

    rows: pa.Table
    rollups: pa.Table | None = None


def _on(rows: pa.Table, days: pa.Array, wanted: set[date]) -> pa.Table:
    """The rows whose event date (`days`, one per row) is in `wanted`."""
    return rows.filter(pc.is_in(days, value_set=pa.array(sorted(wanted), pa.date32())))


def _event_dates(rows: pa.Table) -> pa.Array | pa.ChunkedArray:
    """Each row's event date (UTC), as the batch's rollups date it."""
    return pc.cast(pc.cast(rows.column("event_time"), pa.timestamp("us", tz="UTC")),
                   pa.date32())


def _tallies(rows: pa.Table) -> dict[date, Tally]:
    """(events, points) per event date of deduped raw rows: what their rollup rows count."""
    found: dict[date, Tally] = {}
    for day, points in zip(_event_dates(rows).to_pylist(), rows.column("points").to_pylist(),
                           strict=True):
        events, total = found.get(day, (0, 0))
        found[day] = (events + 1, total + points)
    return found


class SpeedLayer:
    def __init__(self, client: redis.Redis, registry: Registry, lake: Path) -> None:
        self.client = client
        self.registry = registry
        self.lake = Path(lake)
        self.folder = Folder(client, registry, lake)
        self.folder.on_ban_race = self._ban_race
        self.folder.on_void_race = self._void_race
        self.door = Door(client, registry.idempotency_horizon)
        #: {(tag, version): {event date: whether a void may recompute it}} (`_redoable`)
        self._redoable_cache: dict[tuple[str, str], dict[date, bool]] = {}

    # -- versions ---------------------------------------------------------------------------

    @staticmethod
    def version_of(manifest: Manifest | None) -> SpeedVersion:
        if manifest is None:
            return SpeedVersion(None, None)
        return SpeedVersion(manifest.version, manifest.watermark_at)

    def current(self) -> SpeedVersion:
        """The live speed version. On first use (nothing in the lake a state must hold) it
        is pointed at the lake's live batch version with a new epoch; a state that lost its
        past (Redis lost its data) raises StateLost instead: it must be rebuilt first."""
        # Writers need the door's record too: a state is needed for the lake's events
        # within two horizons before the watermark, not only since it.
        found = read_live_version(self.client, self.lake,
                                  margin=self.registry.idempotency_horizon * 2)
        if found is not None:
            return found
        fresh = self.version_of(read_current(self.lake)).with_epoch()
        # Redis may have lost its ban set with the rest (a flush with nothing recent in the
        # lake): the lake's bans go into the state before any fold can read it.
        self.apply_bans(fresh, atomic=False)
        self.sync_voids()
        # The door's record belongs to this state from now on (its claims check the marker:
        # a flush after this leaves none, and the claim refuses). Marked before the
        # pointer: a blip part-way leaves no pointer, and the next call marks every group
        # again; processes racing to first use each add their epoch, and the pointer's
        # winner had marked every group before it wrote the pointer.
        assert fresh.epoch is not None
        self.door.mark_epoch(fresh.epoch)
        self.client.set(CURRENT, fresh.to_json(), nx=True)
        found = read_current_version(self.client)
        if found is None or not found.epoch:
            raise StateLost("the speed state's version pointer vanished while it was written")
        return found

    # -- ingest -----------------------------------------------------------------------------

    def claim(self, accepted: pa.Table, at: datetime, writer: str,
              next_seq: int) -> Admitted:
        """Claim the ids of rows about to land: drops the retries (settled within the
        horizon) and holds back the rows in flight at another writer that is landing right
        now (answer those "retry later": that landing may still fail). The caller holds the
        writer's landing lock (`LandingWriter.landing`) from here to the settle. Settle the
        claim once the rows landed, release it if landing failed. Claims left in flight
        by a writer not landing now are recovered first: this writer's own (a restarted
        writer, a settle lost to a Redis error), and those of any other writer whose rows
        this batch holds once its landing lock is free (the writer is dead, or alive between
        landings: its claim outlived its landing): a client's retry lands here exactly once,
        or is a retry. A lost state raises StateLost before anything lands (its record of
        recent ids may be gone too: retries must wait for the rebuild); the claim itself
        checks the state's epoch, so a loss after this check refuses too."""
        lock = held_landing(self.lake, writer)
        admission = self._claim(accepted, at, writer, next_seq, lock)
        if admission.busy.any():
            try:
                recovered = self.recover_idle_writers(admission.holders - {writer})
            except BaseException:
                # Nothing lands: this claim must not stay in flight at a live writer (every
                # copy elsewhere would be answered "retry later" until its next claim).
                with suppress(redis.RedisError):
                    admission.claim.release()
                raise
            if recovered:
                admission.claim.release()
                admission = self._claim(accepted, at, writer, next_seq, lock)
        kept = ~(admission.seen | admission.busy)
        return Admitted(accepted if kept.all() else accepted.filter(pa.array(kept)),
                        int(admission.seen.sum()), accepted.filter(pa.array(admission.busy)),
                        tuple(sorted(admission.holders)) if admission.busy.any() else (),
                        admission.claim)

    def _claim(self, accepted: pa.Table, at: datetime, writer: str,
               next_seq: int, lock: str) -> Admission:
        for attempt in range(3):
            epoch = self.current().epoch
            assert epoch is not None
            try:
                try:
                    return self.door.claim(accepted, at, writer, next_seq, epoch=epoch,
                                           lock=lock)
                except ClaimPending:
                    self.recover_writer(writer)
                    return self.door.claim(accepted, at, writer, next_seq, epoch=epoch,
                                           lock=lock)
            except RecordLost:
                if attempt == 2 or self.current().epoch == epoch:
                    raise StateLost("the door's record of recent ids is gone (Redis lost "
                                    "its data) or predates its epoch marker") from None
                # A rebuild flipped the state meanwhile: claim on the rebuilt record.
        raise AssertionError("unreachable")

    def recover_writer(self, writer: str) -> int:
        """Recover what a failed landing or a dead process of `writer` left (the caller
        holds its landing lock): fold its landed files not folded yet, then settle its
        claims. Rows landed but not folded (a kill after landing, a landing failed part-way)
        would otherwise be missing from the live state, while the door calls their copies
        retries, until some repair. Folding first: if it fails, the claims stay in flight
        and the next hit retries both. Returns how many ids were released."""
        version = self.current()
        pending = self.folder.pending(version, writer)
        if pending:
            self.folder.catch_up(version, pending)
        return self.recover_claims(writer)

    def recover_claims(self, writer: str) -> int:
        """Settle the claims a dead process of `writer` left in flight from the lake: ids
        whose rows landed stay claimed, the others are released. Returns how many were
        released. The caller holds the writer's landing lock (it is that writer, or took it
        with `idle_landing`): no process of the writer is landing them."""
        flights = self.door.in_flight(writer)
        if not flights:
            return 0
        since = min(f.next_seq for f in flights)
        landed: set[bytes] = set()
        for path in [f.path for f in landed_files(self.lake)
                     if f.writer == writer and f.seq >= since] + self._compacted(writer, since):
            names = pq.read_schema(path).names  # `board`: direct scores' files
            landed |= self.door.records_of(pq.read_table(
                path, columns=[c for c in ("match_id", "player_id", "board") if c in names]))
        for found in landed_files(self.lake, kind="quarantine"):  # rows held for rate
            if found.writer == writer and found.seq >= since:
                landed |= self.door.records_of(held_ids(found.path))
        return self.door.recover(writer, landed, flights)

    def _compacted(self, writer: str, since: int) -> list[Path]:
        """The compacted files now holding rows of `writer`'s files from seq `since` on
        (through compactions of compactions): a dead writer's landed file may be absorbed
        and compacted before anyone recovers its claims, and its ids must stay settled."""
        records = compaction_records(self.lake)
        holding = {original for originals in records.values() for original in originals
                   if (name := parse_landed_name(Path(original))) is not None
                   and name[0] == writer and name[1] >= since}
        grew = bool(holding)
        while grew:
            grew = False
            for target, originals in records.items():
                if target not in holding and not holding.isdisjoint(originals):
                    holding.add(target)
                    grew = True
        return [self.lake / t for t in sorted(holding & records.keys())
                if (self.lake / t).exists()]

    def recover_idle_writers(self, writers: Iterable[str]) -> int:
        """Recover the claims in flight of each of `writers` that is not landing now (its
        landing lock is free: the process is dead, or alive between landings, its claim
        outlived the landing, e.g. a settle lost to a Redis error); a landing writer's claims
        are never touched. Returns how many writers were recovered."""
        recovered = 0
        for writer in sorted(writers):
            locks = {f.lock for f in self.door.in_flight(writer)}
            with idle_landing(self.lake, writer, locks) as idle:
                if idle:
                    self.recover_writer(writer)
                    recovered += 1
        return recovered

    def after_land(self, files: list[LandedFile], *, prev: int | None = None) -> None:
        """Fold each landed file into the live version (its ids were claimed before it
        landed).

        `prev`: the seq of the writer's events file before these (`LandingWriter.
        last_event_seq` before landing). A file of the writer left unfolded before them (a
        fold that failed, a crash) is folded here too: completeness does not depend on the
        caller running a repair."""
        version = self.current()
        for landed in files:
            self.folder.fold(version, landed.writer, landed.seq, pq.read_table(landed.path),
                             prev=prev)
            prev = landed.seq
        for writer in sorted({f.writer for f in files}):
            if self.folder.past_floor.get((version.tag, writer), 0):
                self.folder.advance(version)
                self.folder.catch_up(version, self.folder.pending(version, writer))

    def repair(self) -> int:
        """After a crash: remember the ids of, and fold, every file not folded everywhere
        (whatever landed after it), then settle the claims writers not landing now (dead,
        or between landings) left in flight.
        Returns how many files were folded."""
        version = self.current()
        pending = self.folder.pending(version)
        prevs = predecessors(landed_files(self.lake))
        for landed in pending:
            table = pq.read_table(landed.path)
            self._remember_landed(table)
            self.folder.fold(version, landed.writer, landed.seq, table,
                             prev=prevs.get((landed.writer, landed.seq)))
        self.folder.advance(version)
        self.recover_idle_writers(self.door.writers_in_flight())
        return len(pending)

    def _remember_landed(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        stamps = table.column("ingested_at")
        for stamp in pc.unique(stamps).to_pylist():
            self.door.remember(table.filter(pc.equal(stamps, pa.scalar(stamp, stamps.type))),
                               stamp)

    # -- rebase / rebuild -------------------------------------------------------------------

    def sync_bans(self) -> set[str]:
        """Make `lb:banned` agree with the lake's tombstones (the lake is the truth)."""
        banned = banned_players(self.lake)
        known = {_text(b) for b in self.client.smembers(BANNED)}
        if banned != known:
            self._set_banned(add=banned - known, remove=known - banned)
        return banned

    def _set_banned(self, *, add: set[str] = frozenset(),  # type: ignore[assignment]
                    remove: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        """Change `lb:banned` and count the change (a fold that read the old set sees it)."""
        pipe = self.client.pipeline(transaction=True)
        if add:
            pipe.sadd(BANNED, *sorted(add))
        if remove:
            pipe.srem(BANNED, *sorted(remove))
        pipe.incr(BANS_GENERATION)
        pipe.execute()

    def rebase(self, manifest: Manifest, *, now: datetime | None = None,
               attempt: int = 0) -> SpeedVersion:
        """Build the state of a newly published version beside the live one, flip `current`
        to it, catch up what landed meanwhile, and let the old version's keys expire. On a
        lost state it rebuilds the lake's live version instead (`now`: for the horizon).
        The flip moves the pointer only if it is still the one read at the start: a flush
        in between (V+1's keys partial, the old epoch gone) is a lost state, not a pointer
        written back over it."""
        self.sync_bans()
        self.sync_voids()
        try:
            old = self.current()
        except StateLost:
            self.rebuild(now or datetime.now(UTC))
            return self.current()
        new = self.version_of(manifest).with_epoch(old.epoch)
        if new.tag == old.tag:
            # Already live (or just pointed at on first use): fold whatever is still pending.
            self.folder.catch_up(old)
            self.apply_bans(old)
            self.apply_voids(old)
            return old
        self.folder.catch_up(new, dedupe=True)
        # The base of V+1 holds only bans before its watermark: apply the rest before the
        # flip (nobody reads V+1 yet: one pipeline), and again after it for a ban or unban
        # that reached the lake meanwhile.
        self.apply_bans(new, atomic=False)
        self.apply_voids(new)
        faults.checkpoint("rebase.after_catch_up")
        if not self._set_pointer(new, expected=old):
            # Redis lost its data (or another rebase moved the pointer) since `old` was
            # read: V+1's keys may be partial; start again from what the pointer says now.
            if attempt >= 1:
                raise StateLost("the speed state's version pointer changed under the rebase "
                                "twice; run `leaderboard speed rebuild`")
            return self.rebase(manifest, now=now, attempt=attempt + 1)
        faults.checkpoint("rebase.after_flip")
        self.apply_bans(new)
        self.apply_voids(new)
        self.folder.catch_up(new)
        self.expire_version(old.tag)
        return new

    def _set_pointer(self, version: SpeedVersion, *, expected: SpeedVersion | None,
                     token: str = "") -> bool:
        """Point `current` at `version` if it still points at `expected` (None: nothing)
        and, with a token, the rebuild lock is still that token's: one atomic step."""
        return bool(self.client.eval(
            _SET_POINTER_IF, 2, CURRENT, _REBUILDING,
            "" if expected is None else expected.to_json(), version.to_json(), token))

    def expire_version(self, tag: str, seconds: int = _EXPIRE_OLD_VERSION) -> int:
        count = 0
        pipe = self.client.pipeline(transaction=False)
        for key in self._version_keys(tag):
            pipe.expire(key, seconds)
            count += 1
        pipe.execute()
        return count

    def _version_keys(self, tag: str) -> list[Any]:
        """Every key of one version: its board-window keys (hash-tagged) and its own."""
        return [key for pattern in (f"lb:{{*}}:{tag}:*", f"lb:{tag}:*")
                for key in self.client.scan_iter(match=pattern, count=1000)]

    def rebuild(self, now: datetime) -> int:
        """Recreate the live version's state and the record of recent ids from the lake
        alone (after Redis lost its data), under a new epoch; returns the files folded.

        The version pointer is written last: until then the state counts as lost, so
        nothing is served from it or folded onto it by live ingest (files landed meanwhile
        stay pending and are folded right after). One rebuild runs at a time (a lock in
        Redis, extended while the rebuild runs, so one longer than its ttl keeps it); another
        raises RebuildRunning. Fault checkpoint: rebuild.after_reset.
        """
        token = uuid.uuid4().hex
        seconds = _REBUILD_LOCK_SECONDS
        if not self.client.set(_REBUILDING, token, nx=True, ex=seconds):
            raise RebuildRunning("a rebuild of the speed state is already running; wait for "
                                 "it (`leaderboard speed status` shows when it is done)")
        try:
            with _LockKeeper(self.client, _REBUILDING, token, seconds) as keeper:
                return self._rebuild(now, keeper)
        finally:
            # Compare and delete in one step: never another rebuild's lock.
            self.client.eval(_RELEASE_IF_OWNER, 1, _REBUILDING, token)

    def _rebuild(self, now: datetime, keeper: _LockKeeper) -> int:
        version = self.version_of(read_current(self.lake)).with_epoch()
        self.client.delete(CURRENT)
        keys = self._version_keys(version.tag)
        for start in range(0, len(keys), 1000):
            self.client.delete(*keys[start:start + 1000])
        self.sync_bans()
        self.sync_voids()
        faults.checkpoint("rebuild.after_reset")
        horizon_start = now - self.registry.idempotency_horizon * 2
        for landed in landed_files(self.lake):
            if landed.ingest_date >= (horizon_start - timedelta(days=1)).date():
                table = pq.read_table(landed.path)
                table = table.filter(pc.greater_equal(
                    table.column("ingested_at"),
                    pa.scalar(horizon_start, table.schema.field("ingested_at").type)))
                self._remember_landed(table)
        for held in landed_files(self.lake, kind="quarantine"):  # a retry stays a retry
            if held.ingest_date >= (horizon_start - timedelta(days=1)).date():
                ids = held_ids(held.path)
                self._remember_landed(ids.filter(pc.greater_equal(
                    ids.column("ingested_at"),
                    pa.scalar(horizon_start, ids.schema.field("ingested_at").type))))
        folded = self.folder.catch_up(version, building=True, dedupe=True)
        self.apply_bans(version, atomic=False)  # the pointer is not written yet
        self.apply_voids(version)
        if keeper.lost:
            raise RebuildRunning("this rebuild lost its lock (Redis stalled longer than "
                                 "its ttl) and another may be running: run `leaderboard "
                                 "speed rebuild` again once `speed status` shows none")
        assert version.epoch is not None
        self.door.mark_epoch(version.epoch, only=True)  # the record is this state's
        # Only while the lock is still ours and nobody wrote a pointer: a flush during the
        # rebuild took the lock with the rest, and its state is partial.
        if not self._set_pointer(version, expected=None, token=keeper.token):
            raise StateLost("Redis lost its data while the speed state was rebuilt: run "
                            "`leaderboard speed rebuild` again")
        self.apply_bans(version)  # a ban or unban that reached the lake meanwhile
        self.apply_voids(version)
        return folded + self.folder.catch_up(version)

    # -- bans -------------------------------------------------------------------------------

    def _windows(self, version: SpeedVersion) -> list[tuple[str, str]]:
        found = set()
        for raw in self.client.smembers(windows_key(version.tag)):
            board, _, window_id = _text(raw).partition("|")
            found.add((board, window_id))
        return sorted(found)

    def _base_keys_of(self, version: SpeedVersion, players: set[str]
                      ) -> dict[str, dict[tuple[str, str], int]]:
        """Each player's base sort key in every board-window of the base version."""
        found: dict[str, dict[tuple[str, str], int]] = {p: {} for p in players}
        if version.version is None or not players:
            return found
        view = BatchView(self.lake, read_version(self.lake, version.version))
        index = view.manifest.standings(self.lake)
        # A file may also hold rows of a board-window this version reads from another file
        # (an earlier version's, carried for its other windows): only the index's file counts.
        where = dict(zip(zip(index.column("board").to_pylist(),
                             index.column("window_id").to_pylist(), strict=True),
                         index.column("path").to_pylist(), strict=True))
        wanted = sorted(players)
        for path in sorted(set(index.column("path").to_pylist())):
            table = pq.read_table(self.lake / path, columns=["window_id", "player_id",
                                                             "sort_key"],
                                  filters=[("player_id", "in", wanted)])
            board = path.split("board=", 1)[1].split("/", 1)[0]
            for window_id, player, key in zip(table.column("window_id").to_pylist(),
                                              table.column("player_id").to_pylist(),
                                              table.column("sort_key").to_pylist(), strict=True):
                if where.get((board, window_id)) == path:
                    found[player][(board, window_id)] = int(key)
        return found

    def _hide(self, version: SpeedVersion, players: set[str],
              only: list[tuple[str, str]] | None = None, *, atomic: bool = True) -> int:
        """Apply bans to one version's state: each player leaves M, their base keys go to T
        (so the base's copy is hidden too) and the board-window's B set holds them. `only`
        limits it to those board-windows. `atomic=False` (a state nobody reads yet: before
        a rebase's flip, during a rebuild) sends everything in one pipeline instead of one
        transaction per board-window."""
        if not players:
            return 0
        windows = set(self._windows(version)) if only is None else set(only)
        bases = self._base_keys_of(version, players)
        touched = 0
        bulk = self.client.pipeline(transaction=False)
        for player in sorted(players):
            base = bases[player]
            found = windows | set(base) if only is None else windows
            for board, window_id in sorted(found):
                keys = BoardWindowKeys(board, window_id, version.tag)
                pipe = self.client.pipeline(transaction=True) if atomic else bulk
                pipe.sadd(keys.banned, player)
                pipe.zrem(keys.merged, player)
                pipe.hdel(keys.last_marks, player)
                if (board, window_id) in base:
                    pipe.zadd(keys.touched, {player: base[(board, window_id)]})
                if atomic or len(bulk) >= 4000:
                    pipe.execute()
                touched += 1
        bulk.execute()
        if only is None:
            self.client.sadd(bans_key(version.tag), *sorted(players))
        return touched

    def _restore(self, version: SpeedVersion, player: str,
                 only: list[tuple[str, str]] | None = None) -> int:
        """Undo a ban in one version's state exactly (`_recompute` with the ban lifted).
        `only` limits it to those board-windows."""
        return self._recompute(version, player, only, unban=True)

    def _recompute(self, version: SpeedVersion, player: str,
                   only: list[tuple[str, str]] | None = None, *, unban: bool = False) -> int:
        """Recompute one player's state in one version exactly from the lake: per
        board-window, in one transaction (so no fold interleaves), the player's keys reset
        and their events since the watermark replayed from every file already folded
        there, voided rows left out. When a void the base did not apply names a row the
        base counted, the player's base part is recomputed too, from their raw rows before
        the watermark and, after retention, its rollup rows (`_seed`): the base key goes to T
        (hidden) and the recomputed
        value starts M. `only` limits it to those board-windows; `unban` lifts the ban."""
        progress = self.folder.progress(version)
        seed = self._seed(version, player)
        calls: dict[tuple[str, str], list[Any]] = {}
        if seed is not None:
            updates = seed_updates(seed.rows, seed.rollups, self.registry)
            for call in self.folder.calls_of(version, "seed", 0, updates, mode="seed",
                                             banned=set(), floor=-1, based=False):
                calls.setdefault((call.keys.board, call.keys.window_id), []).append(call)
        # The player's speed rows counted as the batch counts them (speed_layer.dedupe).
        files = [(landed, pq.read_table(landed.path, filters=[("player_id", "=", player)]))
                 for landed in ingest_order(self.folder.pending_or_folded(version))]
        counted = Counted.of_base(self.lake, version.watermark,
                                  match_ids(table for _, table in files), player=player)
        for landed, table in files:
            table = counted.fresh(table)
            table = self.folder.voids_of(table).drop(table)
            if table.num_rows:
                for call in self.folder.calls(version, landed.writer, landed.seq, table,
                                              mode="replay", banned=set(),
                                              floor=progress.floors.get(landed.writer, -1),
                                              based=seed is None):
                    calls.setdefault((call.keys.board, call.keys.window_id), []).append(call)
        bases = self._base_keys_of(version, {player})[player]
        if only is None:
            # Every board-window the ban touched: the live ones and the player's base ones (a
            # closed window the speed layer never folded into still hides the player).
            windows = set(self._windows(version)) | set(calls) | set(bases)
        else:
            windows = set(only)
        sha = self.client.script_load(FOLD_SCRIPT)
        for board, window_id in sorted(windows):
            keys = BoardWindowKeys(board, window_id, version.tag)
            pipe = self.client.pipeline(transaction=True)
            if unban:
                pipe.srem(keys.banned, player)
            pipe.zrem(keys.merged, player)
            pipe.zrem(keys.touched, player)
            pipe.hdel(keys.last_marks, player)
            if seed is not None and (board, window_id) in bases:
                pipe.zadd(keys.touched, {player: bases[(board, window_id)]})
            for call in calls.get((board, window_id), []):
                # execute_command, not .evalsha(): redis-py's cluster pipeline blocks the
                # method (the keys share one hash tag, so the MULTI stays in one slot).
                pipe.execute_command(  # type: ignore[no-untyped-call]
                    "EVALSHA", sha, len(call.keys.all()), *call.keys.all(), *call.args)
            pipe.execute()
        if only is None and unban:
            self.client.srem(bans_key(version.tag), player)
        return len(windows)

    def _seed(self, version: SpeedVersion, player: str) -> _Seed | None:
        """The player's base part as the next batch will count it, when a void the base did
        not apply (at or after its watermark) names a row the base counted; None when none
        does (the base key is right as it is), and for a player the base left out (banned
        before its watermark).

        Before retention: their raw rows ingested before the watermark, deduped as the
        batch does (first ingested wins, then the file name), voided rows left out. After
        it, exactly what the next batch's void night does (jobs.revoid): the event dates
        after the safe line (`kept_after`) that a late void touches are recomputed from
        those raw rows, each only if the same rows with the base's voids give back the
        base's rollup rows of that date (else a raw row of it is gone: the base stands);
        every other date is the base's rollup rows of the player. A void of a result on a
        date at or before the line changes nothing here, nor in the batch (`void_limit`
        tells the operator)."""
        if version.version is None or version.watermark is None:
            return None
        voids = read_voids(self.lake)
        late = VoidIndex.of(v for v in voids if v.at >= version.watermark)
        if not late:
            return None
        if player in banned_players(self.lake, before=version.watermark):
            # The base left the player out (banned before its watermark): unbanned since,
            # they are served the events since the watermark until the next batch
            # (docs/architecture.md, known limits), so no base part is theirs to recompute;
            # a seed would bring their whole history back, only because a void named it.
            return None
        rows = self._absorbed_rows(version, player)
        if rows is None:
            return None
        hit = late.mask(rows)
        if not pc.any(hit).as_py():
            return None
        line = kept_after(self.lake, self.registry)
        if line is None:
            return _Seed(VoidIndex.of(voids).drop(rows))
        days = _event_dates(rows)
        touched = {d for d in pc.unique(days.filter(hit)).to_pylist() if d > line}
        redone = sorted(self._redoable(version, touched))
        if not redone:
            return None
        rollups = player_rollups(self.lake, read_version(self.lake, version.version), player)
        kept = rollups.filter(pc.invert(pc.is_in(rollups.column("event_date"),
                                                 value_set=pa.array(redone, pa.date32()))))
        return _Seed(VoidIndex.of(voids).drop(_on(rows, days, set(redone))), kept)

    def _redoable(self, version: SpeedVersion, days: set[date]) -> set[date]:
        """The event dates of `days` (after the safe line) a void may recompute, decided as
        the next batch's void night decides them (`leaderboard.retained.redoable`, per date
        over every player's kept raw rows, deduped, with the base's voids): cached per
        (version, date), as a version's absorbed rows, voids and rollups never change."""
        assert version.version is not None
        assert version.watermark is not None
        key = (version.tag, version.version)
        cache = self._redoable_cache.setdefault(key, {})
        if len(self._redoable_cache) > 4:  # old versions: forget
            for stale in [k for k in self._redoable_cache if k != key]:
                del self._redoable_cache[stale]
        wanted = sorted(days - set(cache))
        if wanted:
            stamp = pa.timestamp("us", tz="UTC")
            start = datetime.combine(wanted[0], datetime.min.time(), UTC)
            end = datetime.combine(wanted[-1] + timedelta(days=1), datetime.min.time(), UTC)
            on_days = ((pc.field("event_time") >= pa.scalar(start, stamp))
                       & (pc.field("event_time") < pa.scalar(end, stamp)))
            candidates = self._absorbed_rows(version, on_days, dedupe=False)
            raw: dict[date, Tally] = {}
            if candidates is not None:
                # Every copy of their identities, wherever its event date: the batch dedupes
                # over all absorbed files (an identity's copies share its match id).
                matches = pc.unique(candidates.column("match_id"))
                rows = self._absorbed_rows(version, pc.field("match_id").isin(matches))
                if rows is not None:
                    old = VoidIndex.of(v for v in read_voids(self.lake)
                                       if v.at < version.watermark)
                    raw = _tallies(old.drop(rows))
            base = read_version(self.lake, version.version).rollups(self.lake)
            fine = set(redoable(wanted, raw, base))
            cache.update({d: d in fine for d in wanted})
        return {d for d in days if cache[d]}

    def _absorbed_rows(self, version: SpeedVersion, where: str | pc.Expression, *,
                       dedupe: bool = True) -> pa.Table | None:
        """The raw rows still in the lake that the base counted (ingested before its
        watermark) of one player (`where` a player id) or matching an expression, one per
        identity as the batch dedupes (first ingested wins, then the file name; not with
        `dedupe` False); None when there are none."""
        assert version.watermark is not None
        mark = pa.scalar(version.watermark, pa.timestamp("us", tz="UTC"))
        filters = pc.field("player_id") == where if isinstance(where, str) else where
        def read(files: list[LandedFile]) -> list[pa.Table]:
            parts = []
            for landed in files:
                table = pq.read_table(landed.path, filters=filters)
                if table.num_rows:
                    table = table.filter(pc.less(table.column("ingested_at"), mark.cast(
                        table.schema.field("ingested_at").type)))
                    parts.append(table.append_column("_file", pa.array(
                        [str(landed.path)] * table.num_rows, pa.string())))
            return parts

        watermark = version.watermark
        parts = read_listed(lambda: absorbed_files(self.lake, watermark), read)
        if not parts:
            return None
        rows = pa.concat_tables(parts, promote_options="default").sort_by(
            [("ingested_at", "ascending"), ("_file", "ascending")])
        if not dedupe:
            return rows.drop_columns(["_file"])
        # One row per identity (a player's direct scores share match ids with their match
        # events: the identity names the board too).
        rows = Counted().fresh(rows).drop_columns(["_file"])
        return rows if rows.num_rows else None

    def _ban_race(self, version: SpeedVersion, players: set[str],
                  windows: list[tuple[str, str]]) -> None:
        """A fold applied a file with a banned set a ban or unban changed meanwhile: apply
        those players' resulting state again to the board-windows it wrote (idempotent)."""
        banned = {_text(b) for b in self.client.smembers(BANNED)}
        self._hide(version, players & banned, windows)
        for player in sorted(players - banned):
            self._restore(version, player, windows)

    def apply_bans(self, version: SpeedVersion, *, atomic: bool = True) -> int:
        """Make one version's state agree with the lake's ban state (latest tombstone wins),
        whatever each tombstone's time against the watermark: the batch applies only bans
        before its watermark, so a ban (or unban) since then is applied here, on every
        version the speed layer builds. Returns the number of players changed."""
        banned = self.sync_bans()
        applied = {_text(p) for p in self.client.smembers(bans_key(version.tag))}
        self._hide(version, banned - applied, atomic=atomic)
        for player in sorted(applied - banned):
            self._restore(version, player)
        return len(banned ^ applied)

    def ban(self, player: str, at: datetime, reason: str = "") -> int:
        """Tombstone in the lake, then vanish from every live board-window at once."""
        write_tombstone(self.lake, player, "ban", at, reason)
        if player not in banned_players(self.lake):
            return 0  # a later unban (or one at the same instant) already stands
        self._set_banned(add={player})
        return self._hide(self.current(), {player})

    def unban(self, player: str, at: datetime) -> int:
        """Tombstone, then restore the player exactly: base keys back, and the player's
        events since the watermark replayed where they were already folded."""
        write_tombstone(self.lake, player, "unban", at)
        if player in banned_players(self.lake):
            return 0  # a later ban already stands: the lake's latest tombstone decides
        self._set_banned(remove={player})
        return self._restore(self.current(), player)

    # -- voids ------------------------------------------------------------------------------

    def sync_voids(self) -> VoidIndex:
        """Make the voids hash agree with the lake's void files (the lake is the truth);
        a change bumps the generation a fold checks, in the same transaction."""
        lake = VoidIndex.of(read_voids(self.lake))
        known = {_text(m): set(_text(p).split("\n"))
                 for m, p in self.client.hgetall(VOIDS).items()}
        want = {m: set(p) for m, p in lake.by_match.items()}
        if want != known:
            pipe = self.client.pipeline(transaction=True)
            stale = sorted(set(known) - set(want))
            if stale:
                pipe.hdel(VOIDS, *stale)
            changed = {m: "\n".join(sorted(p)) for m, p in want.items() if known.get(m) != p}
            if changed:
                pipe.hset(VOIDS, mapping=changed)  # type: ignore[arg-type]
            pipe.incr(BANS_GENERATION)
            pipe.execute()
        return lake

    def void(self, match_id: str, player_id: str | None, at: datetime,
             reason: str = "") -> list[str]:
        """Void a match (or one player's result in it): a tombstone in the lake, then the
        players whose rows it names are recomputed without them in every live board-window
        those rows count in. Returns those players (none yet for a match not landed: its
        events will not count when they land)."""
        return self.void_applied(match_id, player_id, at, reason).players

    def void_applied(self, match_id: str, player_id: str | None, at: datetime,
                     reason: str = "") -> VoidApplied:
        """`void`, and what it could not remove (results on dates retention deleted raw
        events of: `VoidLimit`), for the operator's answer."""
        void = Void(match_id, player_id, reason, at)
        voids = [v for v in read_voids(self.lake) if v.match_id == match_id]
        covering = [v for v in voids if v.player_id in (None, player_id)]
        if not covering:
            write_void(self.lake, match_id, player_id, at, reason)
        self.sync_voids()
        version = self.current()
        rows = self._void_rows(void)
        # The voids of the match in effect on this version: its batch had them (before its
        # watermark) or they were applied to its state (as `apply_voids` tells). One not in
        # effect (its application failed part-way) changes standings when applied now.
        applied = self._applied(version)
        effective = [v for v in voids if self._in_effect(version, v, applied)]
        # The covering void that stands: one in effect if any (nothing changes then).
        earlier = next((v for v in covering if v in effective),
                       covering[0] if covering else None)
        if earlier is None:
            # A player whose result here a void of their own in effect took changes nothing.
            covered = {v.player_id for v in effective}
            players = [p for p in self._apply_void(version, void, rows) if p not in covered]
        else:
            players = [] if earlier in effective else self._apply_void(version, earlier)
        limit = self._void_limit(version, void, rows)
        if limit is not None and rows is not None:
            # A player all of whose named rows stay (`limit.kept`: absorbed, on a date at or
            # before the line or one no layer recomputes) lost nothing.
            stays = set(limit.kept)
            mark = version.watermark
            lost = {p for p, d, at in zip(rows.column("player_id").to_pylist(),
                                          _event_dates(rows).to_pylist(),
                                          rows.column("ingested_at").to_pylist(), strict=True)
                    if mark is None or at >= mark or (p, d) not in stays}
            players = [p for p in players if p in lost]
        return VoidApplied(players, limit, earlier, landed=rows is not None)

    def _void_rows(self, void: Void) -> pa.Table | None:
        """Every landed row `void` names (None: none in the lake)."""
        filters: list[Any] = [("match_id", "=", void.match_id)]
        if void.player_id is not None:
            filters.append(("player_id", "=", void.player_id))
        parts = read_listed(lambda: landed_files(self.lake), lambda files: [
            t for t in (pq.read_table(f.path, filters=filters) for f in files) if t.num_rows])
        return pa.concat_tables(parts, promote_options="default") if parts else None

    def _void_limit(self, version: SpeedVersion, void: Void,
                    rows: pa.Table | None) -> VoidLimit | None:
        """After retention: the results of `void` the live base counted on event dates at
        or before the safe line, or on later dates whose raw events no longer give back
        the base's totals (`_redoable`: neither layer recomputes those dates), or the note
        that no raw row of it is left; None when the void applies in full."""
        line = kept_after(self.lake, self.registry)
        if line is None:
            return None
        if rows is None:
            return VoidLimit(void, line, (), unseen=True,
                             deleted_through=deleted_through(self.lake))
        # A whole match with a result on or before the line, absorbed or live: others of it
        # may have had their raw rows in deleted partitions, unseen here. (Read from every
        # row seen, not only the results that stay: a match spanning midnight whose result
        # after it came late, past the watermark, is removed in full as far as the lake
        # shows, and the answer said nothing of the half retention deleted.)
        # A direct board's scores under one match id may span days: one seen only after the
        # line may have had results in deleted partitions too.
        spans = (void.player_id is None and "board" in rows.column_names
                 and rows.column("board").null_count < rows.num_rows)
        partial = void.player_id is None and any(
            d <= line for d in _event_dates(rows).to_pylist())
        spans = spans and not partial
        partial = partial or spans
        if version.watermark is not None:
            rows = rows.filter(pc.less(rows.column("ingested_at"), pa.scalar(
                version.watermark, rows.schema.field("ingested_at").type)))
        named = set(zip(rows.column("player_id").to_pylist(), _event_dates(rows).to_pylist(),
                        strict=True))
        later = {d for _, d in named if d > line}
        refused = (later - self._redoable(version, later)
                   if later and version.version is not None else set())
        kept = sorted((p, d) for p, d in named if d <= line or d in refused)
        return VoidLimit(void, line, tuple(kept), unseen=False, refused=tuple(sorted(refused)),
                         partial=partial, deleted_through=deleted_through(self.lake),
                         spans=spans) if kept or partial else None

    def _apply_void(self, version: SpeedVersion, void: Void,
                    rows: pa.Table | None = None) -> list[str]:
        """Recompute the players whose rows `void` names (`rows`, read here unless given),
        in the board-windows where those rows count; then record the void as applied to
        the version."""
        rows = self._void_rows(void) if rows is None else rows
        banned = {_text(b) for b in self.client.smembers(BANNED)}
        players: list[str] = []
        if rows is not None:
            for player in sorted(set(rows.column("player_id").to_pylist()) - banned):
                mine = rows.filter(pc.equal(rows.column("player_id"), player))
                windows = {(u.board.name, u.window.id)
                           for u in plan_updates(mine, self.registry, None)}
                if windows:
                    self._recompute(version, player, sorted(windows))
                    players.append(player)
        self.client.sadd(voids_key(version.tag),
                         _applied_key(void))
        return players

    def apply_voids(self, version: SpeedVersion) -> int:
        """Apply to one version's state the voids its batch had not seen (at or after its
        watermark) and the state does not hold yet; returns how many. The fold leaves
        voided rows out by itself: this corrects what was counted before the void."""
        applied = self._applied(version)
        count = 0
        for void in read_voids(self.lake):
            if not self._in_effect(version, void, applied):
                self._apply_void(version, void)
                count += 1
        return count

    def _applied(self, version: SpeedVersion) -> set[str]:
        """The voids applied to a version's state (`_applied_key` of each)."""
        return {_text(v) for v in self.client.smembers(voids_key(version.tag))}

    @staticmethod
    def _in_effect(version: SpeedVersion, void: Void, applied: set[str]) -> bool:
        """Whether `void` holds on the version: its batch had it (before its watermark) or
        its state applied it (`applied`: `_applied`)."""
        return ((version.watermark is not None and void.at < version.watermark)
                or _applied_key(void) in applied)

    def _void_race(self, version: SpeedVersion, players: set[str],
                   windows: list[tuple[str, str]]) -> None:
        """A fold applied rows a void named while it ran: recompute those players where
        that fold wrote (idempotent)."""
        banned = {_text(b) for b in self.client.smembers(BANNED)}
        for player in sorted(players - banned):
            self._recompute(version, player, windows)

    # -- erasure ----------------------------------------------------------------------------

    def erase(self, player: str, keep: str, *,
              settle: Callable[[], None] = lambda: None) -> int:
        """After the lake forgot a player and the speed state of version `keep` was built
        from it: delete every other version's keys (they held the player; readers follow
        the pointer to `keep`), every key whose name holds the id (rate counters), and the
        id from the global sets and hashes (bans, voids, profiles: synced from the lake).
        `settle` runs first when other versions' keys are about to go: it returns once no
        reader is on those versions any more. Returns the keys deleted. The door's records
        are fingerprints of ids, not ids."""
        doomed = {key for key in self.client.scan_iter(match="lb:*", count=1000)
                  if f":{keep}:" not in _text(key) and _is_version_key(_text(key))}
        if doomed:
            settle()
        # The keys named after a player: the rate counters (never a substring search: an
        # id like `a` or `2026` is inside every board-window key's name).
        doomed |= set(self.client.scan_iter(
            match=f"{_glob_escape(rate_key(player, 0)[:-1])}*", count=1000))
        doomed = {k for k in doomed if _text(k) != CURRENT}
        keys = sorted(doomed)
        for start in range(0, len(keys), 500):
            for key in keys[start:start + 500]:
                self.client.delete(key)  # one slot each (a Redis Cluster refuses a mix)
        self.client.hdel(PROFILES_KEY, player)
        self.sync_bans()
        self.sync_voids()
        return len(keys)

    def rewrite_persistence(self, *, poll: float = 0.05, limit: float = 300.0) -> list[str]:
        """Rewrite Redis's files so no byte of erased data remains in them: BGREWRITEAOF
        (the AOF's base and increments are replaced) and, when snapshots are configured,
        BGSAVE; waits for both. On a Redis Cluster every node rewrites its own files (the
        commands name no key, so no one node stands for the others). Returns what was
        rewritten ("aof", "rdb")."""
        from redis.cluster import RedisCluster

        cluster: Any = self.client  # `connect` types either client as redis.Redis
        clients = ([cluster.get_redis_connection(node)
                    for node in cluster.get_nodes()]  # type: ignore[no-untyped-call]
                   if isinstance(cluster, RedisCluster) else [self.client])
        done: set[str] = set()
        for client in clients:
            done.update(self._rewrite_files(client, poll, limit))
        return [kind for kind in ("aof", "rdb") if kind in done]

    @classmethod
    def _rewrite_files(cls, client: redis.Redis, poll: float, limit: float) -> list[str]:
        done = []
        info = client.info("persistence")
        if int(info.get("aof_enabled", 0)):
            cls._wait_for(client, lambda i: not int(i.get("aof_rewrite_in_progress", 0))
                          and not int(i.get("aof_rewrite_scheduled", 0)), poll, limit)
            client.bgrewriteaof()
            cls._wait_for(client, lambda i: not int(i.get("aof_rewrite_in_progress", 0))
                          and not int(i.get("aof_rewrite_scheduled", 0)), poll, limit)
            cls._written(client, "aof_last_bgrewrite_status", "Redis's append-only file")
            done.append("aof")
        try:
            save = client.config_get("save").get("save", "")
        except redis.ResponseError:
            save = ""  # CONFIG refused (a managed Redis): snapshots are the host's
        if save:
            cls._wait_for(client, lambda i: not int(i.get("rdb_bgsave_in_progress", 0)),
                          poll, limit)
            client.bgsave()
            cls._wait_for(client, lambda i: not int(i.get("rdb_bgsave_in_progress", 0)),
                          poll, limit)
            cls._written(client, "rdb_last_bgsave_status", "Redis's snapshot")
            done.append("rdb")
        return done

    @staticmethod
    def _written(client: redis.Redis, field: str, what: str) -> None:
        """Raise OSError (naming `what`) when Redis's background write just waited for
        failed (a full disk on Redis's side): the old file stays, with the erased bytes."""
        status = client.info("persistence").get(field, "ok")
        if status != "ok":
            raise OSError(errno.EIO, f"Redis reports {field}: {status}; its log says why",
                          what)

    @staticmethod
    def _wait_for(client: redis.Redis, ready: Any, poll: float, limit: float) -> None:
        import time

        deadline = time.monotonic() + limit
        while not ready(client.info("persistence")):
            if time.monotonic() > deadline:
                raise redis.TimeoutError("Redis did not finish rewriting its files in "
                                         f"{limit:.0f} s; check its log")
            time.sleep(poll)

    # -- status -----------------------------------------------------------------------------

    def status(self) -> SpeedStatus:
        try:
            version = self.current()
            state = f"ok (epoch {version.epoch})"
        except StateLost as exc:
            version = self.version_of(read_current(self.lake))
            state = f"lost: {exc}"
        if self.client.get(_REBUILDING) is not None:
            state += "; a rebuild is running"
        newest: dict[str, int] = {}
        for landed in landed_files(self.lake):
            newest[landed.writer] = max(newest.get(landed.writer, -1), landed.seq)
        progress = self.folder.progress(version)
        pending = self.folder.pending(version)
        # A hole: a pending file with a later file of its writer folded (a fold that failed).
        holes = [f for f in pending
                 if max(progress.after.get(f.writer, {}), default=-1) > f.seq]
        keys, memory = self._state_memory(version)
        door_bytes, _ids = self.door.memory()
        return SpeedStatus(
            state=state, version=version.version,
            watermark=None if version.watermark is None else version.watermark.isoformat(),
            board_windows=int(self.client.scard(windows_key(version.tag))),
            lag_files=len(pending), holes=len(holes), newest_landed=newest,
            folded=dict(sorted(progress.floors.items())), keys=keys,
            memory_bytes=memory + door_bytes, banned=int(self.client.scard(BANNED)),
            open_day_cut_ahead=_cut_ahead(self.lake),
        )

    def _state_memory(self, version: SpeedVersion) -> tuple[int, int]:
        """(keys, bytes) of a version's board-window keys: MEMORY USAGE pipelined a thousand
        keys a round trip over the first _STATUS_MEMORY_SAMPLE keys, extrapolated past them
        by their mean (the console polls this every few seconds)."""
        keys, measured, memory = 0, 0, 0
        batch: list[Any] = []

        def measure() -> None:
            nonlocal measured, memory
            pipe = self.client.pipeline(transaction=False)
            for key in batch:
                pipe.memory_usage(key, samples=0)
            memory += sum(int(r or 0) for r in pipe.execute())
            measured += len(batch)
            batch.clear()

        for key in self.client.scan_iter(match=f"lb:{{*}}:{version.tag}:*", count=1000):
            keys += 1
            if measured + len(batch) < _STATUS_MEMORY_SAMPLE:
                batch.append(key)
                if len(batch) == 1000:
                    measure()
        if batch:
            measure()
        return keys, memory if measured >= keys else round(memory / measured * keys)
