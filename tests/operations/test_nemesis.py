"""The nemesis of the operations tests (tests/faults.py) does what its doc says, on a real
server: which commands ran when the nth one fails."""

from __future__ import annotations

from typing import Any

import pytest
from faults import FaultyRedis, InjectedFault

pytestmark = pytest.mark.redis


@pytest.fixture
def faulty(redis_client: Any, redis_server: Any) -> Any:
    client = FaultyRedis.wrapping(redis_server.url)
    yield client
    client.close()


def test_a_plain_command_fails_before_or_after_it_ran(faulty, redis_client):
    faulty.fail_at(2)
    faulty.set("a", 1)
    with pytest.raises(InjectedFault):
        faulty.set("b", 1)
    assert redis_client.get("b") is None
    faulty.fail_at(1, "after")
    with pytest.raises(InjectedFault):
        faulty.set("c", 1)
    assert redis_client.get("c") == b"1"  # ran; only the reply was lost
    faulty.set("d", 1)  # disarmed after firing
    assert faulty.nemesis.fired == 2


@pytest.mark.parametrize(("when", "ran"), [("before", ["k0", "k1"]),
                                           ("after", ["k0", "k1", "k2"])])
def test_a_pipeline_runs_the_commands_before_the_fault(faulty, redis_client, when, ran):
    faulty.fail_at(3, when)
    pipe = faulty.pipeline(transaction=False)
    for i in range(5):
        pipe.set(f"k{i}", i)
    with pytest.raises(InjectedFault):
        pipe.execute()
    assert sorted(k.decode() for k in redis_client.keys("k*")) == ran


@pytest.mark.parametrize(("when", "ran"), [("before", 0), ("after", 5)])
def test_a_transaction_runs_all_or_nothing(faulty, redis_client, when, ran):
    faulty.fail_at(2, when)
    pipe = faulty.pipeline(transaction=True)
    for i in range(5):
        pipe.set(f"t{i}", i)
    with pytest.raises(InjectedFault):
        pipe.execute()
    assert len(redis_client.keys("t*")) == ran
