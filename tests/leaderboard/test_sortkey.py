"""The sort-key codec: exact integer keys, higher ranks first, packed time for `earliest`."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import orders, sort_key_cases, tie_policies, time_bits

from leaderboard.sortkey import (
    MAX_EXACT,
    SortKeyOverflow,
    decode,
    encode,
    encode_array,
    max_abs_score,
)

EXACT = 2**53


@pytest.mark.parametrize(("score", "order", "ties", "t", "bits", "key"), [
    (10, "desc", "shared", 0, 0, 10),
    (10, "asc", "shared", 0, 0, -10),
    (-7, "desc", "shared", 0, 0, -7),
    (3, "desc", "earliest", 5, 4, 3 * 16 + (15 - 5)),    # s * 2^b + (2^b - 1 - t)
    (3, "asc", "earliest", 5, 4, -3 * 16 + (15 - 5)),
    (0, "desc", "earliest", 0, 17, 2**17 - 1),
    (0, "desc", "earliest", 2**17 - 1, 17, 0),
])
def test_known_keys(score, order, ties, t, bits, key):
    """The formula of docs/design.md section 3, on a few hand-computed values."""
    assert encode(score, order=order, ties=ties, t=t, time_bits=bits) == key
    assert decode(key, order=order, ties=ties, time_bits=bits) == (score, t)


@given(case=sort_key_cases())
def test_round_trip(case):
    key = encode(case["score"], order=case["order"], ties=case["ties"], t=case["t"],
                 time_bits=case["time_bits"])
    assert isinstance(key, int)
    assert decode(key, order=case["order"], ties=case["ties"],
                  time_bits=case["time_bits"]) == (case["score"], case["t"])


@given(case=sort_key_cases())
def test_keys_are_exact_doubles(case):
    key = encode(case["score"], order=case["order"], ties=case["ties"], t=case["t"],
                 time_bits=case["time_bits"])
    assert abs(key) < EXACT
    assert float(key) == key
    assert int(float(key)) == key, "a Redis double holds the key exactly"


def _pair(order: str, ties: str, bits: int) -> st.SearchStrategy[tuple[int, int, int, int]]:
    limit = max_abs_score(ties, bits)
    span = (1 << bits) if ties == "earliest" else 1
    return st.tuples(st.integers(-limit, limit), st.integers(0, span - 1),
                     st.integers(-limit, limit), st.integers(0, span - 1))


@given(data=st.data(), order=orders(), ties=tie_policies(), bits=time_bits())
def test_ordering(data, order, ties, bits):
    bits = bits if ties == "earliest" else 0
    s1, t1, s2, t2 = data.draw(_pair(order, ties, bits))
    k1 = encode(s1, order=order, ties=ties, t=t1, time_bits=bits)
    k2 = encode(s2, order=order, ties=ties, t=t2, time_bits=bits)
    if s1 != s2:
        better_first = s1 > s2 if order == "desc" else s1 < s2
        assert (k1 > k2) == better_first, "a better score wins whatever the time"
    elif ties == "earliest" and t1 != t2:
        assert (k1 > k2) == (t1 < t2), "equal scores: whoever reached it first ranks higher"
    else:
        assert k1 == k2


def test_shared_ties_ignore_time():
    assert encode(5, order="desc", ties="shared", t=99) == encode(5, order="desc", ties="shared")


def test_asc_reverses_score_order():
    keys = [encode(s, order="asc", ties="shared") for s in (1, 2, 3)]
    assert keys == sorted(keys, reverse=True)
    keys = [encode(s, order="asc", ties="earliest", t=0, time_bits=20) for s in (1, 2, 3)]
    assert keys == sorted(keys, reverse=True)


# -- limits --------------------------------------------------------------------------------


@pytest.mark.parametrize(("ties", "bits", "limit"), [
    ("shared", 0, 2**53 - 1),
    ("earliest", 17, 2**36 - 1),   # daily
    ("earliest", 20, 2**33 - 1),   # weekly
    ("earliest", 32, 2**21 - 1),   # all-time
    ("earliest", 52, 1),
])
def test_max_abs_score(ties, bits, limit):
    assert max_abs_score(ties, bits) == limit


@pytest.mark.parametrize("order", ["desc", "asc"])
@pytest.mark.parametrize(("ties", "bits"), [("shared", 0), ("earliest", 17), ("earliest", 32)])
def test_the_boundary_score_is_accepted_and_one_more_is_refused(order, ties, bits):
    limit = max_abs_score(ties, bits)
    last_t = (1 << bits) - 1 if ties == "earliest" else 0
    for score in (limit, -limit):
        for t in (0, last_t):
            key = encode(score, order=order, ties=ties, t=t, time_bits=bits)
            assert abs(key) <= MAX_EXACT
            assert decode(key, order=order, ties=ties, time_bits=bits) == (score, t)
    for score in (limit + 1, -limit - 1):
        with pytest.raises(SortKeyOverflow) as info:
            encode(score, order=order, ties=ties, t=0, time_bits=bits)
        message = str(info.value)
        assert f"score {score}" in message
        assert str(limit) in message
        assert f"ties={ties}" in message
        assert "lower the board's points bounds" in message, "says what to do"


def test_the_largest_earliest_key_is_2_pow_53_minus_1():
    bits = 32
    key = encode(max_abs_score("earliest", bits), order="desc", ties="earliest", t=0,
                 time_bits=bits)
    assert key == MAX_EXACT == 2**53 - 1


@pytest.mark.parametrize("t", [-1, 2**17])
def test_time_offsets_outside_the_window_are_refused(t):
    with pytest.raises(SortKeyOverflow, match=f"time offset {t}s"):
        encode(1, order="desc", ties="earliest", t=t, time_bits=17)


# -- arrays --------------------------------------------------------------------------------


@given(data=st.data(), order=orders(), ties=tie_policies(), bits=time_bits(),
       size=st.integers(0, 30))
def test_encode_array_agrees_with_encode(data, order, ties, bits, size):
    bits = bits if ties == "earliest" else 0
    limit = max_abs_score(ties, bits)
    scores = data.draw(st.lists(st.integers(-limit, limit), min_size=size, max_size=size))
    offsets = data.draw(st.lists(st.integers(0, (1 << bits) - 1), min_size=size,
                                 max_size=size)) if ties == "earliest" else [0] * size
    keys = encode_array(np.array(scores, dtype=np.int64), order=order, ties=ties,
                        t=np.array(offsets, dtype=np.int64), time_bits=bits)
    assert keys.dtype == np.int64
    assert keys.shape == (size,)
    expected = [encode(s, order=order, ties=ties, t=t, time_bits=bits)
                for s, t in zip(scores, offsets, strict=True)]
    assert keys.tolist() == expected


def test_encode_array_does_not_alias_its_input():
    scores = np.array([1, 2, 3], dtype=np.int64)
    keys = encode_array(scores, order="desc", ties="shared")
    keys[0] = 99
    assert scores.tolist() == [1, 2, 3]


@pytest.mark.parametrize("order", ["desc", "asc"])
def test_encode_array_names_the_worst_score(order):
    limit = max_abs_score("earliest", 32)
    with pytest.raises(SortKeyOverflow, match=f"score {-(limit + 5)} "):
        encode_array([1, limit + 1, -(limit + 5), 2], order=order, ties="earliest",
                     t=[0, 0, 0, 0], time_bits=32)


def test_encode_array_refuses_time_offsets_outside_the_window():
    with pytest.raises(SortKeyOverflow, match="17-bit"):
        encode_array([1, 2], order="desc", ties="earliest", t=[0, 2**17], time_bits=17)
    with pytest.raises(SortKeyOverflow):
        encode_array([1, 2], order="desc", ties="earliest", t=[-1, 0], time_bits=17)
