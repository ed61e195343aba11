"""Benchmark the door: Redis time of a claim that meets an id in flight at another writer,
with N ids in flight there (issue 10: finding the holder used to scan every other writer's
in-flight records, 0.23 s of Redis time at 1M ids in flight; the holders hash makes it one
HGET).

Starts one local Redis itself (EmbeddedRedis, no persistence). Writer b claims N ids (one
claim, never settled); writer a then claims one of them 20 times (answered in flight at b);
INFO commandstats gives the Redis time per claim script. Usage:
`python bench/bench_door_holders.py [N ...]` (default 100000 1000000). Measured on the
2-core shared box (2026-12-03): 100k in flight 171 us, 1M 88 us a claim (noise: it does
not grow with N); 84 MB of Redis at 1M ids in flight.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import redis

from leaderboard.redis_server import EmbeddedRedis
from speed_layer.door import Door


def measure(n: int) -> None:
    server = EmbeddedRedis().start()
    try:
        client = redis.Redis.from_url(server.url, protocol=2)
        door = Door(client, timedelta(hours=6))
        door.mark_epoch("bench")
        at = datetime(2026, 12, 3, tzinfo=UTC)
        held = pa.table({"match_id": [f"m{i}" for i in range(n)], "player_id": ["p"] * n})
        door.claim(held, at, "b", 0, epoch="bench")
        one = pa.table({"match_id": ["m7"], "player_id": ["p"]})
        client.config_resetstat()
        for _ in range(20):
            assert door.claim(one, at, "a", 0, epoch="bench").busy.all()
        stats = client.info("commandstats")
        script = stats.get("cmdstat_evalsha") or stats["cmdstat_eval"]
        print(f"{n:>9} ids in flight at b: {script['usec_per_call']:.0f} us of Redis time "
              f"a claim of one of them; Redis memory {client.info('memory')['used_memory_human']}")
    finally:
        server.stop()


if __name__ == "__main__":
    for count in [int(a) for a in sys.argv[1:]] or [100_000, 1_000_000]:
        measure(count)
