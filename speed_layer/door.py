"""Idempotency at the door: a compact record, in Redis, of the ids accepted recently.

An id (match_id, player_id) is hashed to a bucket and an 8-byte fingerprint. Each bucket
keeps one small hash per generation of length `horizon`, field = fingerprint, value empty
(Redis stores small hashes as listpacks: about 12 bytes an id); the current and the previous
generation are checked, so an id is remembered for at least one horizon and at most two.
A false positive needs two ids with the same 72-bit bucket and fingerprint: about 1 in 10^16
per lookup at a billion remembered ids.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa
import redis

__all__ = ["DEFAULT_BUCKETS", "Door", "fingerprints"]

DEFAULT_BUCKETS = 16384

_CHECK = """
local found = {}
for i = 1, #ARGV do
  local f = ARGV[i]
  if redis.call('HEXISTS', KEYS[1], f) == 1 or redis.call('HEXISTS', KEYS[2], f) == 1 then
    found[i] = 1 else found[i] = 0 end
end
return found
"""

_REMEMBER = """
local ttl = tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('HSETNX', KEYS[1], ARGV[i], '') end
redis.call('EXPIRE', KEYS[1], ttl)
return #ARGV - 1
"""


def fingerprints(match_ids: Sequence[str], player_ids: Sequence[str],
                 buckets: int) -> tuple[np.ndarray, list[bytes]]:
    """(bucket per id, 8-byte fingerprint per id) from a 128-bit hash of the identity."""
    found_buckets = np.empty(len(match_ids), dtype=np.int64)
    prints: list[bytes] = []
    for i, (match_id, player_id) in enumerate(zip(match_ids, player_ids, strict=True)):
        digest = hashlib.blake2b(f"{match_id}\x00{player_id}".encode(), digest_size=16).digest()
        found_buckets[i] = int.from_bytes(digest[:8], "big") % buckets
        prints.append(digest[8:])
    return found_buckets, prints


class Door:
    """Check and remember ids; every call is one pipelined round trip."""

    def __init__(self, client: redis.Redis, horizon: timedelta,
                 buckets: int = DEFAULT_BUCKETS) -> None:
        self.client = client
        self.horizon = horizon
        self.buckets = buckets
        self._check = client.register_script(_CHECK)
        self._remember = client.register_script(_REMEMBER)

    def _generation(self, at: datetime) -> int:
        return int(at.timestamp() // self.horizon.total_seconds())

    @staticmethod
    def key(bucket: int, generation: int) -> str:
        return f"lb:ids:{{{bucket}}}:{generation}"

    def _groups(self, table: pa.Table) -> dict[int, list[tuple[int, bytes]]]:
        buckets, prints = fingerprints(table.column("match_id").to_pylist(),
                                       table.column("player_id").to_pylist(), self.buckets)
        groups: dict[int, list[tuple[int, bytes]]] = {}
        for row, (bucket, fingerprint) in enumerate(zip(buckets.tolist(), prints, strict=True)):
            groups.setdefault(bucket, []).append((row, fingerprint))
        return groups

    def seen(self, table: pa.Table, at: datetime) -> np.ndarray:
        """Per row: True if its id was accepted within the horizon before `at`."""
        result = np.zeros(table.num_rows, dtype=bool)
        if table.num_rows == 0:
            return result
        generation = self._generation(at)
        groups = self._groups(table)
        pipe = self.client.pipeline(transaction=False)
        order = []
        for bucket, items in groups.items():
            self._check(keys=[self.key(bucket, generation), self.key(bucket, generation - 1)],
                        args=[f for _, f in items], client=pipe)
            order.append(items)
        for items, flags in zip(order, pipe.execute(), strict=True):
            for (row, _), flag in zip(items, flags, strict=True):
                result[row] = bool(flag)
        return result

    def remember(self, table: pa.Table, at: datetime) -> None:
        """Record the ids of landed rows (idempotent: safe to repeat after a crash)."""
        if table.num_rows == 0:
            return
        generation = self._generation(at)
        ttl = int(self.horizon.total_seconds() * 2) + 3600
        pipe = self.client.pipeline(transaction=False)
        for bucket, items in self._groups(table).items():
            self._remember(keys=[self.key(bucket, generation)],
                           args=[ttl, *[f for _, f in items]], client=pipe)
        pipe.execute()

    def memory(self) -> tuple[int, int]:
        """(bytes used by the record's keys, ids remembered), by scanning its keys."""
        used = ids = 0
        for key in self.client.scan_iter(match="lb:ids:*", count=1000):
            used += int(self.client.memory_usage(key, samples=0) or 0)
            ids += int(self.client.hlen(key))
        return used, ids
