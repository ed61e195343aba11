"""Per-server rate limits: a token bucket in Redis, shared by every worker and every app.

A server's bucket holds up to `burst` tokens and refills at `events_per_second` (the keys
file, `app.http.auth`); a request of n events takes n tokens or none. One Lua script reads,
refills, takes and writes the bucket, so two workers never both spend the last tokens, and
it reads Redis's own clock (TIME), so workers on machines whose clocks differ share one
timeline. The request is admitted or refused whole, before anything is claimed or landed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import redis

from app.http.auth import ApiKeys
from app.http.errors import ApiError

__all__ = ["BUCKET_SCRIPT", "Admission", "admit", "bucket_key", "check_rate"]

#: KEYS[1]: the server's bucket (a hash: tokens, ts). ARGV: rate (tokens per second), burst,
#: cost. Returns {1, tokens left} or {0, seconds until `cost` tokens are there}, as text
#: (Lua numbers would be truncated to integers in the reply).
BUCKET_SCRIPT = """
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens, ts = tonumber(state[1]), tonumber(state[2])
if tokens == nil or ts == nil then tokens, ts = burst, now end
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
local ttl = math.ceil(burst / rate) + 60
if tokens >= cost then
  tokens = tokens - cost
  redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens),
             'ts', string.format('%.17g', now))
  redis.call('EXPIRE', KEYS[1], ttl)
  return {1, string.format('%.17g', tokens)}
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens),
           'ts', string.format('%.17g', now))
redis.call('EXPIRE', KEYS[1], ttl)
return {0, string.format('%.17g', (cost - tokens) / rate)}
"""


def bucket_key(server_id: str) -> str:
    """One key per server (its own Redis Cluster slot: the script touches only it)."""
    return f"lb:ratelimit:server:{{{server_id}}}"


@dataclass(frozen=True)
class Admission:
    """Whether a request of `cost` events may go on, and when to retry if not."""

    allowed: bool
    tokens_left: float = 0.0
    retry_after: int = 0  # whole seconds, at least 1 when refused


def admit(client: redis.Redis, server_id: str, events_per_second: float, burst: int,
          cost: int) -> Admission:
    """Take `cost` tokens from the server's bucket, or none (one atomic script call)."""
    allowed, figure = client.eval(BUCKET_SCRIPT, 1, bucket_key(server_id),
                                  repr(events_per_second), burst, cost)
    value = float(figure.decode() if isinstance(figure, bytes) else figure)
    if int(allowed) == 1:
        return Admission(True, tokens_left=value)
    return Admission(False, retry_after=max(1, math.ceil(value)))


def check_rate(client: redis.Redis, keys: ApiKeys, server_id: str, events: int, *,
               what: str | None = None) -> None:
    """Admit a request of `events` events from the server, or refuse it whole: 429 with
    Retry-After when its bucket is short, 413 when the batch is larger than its burst (it
    could never pass). `what`: a write that is no batch of events (a profile), costing one
    token of the same bucket, named so in the refusal."""
    limit = keys.limit_of(server_id)
    if limit is None:
        return
    rate, burst = limit
    if events > burst:
        raise ApiError(413, "batch_exceeds_burst",
                       f"{events:,} events in one request, but server {server_id} may send "
                       f"at most {burst:,} at once (its `burst` in {keys.source}): split the "
                       "batch")
    found = admit(client, server_id, rate, burst, events)
    if not found.allowed:
        refused = (f"this request of {_events(events)} was refused whole and nothing of "
                   "it landed" if what is None else f"{what} counts as one and was refused: "
                                                    "nothing was saved")
        raise ApiError(429, "rate_limited",
                       f"server {server_id} may send {_events(rate)} a second (bursts of "
                       f"{burst:,}); {refused}: retry it after {found.retry_after} s",
                       headers={"Retry-After": str(found.retry_after)},
                       retry_after=found.retry_after)


def _events(count: float) -> str:
    """`1 event`, `2 events`, `0.5 events` (a person reads the refusal)."""
    return f"{count:,g} event" + ("" if count == 1 else "s")
