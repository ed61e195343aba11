"""Idempotency at the door: a compact record, in Redis, of the ids accepted recently.

An id (match_id, player_id) is hashed to a bucket and an 8-byte fingerprint. Each bucket
keeps, per generation of length `horizon`, its fingerprints back to back in one string: 8
bytes an id, with no size past which the encoding gets fatter (a hash of fingerprints costs
~13-14 bytes an id as a listpack, ~60 once it passes hash-max-listpack-entries). The
current and the previous generation are checked, so an id is remembered for at least one
horizon and at most two. A false positive needs two ids with the same 72-bit bucket and
fingerprint: about 1 in 10^16 per lookup at a billion remembered ids. A lookup scans its
bucket's string: keep about 100 ids a bucket per generation (`buckets` ~ ids per horizon /
100; the default 16384 suits ~1.6 million ids a day).

The door is atomic per identity: `claim` checks and records the ids in one script per group
(a retry reaching two writers at once is new to exactly one of them), before the rows land.
An id the record holds is in one of two states:

- settled: its rows landed (or were found in the lake): a copy is a retry, dropped;
- in flight: claimed by a writer that is landing it right now (it holds its landing lock,
  `LandingWriter.landing`, from the claim to the settle). The claimed records are kept in an
  in-flight key per (group, writer) (`lb:ids:{group}:inflight:<writer>`: the writer's next
  seq, the generation and the landing lock's identity, then the 12-byte records); the
  group's hash `lb:ids:{group}:holders` maps each record in flight to its writer (a claim
  finds the holder of an id in O(1)), and the group's set `lb:ids:{group}:inflight` names
  the writers holding one. A copy that reaches another writer meanwhile is neither landed
  nor dropped: it is answered "in flight" (retry later), because the first landing may
  still fail. `settle` ends the state (the rows landed), a failed landing releases the
  records (`recover`: those whose rows are not in the lake); a claim whose writer is not
  landing any more (killed, or its settle lost to a Redis error) is recovered by the
  writer's own next claim, by any writer whose claim hits its records once that landing
  lock is free, or by a repair (`SpeedLayer.claim`, `SpeedLayer.repair`).

A claim checks the group's epoch markers (`lb:ids:{group}:epochs`) in its script: a record
that lost its past (Redis lost its data after the caller checked the state) claims nothing.

Memory: a settled id costs its 8-byte fingerprint. An id in flight costs that, its 12-byte
record in the writer's in-flight key and a field of the holders hash, for the duration of
one landing; the writer set costs one member per (group, writer) with a claim in flight.
A writer holds one claim at a time (a landing writer is one process). In-flight keys never
expire (docs/architecture.md: an expiry would decide without looking at the lake).

Buckets are the fields of `groups` hashes per generation (`lb:ids:{group}:generation`, the
bucket's 4-byte number as the field; field `n` counts the ids), so a batch costs at most one
script call per group, and every key of a call shares the group's hash tag (one Redis
Cluster slot). The ids travel as one string of 12-byte records (bucket, fingerprint).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import redis

from leaderboard.schema import identity_match_ids
from speed_layer.fold import ScriptPipeline, _sha

__all__ = ["DEFAULT_BUCKETS", "DEFAULT_GROUPS", "Admission", "Claim", "ClaimPending", "Door",
           "InFlight", "RecordLost", "fingerprints"]

DEFAULT_BUCKETS = 16384
DEFAULT_GROUPS = 64
_RECORD = 12  # bytes of an id on the wire: 4-byte bucket number (big-endian), fingerprint

#: Finds string f in s at a multiple of w bytes (a match across two neighbours is no match).
_HAS = """
local function has(s, f, w)
  local at = 1
  while true do
    at = string.find(s, f, at, true)
    if not at then return false end
    if at % w == 1 then return true end
    at = at + 1
  end
