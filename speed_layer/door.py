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
The claimed records are also kept in an in-flight key per (group, writer)
(`lb:ids:{group}:inflight:<writer>`: the writer's next seq and the generation, then the
records) until the landing is settled; a failed landing releases them, and a writer killed
in between has them recovered on its next claim (released unless the writer's files since
that seq hold them). A writer holds one claim at a time (a landing writer is one process).

Buckets are the fields of `groups` hashes per generation (`lb:ids:{group}:generation`, the
bucket's 4-byte number as the field; field `n` counts the ids), so a batch costs at most one
script call per group, with two keys and one argument, and a call stays in one Redis Cluster
slot. The ids travel as one string of 12-byte records (bucket, fingerprint).
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

from speed_layer.fold import ScriptPipeline, _sha

__all__ = ["DEFAULT_BUCKETS", "DEFAULT_GROUPS", "Claim", "ClaimPending", "Door", "InFlight",
           "fingerprints"]

DEFAULT_BUCKETS = 16384
DEFAULT_GROUPS = 64
_WIDTH = 8  # bytes of a fingerprint
_RECORD = 12  # bytes of an id on the wire: 4-byte bucket number (big-endian), fingerprint

#: Finds fingerprint f in record s at a multiple of 8 bytes (a match across two neighbours
#: is no match).
_HAS = """
local function has(s, f)
  local at = 1
  while true do
    at = string.find(s, f, at, true)
    if not at then return false end
    if at % 8 == 1 then return true end
    at = at + 1
  end
end
"""

#: KEYS: the group's current and previous generation. ARGV[1]: 12-byte records (bucket,
#: fingerprint). Returns one character per record: '1' if seen, else '0'.
_CHECK = _HAS + """
local ids, found, cur, prev = ARGV[1], {}, {}, {}
for i = 1, #ids, 12 do
  local b, f = string.sub(ids, i, i + 3), string.sub(ids, i + 4, i + 11)
  if not cur[b] then
    cur[b] = redis.call('HGET', KEYS[1], b) or ''
    prev[b] = redis.call('HGET', KEYS[2], b) or ''
  end
  if has(cur[b], f) or has(prev[b], f) then found[#found + 1] = '1'
  else found[#found + 1] = '0' end
end
return table.concat(found)
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
  if not r.seen[f] and not has(r.old, f) then
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


#: KEYS: the group's current and previous generation, the writer's in-flight key. ARGV: ttl,
#: 12-byte records, the in-flight header. Checks and records each id at once; returns one
#: character per record ('1' seen before, or earlier in this call; '0' claimed now), or the
#: error `INFLIGHT` while the writer's previous claim is not settled (recover it first).
_CLAIM = _HAS + """
if redis.call('EXISTS', KEYS[3]) == 1 then return redis.error_reply('INFLIGHT') end
local ttl, ids, found, records, order, claimed = ARGV[1], ARGV[2], {}, {}, {}, {}
for i = 1, #ids, 12 do
  local b, f = string.sub(ids, i, i + 3), string.sub(ids, i + 4, i + 11)
  local r = records[b]
  if not r then
    r = {old = redis.call('HGET', KEYS[1], b) or '', prev = redis.call('HGET', KEYS[2], b) or '',
         new = {}, seen = {}}
    records[b] = r
    order[#order + 1] = b
  end
  if r.seen[f] or has(r.old, f) or has(r.prev, f) then
    found[#found + 1] = '1'
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
  redis.call('SET', KEYS[3], ARGV[3] .. table.concat(claimed), 'EX', ttl)
end
return table.concat(found)
"""

#: KEYS: a generation. ARGV: 12-byte records. Removes each fingerprint from its bucket (the
#: claims of a landing that failed); returns the number removed.
_RELEASE = """
local ids, removed = ARGV[1], 0
for i = 1, #ids, 12 do
  local b, f = string.sub(ids, i, i + 3), string.sub(ids, i + 4, i + 11)
  local s = redis.call('HGET', KEYS[1], b)
  local at = 1
  while s do
    at = string.find(s, f, at, true)
    if not at then break end
    if at % 8 == 1 then
      s = string.sub(s, 1, at - 1) .. string.sub(s, at + 8)
      if #s > 0 then redis.call('HSET', KEYS[1], b, s) else redis.call('HDEL', KEYS[1], b) end
      removed = removed + 1
      break
    end
    at = at + 1
  end
end
if removed > 0 then redis.call('HINCRBY', KEYS[1], 'n', -removed) end
return removed
"""


class ClaimPending(RuntimeError):
    """A writer's previous claim is still in flight (its process died between claiming and
    settling): `Door.recover` settles it from the lake."""


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


@dataclass(frozen=True)
class Claim:
    """The ids one landing claimed: settle it once the rows landed; if landing failed,
    `SpeedLayer.recover_claims` releases the ids whose rows are not in the lake."""

    door: Door
    writer: str
    generation: int
    groups: tuple[tuple[int, bytes], ...]  # (group, 12-byte records claimed there)

    def settle(self) -> None:
        """The rows landed: the claims stand (only the in-flight record goes)."""
        if self.groups:
            self.client.delete(*[self.door.inflight_key(g, self.writer) for g, _ in self.groups])

    @property
    def client(self) -> redis.Redis:
        return self.door.client


@dataclass(frozen=True)
class InFlight:
    """A claim left in flight by a writer that died: what `Door.recover` needs to know."""

    group: int
    next_seq: int
    generation: int
    records: bytes


class Door:
    """Check and remember ids; every call is one pipelined round trip."""

    def __init__(self, client: redis.Redis, horizon: timedelta,
                 buckets: int = DEFAULT_BUCKETS, groups: int = DEFAULT_GROUPS) -> None:
        if not 0 < buckets < 2**32:
            raise ValueError(f"buckets={buckets} must be between 1 and 2^32 - 1")
        self.client = client
        self.horizon = horizon
        self.buckets = buckets
        self.groups = groups
        self._check_sha = _sha(_CHECK)
        self._remember_sha = _sha(_REMEMBER)
        self._claim_sha = _sha(_CLAIM)
        self._release_sha = _sha(_RELEASE)

    def _generation(self, at: datetime) -> int:
        return int(at.timestamp() // self.horizon.total_seconds())

    @staticmethod
    def key(group: int, generation: int) -> str:
        return f"lb:ids:{{{group}}}:{generation}"

    def _groups(self, table: pa.Table) -> list[tuple[int, np.ndarray, bytes]]:
        """Per hash group: (group, rows of its ids, their 12-byte records back to back)."""
        digests = _digests(table.column("match_id"), table.column("player_id"))
        buckets = _buckets_of(digests, self.buckets)
        records = np.empty((len(digests), _RECORD), dtype=np.uint8)
        records[:, :4] = buckets.astype(">u4").view(np.uint8).reshape(-1, 4)
        records[:, 4:] = digests[:, 8:]
        group_of = buckets % self.groups
        order = np.argsort(group_of, kind="stable")
        bounds = np.flatnonzero(np.diff(group_of[order])) + 1
        return [(int(group_of[rows[0]]), rows, records[rows].tobytes())
                for rows in np.split(order, bounds)]

    def seen(self, table: pa.Table, at: datetime) -> np.ndarray:
        """Per row: True if its id was accepted within the horizon before `at`."""
        result = np.zeros(table.num_rows, dtype=bool)
        if table.num_rows == 0:
            return result
        generation = self._generation(at)
        groups = self._groups(table)
        pipe = ScriptPipeline(self.client)
        for group, _, records in groups:
            pipe.script(_CHECK, self._check_sha,
                        [self.key(group, generation), self.key(group, generation - 1)],
                        [records])
        for (_, rows, _), flags in zip(groups, pipe.execute(), strict=True):
            if isinstance(flags, str):  # a client with decode_responses=True
                flags = flags.encode()
            result[rows] = np.frombuffer(flags, dtype=np.uint8) == ord("1")
        return result

    def inflight_key(self, group: int, writer: str) -> str:
        return f"lb:ids:{{{group}}}:inflight:{writer}"

    def claim(self, table: pa.Table, at: datetime, writer: str,
              next_seq: int) -> tuple[np.ndarray, Claim]:
        """Per row True if its id was accepted within the horizon before (a retry), and the
        claim of the others, recorded in the same script so two writers never both claim
        one id. Raises ClaimPending while the writer's previous claim is in flight."""
        result = np.zeros(table.num_rows, dtype=bool)
        generation = self._generation(at)
        if table.num_rows == 0:
            return result, Claim(self, writer, generation, ())
        ttl = int(self.horizon.total_seconds() * 2) + 3600
        header = f"{next_seq} {generation}\n".encode()
        groups = self._groups(table)
        pipe = ScriptPipeline(self.client)
        for group, _, records in groups:
            pipe.script(_CLAIM, self._claim_sha,
                        [self.key(group, generation), self.key(group, generation - 1),
                         self.inflight_key(group, writer)], [ttl, records, header])
        try:
            replies = pipe.execute()
        except redis.ResponseError as exc:
            if "INFLIGHT" in str(exc):
                raise ClaimPending(f"writer {writer} has a claim in flight") from None
            raise
        claimed = []
        for (group, rows, records), flags in zip(groups, replies, strict=True):
            if isinstance(flags, str):  # a client with decode_responses=True
                flags = flags.encode()
            seen = np.frombuffer(flags, dtype=np.uint8) == ord("1")
            result[rows] = seen
            if not seen.all():
                mine = np.frombuffer(records, dtype=np.uint8).reshape(-1, _RECORD)[~seen]
                claimed.append((group, mine.tobytes()))
        return result, Claim(self, writer, generation, tuple(claimed))

    def in_flight(self, writer: str) -> list[InFlight]:
        """The writer's claims left in flight (one pipelined round trip)."""
        pipe = self.client.pipeline(transaction=False)
        for group in range(self.groups):
            pipe.get(self.inflight_key(group, writer))
        found = []
        for group, raw in enumerate(pipe.execute()):
            if raw:
                head, _, records = bytes(raw).partition(b"\n")
                seq, generation = head.split()
                found.append(InFlight(group, int(seq), int(generation), records))
        return found

    def records_of(self, table: pa.Table) -> set[bytes]:
        """The 12-byte records of a table's ids."""
        found: set[bytes] = set()
        for _, _, records in self._groups(table) if table.num_rows else []:
            found.update(records[i:i + _RECORD] for i in range(0, len(records), _RECORD))
        return found

    def recover(self, writer: str, landed: set[bytes], flights: list[InFlight]) -> int:
        """Settle a dead writer's claims: those whose rows landed (`landed`: the records of
        its files since the claim's seq) stand, the rest are released. Returns how many."""
        released = 0
        for flight in flights:
            lost = b"".join(flight.records[i:i + _RECORD]
                            for i in range(0, len(flight.records), _RECORD)
                            if flight.records[i:i + _RECORD] not in landed)
            if lost:
                released += self.release(flight.generation, [lost])
            self.client.delete(self.inflight_key(flight.group, writer))
        return released

    def release(self, generation: int, records: list[bytes]) -> int:
        """Forget claimed ids (their rows never landed); returns how many were removed."""
        by_group: dict[int, list[bytes]] = {}
        for chunk in records:
            for i in range(0, len(chunk), _RECORD):
                record = chunk[i:i + _RECORD]
                bucket = int.from_bytes(record[:4], "big")
                by_group.setdefault(bucket % self.groups, []).append(record)
        pipe = ScriptPipeline(self.client)
        for group, found in sorted(by_group.items()):
            pipe.script(_RELEASE, self._release_sha, [self.key(group, generation)],
                        [b"".join(found)])
        return sum(int(r) for r in pipe.execute())

    def remember(self, table: pa.Table, at: datetime) -> None:
        """Record the ids of landed rows (idempotent: safe to repeat after a crash)."""
        if table.num_rows == 0:
            return
        generation = self._generation(at)
        ttl = int(self.horizon.total_seconds() * 2) + 3600
        pipe = ScriptPipeline(self.client)
        for group, _, records in self._groups(table):
            pipe.script(_REMEMBER, self._remember_sha, [self.key(group, generation)],
                        [ttl, records])
        pipe.execute()

    def memory(self) -> tuple[int, int]:
        """(bytes used by the record's keys, ids remembered), by scanning its keys."""
        used = ids = 0
        keys = list(self.client.scan_iter(match="lb:ids:*", count=1000))
        for start in range(0, len(keys), 1000):
            pipe = self.client.pipeline(transaction=False)
            for key in keys[start:start + 1000]:
                pipe.memory_usage(key, samples=0)
                pipe.hget(key, "n")
            replies = pipe.execute()
            used += sum(int(r or 0) for r in replies[0::2])
            ids += sum(int(r or 0) for r in replies[1::2])
        return used, ids
