"""The Lua the Redis scripts share, run on a real Redis started under en_US.UTF-8."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from leaderboard.lua import BYTES_AFTER

pytestmark = pytest.mark.redis

#: Texts as the scripts see them: ASCII of both cases and punctuation (match ids, marks),
#: UTF-8 (bytes past 0x7f), prefixes of each other, and the empty text.
_TEXTS = st.one_of(st.text(alphabet="aAbB-_07 ", max_size=6), st.text(max_size=6),
                   st.binary(max_size=6))


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=_TEXTS, b=_TEXTS)
@example(a="a-7", b="B-7")
@example(a="-0999999999999999999", b="00000000000000000001")
@example(a="ab", b="a")
def test_bytes_after_is_the_byte_order_whatever_the_servers_collation(non_c_redis, a, b):
    """`bytes_after(a, b)` is `a > b` on the UTF-8 bytes (DuckDB's, Arrow's and Python's
    order of text), on a server whose own string comparison follows en_US.UTF-8."""
    raw_a = a.encode() if isinstance(a, str) else a
    raw_b = b.encode() if isinstance(b, str) else b
    script = BYTES_AFTER + "return bytes_after(ARGV[1], ARGV[2]) and 1 or 0"
    assert non_c_redis.eval(script, 0, raw_a, raw_b) == int(raw_a > raw_b)
