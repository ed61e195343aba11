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

Buckets are the fields of `groups` hashes per generation (`lb:ids:{group}:generation`, the
bucket's 4-byte number as the field; field `n` counts the ids), so a batch costs at most one
script call per group, with two keys and one argument, and a call stays in one Redis Cluster
slot. The ids travel as one string of 12-byte records (bucket, fingerprint).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import redis

from speed_layer.fold import ScriptPipeline, _sha

__all__ = ["DEFAULT_BUCKETS", "DEFAULT_GROUPS", "Door", "fingerprints"]

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
