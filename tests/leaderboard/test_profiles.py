"""Profiles in the core: what a profile may hold, and the lake's append-only profile log
(latest write wins, history kept, compaction that changes no read)."""

from __future__ import annotations

import unicodedata
from datetime import UTC, datetime, timedelta

import pyarrow.parquet as pq
import pytest
from hypothesis import given
from strategies import display_names

from leaderboard.countries import COUNTRIES
from leaderboard.profiles import (
    Profile,
    ProfileError,
    compact_log,
    history_of,
    latest_profiles,
    parse_profile,
    profiles_dir,
    read_log,
    write_profile,
    write_profiles,
)

AT = datetime(2026, 12, 1, 12, tzinfo=UTC)


def test_a_valid_profile_is_normalised_nfc():
    decomposed = "Jose\u0301"  # e + combining acute: 5 code points, 4 characters in NFC
    profile = parse_profile("p1", {"display_name": decomposed, "country": "KR",
                                   "avatar_url": "https://cdn.example/a.png"})
    assert profile == Profile("p1", "Jos\u00e9", "KR", "https://cdn.example/a.png")
    assert parse_profile("p1", {"display_name": "대한민국"}).country is None


@pytest.mark.parametrize(("fields", "code", "says"), [
    ({}, "invalid_display_name", "display_name is required"),
    ({"display_name": ""}, "invalid_display_name", "0 characters"),
    ({"display_name": "x" * 33}, "invalid_display_name", "33 characters"),
    ({"display_name": "a\u202eb"}, "invalid_display_name", "U+202E (Cf)"),
    ({"display_name": "a\nb"}, "invalid_display_name", "U+000A (Cc)"),
    ({"display_name": "\ud800"}, "invalid_display_name", "U+D800 (Cs)"),
    ({"display_name": " ann"}, "invalid_display_name", "trimmed"),
    ({"display_name": 7}, "invalid_display_name", "must be a string"),
    ({"display_name": "ann", "country": "kr"}, "invalid_country", "upper case: `KR`"),
    ({"display_name": "ann", "country": "XX"}, "invalid_country", "not an ISO 3166-1"),
    ({"display_name": "ann", "country": "KOR"}, "invalid_country", "alpha-2"),
    ({"display_name": "ann", "avatar_url": "http://cdn.example/a.png"}, "invalid_avatar_url",
     "http and other schemes are refused"),
    ({"display_name": "ann", "avatar_url": "https://"}, "invalid_avatar_url", "with a host"),
    ({"display_name": "ann", "avatar_url": "https://[::1"}, "invalid_avatar_url", "with a host"),
    ({"display_name": "ann", "avatar_url": "https://a.example/\u00e9"}, "invalid_avatar_url",
     "percent-encode"),
    ({"display_name": "ann", "nick": "x"}, "invalid_profile", "unknown field `nick`"),
])
def test_bad_fields_name_the_rule(fields, code, says):
    with pytest.raises(ProfileError) as raised:
        parse_profile("p1", fields)
    assert raised.value.code == code
    assert says in str(raised.value)
    assert "'" not in str(raised.value)  # values named as text, never a Python repr


@given(display_names())
def test_a_name_is_accepted_iff_1_to_32_printable_characters_after_nfc(raw):
    name = unicodedata.normalize("NFC", raw)
    valid = (1 <= len(name) <= 32 and name.isprintable() and name.strip() == name)
    try:
        stored = parse_profile("p", {"display_name": raw}).display_name
    except ProfileError:
        assert not valid
    else:
        assert valid
        assert stored == name


def test_the_country_list_is_the_real_one():
    assert len(COUNTRIES) == 249
    assert COUNTRIES["KR"] == "South Korea"
    assert {"BR", "DE", "US", "GB", "SS", "XK"} - set(COUNTRIES) == {"XK"}  # XK: not ISO


