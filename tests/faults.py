"""Fault injection for operations tests: a Redis client that fails at its Nth command.

The nemesis of the stateful model (tests/operations/test_stateful_model.py): arm it with
`fail_at(n)` and the nth Redis command sent from then on fails with a ConnectionError, the way
a blip of the network or a restarting server shows itself to the product. Commands count one
by one, whether sent alone or inside a pipeline, so a fault can land in the middle of a fold's
pipelined script calls:

- `when="before"`: the nth command is not executed (the connection broke on the way out); in
  a plain pipeline the commands before it were executed, the rest not; a transaction
  (MULTI/EXEC) is not executed at all.
- `when="after"`: the nth command was executed but its reply was lost (the connection broke on
  the way back); in a pipeline everything up to and including it was executed.

Only fault injection is mocked: every command that runs, runs on a real server.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.client import Pipeline

__all__ = ["FaultyRedis", "InjectedFault"]


class InjectedFault(redis.ConnectionError):
    """The fault this module injected (a ConnectionError, as a real blip raises)."""


class _Nemesis:
    def __init__(self) -> None:
        self.countdown: int | None = None
        self.when = "before"
        self.fired = 0
        self.sent = 0

    def arm(self, n: int, when: str) -> None:
        if n < 1 or when not in ("before", "after"):
            raise ValueError(f"fail_at needs n >= 1 and when before|after, not {n}, {when}")
        self.countdown, self.when = n, when

    def disarm(self) -> None:
        self.countdown = None

    def take(self, commands: int) -> int | None:
        """Count `commands` about to be sent; the 0-based index of the one that fails."""
        self.sent += commands
        if self.countdown is None:
            return None
        if self.countdown > commands:
            self.countdown -= commands
            return None
        index, self.countdown = self.countdown - 1, None
        self.fired += 1
        return index


class _FaultyPipeline(Pipeline):
    nemesis: _Nemesis

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        stack = list(self.command_stack)
        index = self.nemesis.take(len(stack))
        if index is None:
            return super().execute(raise_on_error)
        # `transaction` is an instance attribute here (it shadows Redis.transaction()).
        transactional = bool(self.__dict__.get("transaction")) or self.explicit_transaction
        if transactional:
            keep = len(stack) if self.nemesis.when == "after" else 0
        else:
            keep = index + (1 if self.nemesis.when == "after" else 0)
        self.command_stack = stack[:keep]
        try:
            if keep:
                super().execute(raise_on_error=False)
        finally:
            self.reset()
        raise InjectedFault(f"injected fault at command {index + 1} of a pipeline of "
                            f"{len(stack)} ({self.nemesis.when})")


class FaultyRedis(redis.Redis):
    """A real `redis.Redis` whose nth command from `fail_at(n)` on fails (see module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.nemesis = _Nemesis()

    @classmethod
    def wrapping(cls, url: str) -> FaultyRedis:
        client = cls.from_url(url, protocol=2)
        assert isinstance(client, FaultyRedis)
        return client

    def fail_at(self, n: int, when: str = "before") -> None:
        self.nemesis.arm(n, when)

    def disarm(self) -> None:
        self.nemesis.disarm()

    @property
    def commands_sent(self) -> int:
        return self.nemesis.sent

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if self.nemesis.take(1) is None:
            return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        if self.nemesis.when == "after":
            super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        raise InjectedFault(f"injected fault at {args[0]} ({self.nemesis.when})")

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Pipeline:
        pipe = _FaultyPipeline(self.connection_pool, self.response_callbacks, transaction,
                               shard_hint)
        pipe.nemesis = self.nemesis
        return pipe