end
"""

#: KEYS: the group's current generation. ARGV: ttl, 12-byte records (bucket, fingerprint).
#: Appends the fingerprints not there yet (idempotent), counts them in field `n` and
#: refreshes the ttl. Returns the number of ids added.
_REMEMBER = _HAS + """
local ttl, ids, records, order, added = ARGV[1], ARGV[2], {}, {}, 0
for i = 1, #ids, 12 do
  local b, f = string.sub(ids, i, i + 3), string.sub(ids, i + 4, i + 11)
  local r = records[b]
  if not r then
    r = {old = redis.call('HGET', KEYS[1], b) or '', new = {}, seen = {}}
    records[b] = r
    order[#order + 1] = b
  end
  if not r.seen[f] and not has(r.old, f, 8) then
    r.new[#r.new + 1] = f
    added = added + 1
  end
  r.seen[f] = true
end
for _, b in ipairs(order) do
  local r = records[b]
  if #r.new > 0 then redis.call('HSET', KEYS[1], b, r.old .. table.concat(r.new)) end
end
if added > 0 then redis.call('HINCRBY', KEYS[1], 'n', added) end
redis.call('EXPIRE', KEYS[1], ttl)
return added
"""


#: KEYS: the group's current and previous generation, the writer's in-flight key, the
#: group's set of writers with a claim in flight, the group's holders hash (12-byte record ->
#: the writer holding it in flight), the group's epoch markers. ARGV: ttl, 12-byte records,
#: the in-flight header, the writer, the in-flight key prefix, the epoch of the state the
#: caller read (same hash tag: one slot). Checks and records each id at once. Returns
#: {flags, writers...}: one character per record ('1' settled, or earlier in this call: a
#: retry; '2' in flight at another writer; '0' claimed now) and the writers holding the
#: '2's; or the error `LOST` when that epoch is not marked (Redis lost its data, or was
#: rebuilt, since the caller read the state: nothing is claimed on a record that lost its
#: past), or `INFLIGHT` while the writer's previous claim is not settled (recover it first).
_CLAIM = _HAS + """
if redis.call('SISMEMBER', KEYS[6], ARGV[6]) == 0 then return redis.error_reply('LOST') end
if redis.call('EXISTS', KEYS[3]) == 1 then return redis.error_reply('INFLIGHT') end
local ttl, ids, writer, prefix = ARGV[1], ARGV[2], ARGV[4], ARGV[5]
local found, records, order, claimed, busy, holders = {}, {}, {}, {}, {}, {}
local function holder(record)
  local w = redis.call('HGET', KEYS[5], record)
  if w and redis.call('EXISTS', prefix .. w) == 1 then return w end
  if w then redis.call('HDEL', KEYS[5], record) end  -- a claim ended without its entry
  return nil
end
for i = 1, #ids, 12 do
  local b, f = string.sub(ids, i, i + 3), string.sub(ids, i + 4, i + 11)
  local r = records[b]
  if not r then
    r = {old = redis.call('HGET', KEYS[1], b) or '', prev = redis.call('HGET', KEYS[2], b) or '',
         new = {}, seen = {}}
    records[b] = r
    order[#order + 1] = b
  end
  if r.seen[f] then
    found[#found + 1] = '1'
  elseif has(r.old, f, 8) or has(r.prev, f, 8) then
    local w = holder(b .. f)
    if w then
      found[#found + 1] = '2'
      if not busy[w] then busy[w] = true; holders[#holders + 1] = w end
    else
      found[#found + 1] = '1'
    end
  else
    r.new[#r.new + 1] = f
    r.seen[f] = true
    claimed[#claimed + 1] = b .. f
    found[#found + 1] = '0'
  end
end
for _, b in ipairs(order) do
  local r = records[b]
  if #r.new > 0 then redis.call('HSET', KEYS[1], b, r.old .. table.concat(r.new)) end
end
if #claimed > 0 then
  redis.call('HINCRBY', KEYS[1], 'n', #claimed)
  redis.call('EXPIRE', KEYS[1], ttl)
  redis.call('SET', KEYS[3], ARGV[3] .. table.concat(claimed))
  redis.call('SADD', KEYS[4], writer)
  for i = 1, #claimed, 1000 do
    local args = {}
    for j = i, math.min(i + 999, #claimed) do
      args[#args + 1] = claimed[j]
      args[#args + 1] = writer
    end
    redis.call('HSET', KEYS[5], unpack(args))
  end
end
local reply = {table.concat(found)}
for _, w in ipairs(holders) do reply[#reply + 1] = w end
return reply
"""

#: KEYS: the claim's generation, the writer's in-flight key, the group's in-flight writer
#: set, the group's holders hash. ARGV: the writer, 12-byte records to release (their rows
#: did not land; empty: the landing succeeded), the claim's header ('' for whatever claim
#: the key holds). Removes those fingerprints from their buckets and ends the claim's
#: in-flight state in one step (so no copy ever reads a released id as settled); returns
#: the number released. Only the claim named by the header, and only its own records:
#: an end that comes twice (two recoveries) touches nothing the second time.
_SETTLE = """
local s = redis.call('GET', KEYS[2])
if not s then return 0 end
local nl = string.find(s, '\\n', 1, true) or #s
if ARGV[3] ~= '' and string.sub(s, 1, nl) ~= ARGV[3] then return 0 end
local writer, ids, removed, own = ARGV[1], ARGV[2], 0, {}
for i = nl + 1, #s, 12 do own[string.sub(s, i, i + 11)] = true end
for i = 1, #ids, 12 do
  local b, f = string.sub(ids, i, i + 3), string.sub(ids, i + 4, i + 11)
  local bucket = own[b .. f] and redis.call('HGET', KEYS[1], b)
  local at = 1
  while bucket do
    at = string.find(bucket, f, at, true)
    if not at then break end
    if at % 8 == 1 then
      bucket = string.sub(bucket, 1, at - 1) .. string.sub(bucket, at + 8)
      if #bucket > 0 then redis.call('HSET', KEYS[1], b, bucket)
      else redis.call('HDEL', KEYS[1], b) end
      removed = removed + 1
      break
    end
    at = at + 1
  end
end
if removed > 0 then redis.call('HINCRBY', KEYS[1], 'n', -removed) end
for record in pairs(own) do
  if redis.call('HGET', KEYS[4], record) == writer then redis.call('HDEL', KEYS[4], record) end
end
redis.call('DEL', KEYS[2])
redis.call('SREM', KEYS[3], writer)
return removed
"""

class ClaimPending(RuntimeError):
    """A writer's previous claim is still in flight (its process died between claiming and
    settling): `Door.recover` settles it from the lake."""


class RecordLost(RuntimeError):
    """The group's epoch marker is not the epoch the caller read: Redis lost its data (or
    the state was rebuilt) between the caller's check and its claim."""


def _digests(match_ids: Sequence[str] | pa.Array | pa.ChunkedArray,
             player_ids: Sequence[str] | pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A 16-byte blake2b digest of each identity `match_id NUL player_id`, as (n, 16) uint8."""
    if len(match_ids) != len(player_ids):
        raise ValueError(f"{len(match_ids)} match ids but {len(player_ids)} player ids")
    if len(match_ids) == 0:
        return np.empty((0, 16), dtype=np.uint8)

    def binary(values: Sequence[str] | pa.Array | pa.ChunkedArray) -> pa.Array:
        if not isinstance(values, pa.Array | pa.ChunkedArray):
            values = pa.array(values, pa.string())
        return pc.cast(values, pa.binary())

    identities = pc.binary_join_element_wise(binary(match_ids), binary(player_ids),
                                             b"\x00").to_pylist()
    blake2b = hashlib.blake2b
    digests = b"".join([blake2b(identity, digest_size=16).digest() for identity in identities])
    return np.frombuffer(digests, dtype=np.uint8).reshape(-1, 16)


def _buckets_of(digests: np.ndarray, buckets: int) -> np.ndarray:
    return (digests[:, :8].copy().view(">u8").ravel() % np.uint64(buckets)).astype(np.int64)


def fingerprints(match_ids: Sequence[str] | pa.Array | pa.ChunkedArray,
                 player_ids: Sequence[str] | pa.Array | pa.ChunkedArray,
                 buckets: int) -> tuple[np.ndarray, list[bytes]]:
    """(bucket per id, 8-byte fingerprint per id) from a 128-bit hash of the identity."""
    digests = _digests(match_ids, player_ids)
    return _buckets_of(digests, buckets), [row.tobytes() for row in digests[:, 8:]]


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


@dataclass(frozen=True)
class Claim:
    """The ids one landing claimed: settle it once the rows landed, release it if nothing
    landed; if landing failed part-way, `SpeedLayer.recover_claims` releases the ids whose
    rows are not in the lake."""

    door: Door
    writer: str
    generation: int
    groups: tuple[tuple[int, bytes], ...]  # (group, 12-byte records claimed there)
    header: bytes = b""  # the claim's in-flight header: ends only this claim

    def settle(self) -> None:
        """The rows landed: the claims stand, no longer in flight."""
        self.door.end(self.writer, [(g, self.generation, b"") for g, _ in self.groups],
                      self.header)

    def release(self) -> int:
        """Nothing of this claim landed: forget its ids. Returns how many."""
        return self.door.end(self.writer, [(g, self.generation, r) for g, r in self.groups],
                             self.header)


@dataclass(frozen=True)
class Admission:
    """What the door said of a batch, per row: `seen` (settled: a retry to drop), `busy`
    (in flight at another writer: answer "retry later"), else claimed by `claim`."""

    seen: np.ndarray
    busy: np.ndarray
    holders: frozenset[str]  # the writers holding the busy rows
    claim: Claim


@dataclass(frozen=True)
class InFlight:
    """A claim left in flight by a writer that died: what `Door.recover` needs to know."""

    group: int
    next_seq: int
    generation: int
    records: bytes
    #: The identity of the landing lock file the claim was made under (None: an older
    #: record): recovery trusts a free lock only on that same file.
    lock: str | None = None
    header: bytes = b""


class Door:
    """Claim, settle and remember ids; every call is one pipelined round trip."""

    def __init__(self, client: redis.Redis, horizon: timedelta,
                 buckets: int = DEFAULT_BUCKETS, groups: int = DEFAULT_GROUPS) -> None:
        if not 0 < buckets < 2**32:
            raise ValueError(f"buckets={buckets} must be between 1 and 2^32 - 1")
        self.client = client
        self.horizon = horizon
        self.buckets = buckets
        self.groups = groups
        self._remember_sha = _sha(_REMEMBER)
        self._claim_sha = _sha(_CLAIM)
        self._settle_sha = _sha(_SETTLE)

    def _generation(self, at: datetime) -> int:
        return int(at.timestamp() // self.horizon.total_seconds())

    @property
    def _ttl(self) -> int:
        return int(self.horizon.total_seconds() * 2) + 3600

    @staticmethod
    def key(group: int, generation: int) -> str:
        return f"lb:ids:{{{group}}}:{generation}"

    @staticmethod
    def inflight_key(group: int, writer: str) -> str:
        return f"lb:ids:{{{group}}}:inflight:{writer}"

    @staticmethod
    def inflight_writers_key(group: int) -> str:
        """The group's set of writers with a claim in flight there."""
        return f"lb:ids:{{{group}}}:inflight"

    @staticmethod
    def holders_key(group: int) -> str:
        """The group's hash of ids in flight: 12-byte record -> the writer holding it."""
        return f"lb:ids:{{{group}}}:holders"

    @staticmethod
    def epoch_key(group: int) -> str:
        """The group's epoch markers (a set): the epochs of the states this record belongs
        to (a set, so processes racing to first use never overwrite the winner's)."""
        return f"lb:ids:{{{group}}}:epochs"

    def mark_epoch(self, epoch: str, *, only: bool = False) -> None:
        """Mark every group's record as belonging to the state of `epoch` (`only`: and to
        no other, for a rebuild): a claim checks it in its own script."""
        pipe = self.client.pipeline(transaction=False)
        for group in range(self.groups):
            if only:
                pipe.delete(self.epoch_key(group))
            pipe.sadd(self.epoch_key(group), epoch)
        pipe.execute()

    def _groups(self, table: pa.Table) -> list[tuple[int, np.ndarray, bytes]]:
        """Per hash group: (group, rows of its ids, their 12-byte records back to back)."""
        digests = _digests(identity_match_ids(table), table.column("player_id"))
        buckets = _buckets_of(digests, self.buckets)
        records = np.empty((len(digests), _RECORD), dtype=np.uint8)
        records[:, :4] = buckets.astype(">u4").view(np.uint8).reshape(-1, 4)
        records[:, 4:] = digests[:, 8:]
        group_of = buckets % self.groups
        order = np.argsort(group_of, kind="stable")
        bounds = np.flatnonzero(np.diff(group_of[order])) + 1
        return [(int(group_of[rows[0]]), rows, records[rows].tobytes())
                for rows in np.split(order, bounds)]

    def claim(self, table: pa.Table, at: datetime, writer: str, next_seq: int, *,
              epoch: str, lock: str = "-") -> Admission:
        """Per row: settled before (a retry), in flight at another writer (busy), or claimed
        now, recorded in the same script so two writers never both claim one id. Raises
        ClaimPending while the writer's previous claim is in flight, RecordLost when a
        group's marker is not `epoch` (the state the caller read is gone). `lock`: the
        identity of the landing lock the writer holds (recorded in the header)."""
        seen = np.zeros(table.num_rows, dtype=bool)
        busy = np.zeros(table.num_rows, dtype=bool)
        generation = self._generation(at)
        if table.num_rows == 0:
            return Admission(seen, busy, frozenset(), Claim(self, writer, generation, ()))
        header = f"{next_seq} {generation} {lock}\n".encode()
        groups = self._groups(table)
        pipe = ScriptPipeline(self.client)
        for group, _, records in groups:
            pipe.script(_CLAIM, self._claim_sha,
                        [self.key(group, generation), self.key(group, generation - 1),
                         self.inflight_key(group, writer), self.inflight_writers_key(group),
                         self.holders_key(group), self.epoch_key(group)],
                        [self._ttl, records, header, writer, self.inflight_key(group, ""),
                         epoch])
        try:
            replies = pipe.execute()
        except redis.ResponseError as exc:
            if "LOST" in str(exc):
                raise RecordLost(f"the door's record is not the one of epoch {epoch}") from None
            if "INFLIGHT" in str(exc):
                raise ClaimPending(f"writer {writer} has a claim in flight") from None
            raise
        claimed: list[tuple[int, bytes]] = []
        holders: set[str] = set()
        for (group, rows, records), (flags, *held) in zip(groups, replies, strict=True):
            if isinstance(flags, str):  # a client with decode_responses=True
                flags = flags.encode()
            codes = np.frombuffer(flags, dtype=np.uint8)
            seen[rows] = codes == ord("1")
            busy[rows] = codes == ord("2")
            holders.update(_text(w) for w in held)
            mine = codes == ord("0")
            if mine.any():
                kept = np.frombuffer(records, dtype=np.uint8).reshape(-1, _RECORD)[mine]
                claimed.append((group, kept.tobytes()))
        return Admission(seen, busy, frozenset(holders),
                         Claim(self, writer, generation, tuple(claimed), header))

    def in_flight(self, writer: str) -> list[InFlight]:
        """The writer's claims left in flight (one pipelined round trip)."""
        pipe = self.client.pipeline(transaction=False)
        for group in range(self.groups):
            pipe.get(self.inflight_key(group, writer))
        found = []
        for group, raw in enumerate(pipe.execute()):
            if raw:
                head, _, records = bytes(raw).partition(b"\n")
                seq, generation, *lock = head.decode().split()
                found.append(InFlight(group, int(seq), int(generation), records,
                                      lock[0] if lock and lock[0] != "-" else None,
                                      head + b"\n"))
        return found

    def writers_in_flight(self) -> set[str]:
        """Every writer with a claim in flight in any group (one pipelined round trip)."""
        pipe = self.client.pipeline(transaction=False)
        for group in range(self.groups):
            pipe.smembers(self.inflight_writers_key(group))
        return {_text(w) for members in pipe.execute() for w in members}

    def records_of(self, table: pa.Table) -> set[bytes]:
        """The 12-byte records of a table's ids."""
        found: set[bytes] = set()
        for _, _, records in self._groups(table) if table.num_rows else []:
            found.update(records[i:i + _RECORD] for i in range(0, len(records), _RECORD))
        return found

    def recover(self, writer: str, landed: set[bytes], flights: list[InFlight]) -> int:
        """Settle a dead writer's claims: those whose rows landed (`landed`: the records of
        its files since the claim's seq) stand, the rest are released. Returns how many
        were released."""
        ends = []
        for flight in flights:
            lost = b"".join(flight.records[i:i + _RECORD]
                            for i in range(0, len(flight.records), _RECORD)
                            if flight.records[i:i + _RECORD] not in landed)
            ends.append((flight.group, flight.generation, lost))
        headers = {f.header for f in flights}
        return self.end(writer, ends, headers.pop() if len(headers) == 1 else b"")

    def end(self, writer: str, ends: list[tuple[int, int, bytes]], header: bytes = b"") -> int:
        """End claims of `writer` in flight: per (group, generation, records to release),
        release those records and settle the rest, one script per group. `header`: only
        the claim with that header (b"": whatever claim is there). Returns how many were
        released."""
        if not ends:
            return 0
        pipe = ScriptPipeline(self.client)
        for group, generation, lost in ends:
            pipe.script(_SETTLE, self._settle_sha,
                        [self.key(group, generation), self.inflight_key(group, writer),
                         self.inflight_writers_key(group), self.holders_key(group)],
                        [writer, lost, header])
        return sum(int(r) for r in pipe.execute())

    def remember(self, table: pa.Table, at: datetime) -> None:
        """Record the ids of landed rows as settled (idempotent: safe to repeat after a
        crash); repair and rebuild use it for files read back from the lake."""
        if table.num_rows == 0:
            return
        generation = self._generation(at)
        pipe = ScriptPipeline(self.client)
        for group, _, records in self._groups(table):
            pipe.script(_REMEMBER, self._remember_sha, [self.key(group, generation)],
                        [self._ttl, records])
        pipe.execute()

    def memory(self) -> tuple[int, int]:
        """(bytes used by the record's keys, ids remembered), by scanning its keys."""
        used = ids = 0
        keys = [_text(k) for k in self.client.scan_iter(match="lb:ids:*", count=1000)]
        for start in range(0, len(keys), 1000):
            chunk = keys[start:start + 1000]
            pipe = self.client.pipeline(transaction=False)
            for key in chunk:
                pipe.memory_usage(key, samples=0)
            # Only a generation's hash counts its ids (field `n`); the in-flight keys do not.
            generations = [k for k in chunk
                           if k.count(":") == 3 and k.rsplit(":", 1)[1].isdigit()]
            for key in generations:
                pipe.hget(key, "n")
            replies = pipe.execute()
            used += sum(int(r or 0) for r in replies[:len(chunk)])
            ids += sum(int(r or 0) for r in replies[len(chunk):])
        return used, ids