def test_latest_write_wins_and_the_history_is_kept(lake):
    write_profile(lake, Profile("p1", "Ann"), AT, "eu-1")
    write_profile(lake, Profile("p2", "Bob", "BR"), AT, "eu-1")
    # The same instant (a frozen clock): the later write still wins.
    write_profile(lake, Profile("p1", "Annie", "KR"), AT, "na-1")
    latest = latest_profiles(lake)
    assert {p: (v.display_name, v.country) for p, v in latest.items()} == {
        "p1": ("Annie", "KR"), "p2": ("Bob", "BR")}
    assert [p.display_name for p in history_of(lake, "p1")] == ["Ann", "Annie"]
    # A write stamped earlier (a replayed --now) loses to the later stamp.
    write_profile(lake, Profile("p1", "Old"), AT - timedelta(days=1), "cli")
    assert latest_profiles(lake)["p1"].display_name == "Annie"
    assert [p.display_name for p in history_of(lake, "p1")] == ["Old", "Ann", "Annie"]


def test_the_later_of_one_import_wins_whatever_the_clock_reads(lake, monkeypatch):
    """An import naming a player twice: the later row wins, also when the wall clock reads
    the same ns for both and the random tie-breakers fall the other way. Before, each row
    read the clock on its own and the tie-breaker decided."""
    import leaderboard.profiles as profiles

    monkeypatch.setattr(profiles.time, "time_ns", lambda: 1_700_000_000_000_000_000)
    draws = iter([0xFFFFFFFF, 0])
    monkeypatch.setattr(profiles.secrets, "randbits", lambda _bits: next(draws))
    write_profiles(lake, [Profile("p", "first"), Profile("p", "second")], AT, "cli")
    assert latest_profiles(lake)["p"].display_name == "second"


def test_compaction_keeps_every_write_and_reads_the_same(lake):
    for i in range(5):
        write_profile(lake, Profile(f"p{i % 2}", f"name {i}"), AT + timedelta(seconds=i), "s")
    before = read_log(lake)
    assert compact_log(lake) == 5
    files = sorted(profiles_dir(lake).glob("*.parquet"))
    assert len(files) == 1
    assert read_log(lake).equals(before)
    assert compact_log(lake) == 0  # one file: nothing to do
    write_profile(lake, Profile("p0", "newest"), AT + timedelta(minutes=1), "s")
    assert latest_profiles(lake)["p0"].display_name == "newest"


def test_a_compaction_killed_before_deleting_reads_the_same(lake):
    """Its file and the originals side by side: each write still counts once."""
    for i in range(3):
        write_profile(lake, Profile("p", f"n{i}"), AT + timedelta(seconds=i), "s")
    originals = {f: pq.read_table(f) for f in profiles_dir(lake).glob("*.parquet")}
    before = read_log(lake)
    compact_log(lake)
    for path, table in originals.items():
        pq.write_table(table, path)  # as if the deletions never happened
    assert read_log(lake).equals(before)
    assert [p.display_name for p in history_of(lake, "p")] == ["n0", "n1", "n2"]


def test_a_read_racing_a_compaction_reads_the_whole_log(lake, monkeypatch):
    """A compaction finishing between a reader's listing of the log and its read of a
    listed file (deleted by then): the reader lists again and gets every write. Before, it
    raised FileNotFoundError (a 500 on GET profile, a failed reload)."""
    import leaderboard.profiles as profiles

    for i in range(3):
        write_profile(lake, Profile("p", f"n{i}"), AT + timedelta(seconds=i), "s")
    before = read_log(lake)
    real = pq.read_table
    raced = []

    def read_after_a_compaction(path, **kwargs):
        if not raced:
            raced.append(path)
            assert compact_log(lake) == 3  # the listed files are gone now
        return real(path, **kwargs)

    monkeypatch.setattr(profiles.pq, "read_table", read_after_a_compaction)
    assert read_log(lake).equals(before)
    assert raced
