"""The analysts' warehouse and the score-distribution chart, on a real published lake."""

from __future__ import annotations

import shutil
import subprocess
import sys
from datetime import date
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from lakes import day, land, random_stream

from jobs.batch import run_batch
from jobs.report import ReportError, score_distribution_png
from jobs.warehouse import refresh_warehouse
from leaderboard.manifest import read_current
from leaderboard.registry import load_registry
from leaderboard.settings import Settings


@pytest.fixture(scope="module")
def published_lake(tmp_path_factory):
    data = tmp_path_factory.mktemp("warehouse")
    registry = load_registry()
    land(data / "lake", registry, random_stream(11, start=day("2026-11-27"), days=4,
                                                matches=120, regions=("na", "eu")))
    settings = Settings.from_env({"LEADERBOARD_DATA": str(data)})
    for as_of in (date(2026, 11, 28), date(2026, 11, 29), date(2026, 11, 30)):
        run_batch(settings, as_of)
    refresh_warehouse(data, registry)
    return data


def test_views_answer_the_readme_queries(published_lake):
    con = duckdb.connect(str(published_lake / "warehouse.duckdb"), read_only=True)
    try:
        names = {r[0] for r in con.execute(
            "SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
        assert {"events", "rollups", "standings", "standings_current", "histograms"} <= names
        assert con.execute("SELECT count(*) FROM boards").fetchall()[0][0] == 9
        assert con.execute("SELECT board FROM boards WHERE source = 'direct'").fetchall() == [
            ("best-lap",)]
        assert con.execute("SELECT count(*) FROM events WHERE board IS NOT NULL").fetchall() \
            == [(0,)], "the events view has the board column (null for match events)"
        days = [r[0] for r in con.execute(
            "SELECT DISTINCT as_of FROM standings ORDER BY 1").fetchall()]
        assert days == [date(2026, 11, 28), date(2026, 11, 29), date(2026, 11, 30)]
        top = con.execute("""
            SELECT player_id, score, rank FROM standings
            WHERE as_of = DATE '2026-11-30' AND board = 'global' AND window_id = 'all-time'
            ORDER BY rank, player_id LIMIT 10""").fetchall()
        assert top
        assert top[0][2] == 1
        current = con.execute("""SELECT player_id, score, rank FROM standings_current
            WHERE board = 'global' AND window_id = 'all-time'
            ORDER BY rank, player_id LIMIT 10""").fetchall()
        assert current == top
        history = con.execute("""
            SELECT as_of, rank FROM standings
            WHERE board = 'global' AND window_id = 'all-time' AND player_id = ?
            ORDER BY as_of""", [top[0][0]]).fetchall()
        assert len(history) == 3
        movers = con.execute("""
            SELECT t.player_id, y.rank - t.rank AS moved FROM standings t
            JOIN standings y ON y.player_id = t.player_id AND y.board = t.board
             AND y.window_id = t.window_id AND y.as_of = t.as_of - 1
            WHERE t.as_of = DATE '2026-11-30' AND t.board = 'global'
              AND t.window_id = 'all-time'
            ORDER BY moved DESC LIMIT 5""").fetchall()
        assert movers
        depth = con.execute("""SELECT sum(players) FROM histograms WHERE kind = 'depth'
            AND as_of = DATE '2026-11-30' AND board = 'global'
            AND window_id = 'all-time'""").fetchall()[0][0]
        rows = con.execute("""SELECT count(*) FROM standings WHERE as_of = DATE '2026-11-30'
            AND board = 'global' AND window_id = 'all-time'""").fetchall()[0][0]
        assert depth == rows > 0
        events = con.execute("SELECT count(*) FROM events").fetchall()[0][0]
        matches = con.execute("SELECT sum(matches) FROM rollups").fetchall()[0][0]
        assert 0 < matches <= events
    finally:
        con.close()


def test_a_reader_holding_the_old_warehouse_is_not_blocked(published_lake):
    reader = duckdb.connect(str(published_lake / "warehouse.duckdb"), read_only=True)
    try:
        refresh_warehouse(published_lake, load_registry())
        assert reader.execute("SELECT count(*) FROM standings").fetchall()[0][0] > 0
    finally:
        reader.close()


def test_opens_read_only_from_another_process(published_lake):
    code = ("import duckdb, sys; c = duckdb.connect(sys.argv[1], read_only=True); "
            "print(c.execute('SELECT count(*) FROM standings_current').fetchall()[0][0])")
    done = subprocess.run([sys.executable, "-c", code, str(published_lake / "warehouse.duckdb")],
                          capture_output=True, text=True, timeout=120, check=True)
    assert int(done.stdout.strip()) > 0


def test_report_draws_a_png(published_lake, tmp_path):
    out = score_distribution_png(published_lake / "lake", load_registry().board("global"),
                                 "all-time", date(2026, 11, 30), tmp_path / "chart.png").path
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 5000


def test_report_explains_a_missing_version_or_window(published_lake, tmp_path):
    with pytest.raises(ReportError, match="no batch version as of 2020-01-01"):
        score_distribution_png(published_lake / "lake", load_registry().board("global"),
                               "all-time", date(2020, 1, 1), tmp_path / "x.png")
    with pytest.raises(ReportError, match="has no global daily:2020-01-01"):
        score_distribution_png(published_lake / "lake", load_registry().board("global"),
                               "daily:2020-01-01", date(2026, 11, 30), tmp_path / "x.png")
    assert not Path(tmp_path / "x.png").exists()


def test_versions_published_before_last_match_id_still_load(tmp_path):
    """Standings files of an older release lack last_match_id: alone they read as null, and
    next to newer files (an incremental run keeps unchanged windows' files) by name."""
    import pyarrow.parquet as pq

    from leaderboard.manifest import read_current

    registry = load_registry()
    land(tmp_path / "lake", registry, random_stream(12, start=day("2026-11-27"), days=3,
                                                    matches=60, regions=("na", "eu")))
    settings = Settings.from_env({"LEADERBOARD_DATA": str(tmp_path)})
    run_batch(settings, date(2026, 11, 28))
    lake = tmp_path / "lake"
    old = sorted(set(read_current(lake).standings(lake).column("path").to_pylist()))
    for path in old:
        pq.write_table(pq.read_table(lake / path).drop_columns(["last_match_id"]), lake / path)
    query = ("SELECT count(*), count(last_match_id) FROM standings_current "
             "WHERE board = 'global' AND window_id = ?")
    # the version of an older release: its files without the column
    refresh_warehouse(tmp_path, registry)
    con = duckdb.connect(str(tmp_path / "warehouse.duckdb"), read_only=True)
    try:
        rows, named = con.execute(query, ["all-time"]).fetchall()[0]
        assert rows > 0
        assert named == 0
    finally:
        con.close()
    run_batch(settings, date(2026, 11, 29))  # rebuilds some windows, keeps the rest
    index = read_current(lake).standings(lake).to_pylist()
    kept = {(e["board"], e["window_id"]) for e in index if e["path"] in old and e["rows"]}
    rebuilt = {(e["board"], e["window_id"]) for e in index if e["path"] not in old and e["rows"]}
    assert kept
    assert rebuilt
    refresh_warehouse(tmp_path, registry)
    con = duckdb.connect(str(tmp_path / "warehouse.duckdb"), read_only=True)
    try:
        counts = {(b, w): (rows, named) for b, w, rows, named in con.execute(
            "SELECT board, window_id, count(*), count(last_match_id) FROM standings_current "
            "GROUP BY ALL").fetchall()}
    finally:
        con.close()
    assert {k: counts[k][1] for k in kept} == dict.fromkeys(kept, 0)  # the older release's
    assert {k: counts[k][1] for k in rebuilt} == {k: counts[k][0] for k in rebuilt}


def test_players_view_has_each_latest_profile_and_sees_later_writes(tmp_path):
    from datetime import UTC, datetime, timedelta

    from leaderboard.profiles import Profile, compact_log, write_profile

    registry = load_registry()
    lake = tmp_path / "lake"
    at = datetime(2026, 12, 1, 12, tzinfo=UTC)
    refresh_warehouse(tmp_path, registry)  # no profile yet: empty views, not an error
    con = duckdb.connect(str(tmp_path / "warehouse.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM players").fetchall() == [(0,)]
    con.close()
    write_profile(lake, Profile("kr", "Korea Republic", "KR"), at, "cli")
    write_profile(lake, Profile("br", "Brazil", "BR", "https://cdn.example/br.png"), at, "cli")
    refresh_warehouse(tmp_path, registry)
    write_profile(lake, Profile("kr", "South Korea", "KR"), at + timedelta(hours=1), "cli")
    compact_log(lake)  # the files the refresh saw are gone: the views read by glob
    con = duckdb.connect(str(tmp_path / "warehouse.duckdb"), read_only=True)
    try:
        assert con.execute("SELECT player_id, display_name, country, country_name, avatar_url "
                           "FROM players ORDER BY player_id").fetchall() == [
            ("br", "Brazil", "BR", "Brazil", "https://cdn.example/br.png"),
            ("kr", "South Korea", "KR", "South Korea", None)]
        assert con.execute("SELECT display_name FROM profile_history WHERE player_id = 'kr' "
                           'ORDER BY "order"').fetchall() == [("Korea Republic",),
                                                              ("South Korea",)]
    finally:
        con.close()


def test_quarantine_view_has_every_row_with_its_place(tmp_path):
    """Analysts count held and rejected rows by reason and player; the view reads by glob,
    so a row quarantined after the refresh shows at once."""
    from datetime import UTC, datetime

    import pyarrow as pa

    from leaderboard.lake import LandingWriter
    from leaderboard.schema import INPUT_FIELDS

    registry = load_registry()
    refresh_warehouse(tmp_path, registry)  # nothing quarantined yet: an empty view
    con = duckdb.connect(str(tmp_path / "warehouse.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM quarantine").fetchall() == [(0,)]
    con.close()

    def rows(reasons: list[str]) -> pa.Table:
        text = {name: [f"v{i}" for i in range(len(reasons))] for name in INPUT_FIELDS}
        return pa.table({**text, "reason": reasons, "detail": ["why"] * len(reasons),
                         "source": ["test"] * len(reasons)})

    at = datetime(2026, 12, 1, 12, tzinfo=UTC)
    with LandingWriter(tmp_path / "lake", "w") as writer:
        writer.quarantine(rows(["implausible_rate", "too_late"]), at)
        refresh_warehouse(tmp_path, registry)
        writer.quarantine(rows(["implausible_rate"]), at)
    con = duckdb.connect(str(tmp_path / "warehouse.duckdb"), read_only=True)
    try:
        assert con.execute(
            "SELECT reason, match_id, ingest_date::VARCHAR, writer, seq, file_row FROM "
            "quarantine ORDER BY seq, file_row").fetchall() == [
            ("implausible_rate", "v0", "2026-12-01", "w", 0, 0),
            ("too_late", "v1", "2026-12-01", "w", 0, 1),
            ("implausible_rate", "v0", "2026-12-01", "w", 1, 0)]
    finally:
        con.close()


def test_the_quarantine_view_names_a_scores_board(tmp_path):
    """A quarantined direct score keeps its board (a release lands it there): the view
    shows it, null for match events' rows."""
    from datetime import UTC, datetime

    import pyarrow as pa

    from leaderboard.lake import LandingWriter
    from leaderboard.schema import INPUT_FIELDS

    def rows(board: str | None) -> pa.Table:
        table = pa.table({**{name: ["v"] for name in INPUT_FIELDS}, "reason": ["too_late"],
                          "detail": ["why"], "source": ["test"]})
        return table if board is None else table.append_column("board", pa.array([board]))

    with LandingWriter(tmp_path / "lake", "w") as writer:
        writer.quarantine(rows(None), datetime(2026, 12, 1, 12, tzinfo=UTC))
        refresh_warehouse(tmp_path, load_registry())
        con = duckdb.connect(str(tmp_path / "warehouse.duckdb"), read_only=True)
        assert con.execute("SELECT board FROM quarantine").fetchall() == [(None,)]
        con.close()
        writer.quarantine(rows("best-lap"), datetime(2026, 12, 1, 12, tzinfo=UTC))
    refresh_warehouse(tmp_path, load_registry())
    con = duckdb.connect(str(tmp_path / "warehouse.duckdb"), read_only=True)
    try:
        assert con.execute("SELECT board FROM quarantine ORDER BY seq").fetchall() == [
            (None,), ("best-lap",)]
    finally:
        con.close()


def _contents(warehouse: Path) -> dict[str, list[tuple[object, ...]]]:
    """Every table but the meta ones (bookkeeping: e.g. a version linked while it was its
    day's newest stays marked linked after a rerun, which a build from nothing does not
    know) and the standings/histogram views of a warehouse, rows in stored order or sorted."""
    con = duckdb.connect(str(warehouse), read_only=True)
    try:
        tables = [r[0] for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE NOT internal").fetchall()
            if not r[0].startswith("meta_")]
        found = {name: con.execute(f"SELECT * FROM {name}").fetchall() for name in tables}
        for view in ("standings", "histograms", "standings_current", "rollups",
                     "standings_files", "histograms_files"):
            found[view] = sorted(con.execute(f"SELECT * FROM {view}").fetchall(), key=str)
        return found
    finally:
        con.close()


_ROW_COLUMNS = {"standings": "player_id, score, sort_key, rank, percentile, matches, reached_at, "
                             "first_event_at, last_event_at, last_match_id",
                "histograms": "kind, bucket, lower, upper, players, rank_from, rank_to"}


def _explicit(lake: Path, versions: list, kind: str) -> list[tuple[object, ...]]:
    """The rows of `kind` (standings, histograms) the `versions` publish, as the warehouse
    read them before its link tree: one statement naming every file of those versions,
    joined with their index entries (built here from the manifests with pyarrow)."""
    import pyarrow as pa

    column = "path" if kind == "standings" else "histogram"
    entries: dict[str, list[object]] = {"as_of": [], "version": [], "board": [],
                                        "window_id": [], "path": []}
    for manifest in versions:
        for entry in manifest.standings(lake).to_pylist():
            entries["as_of"].append(manifest.as_of_date)
            entries["version"].append(manifest.version)
            entries["board"].append(entry["board"])
            entries["window_id"].append(entry["window_id"])
            entries["path"].append(str(lake.resolve() / entry[column]))
    paths = sorted(set(entries["path"]))
    if not paths:
        return []
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.register("entries", pa.table(entries))
        return sorted(con.execute(f"""
            SELECT f.as_of, f.version, f.board, f.window_id, {_ROW_COLUMNS[kind]}
            FROM read_parquet(?::VARCHAR[], filename = true, union_by_name = true,
                              hive_partitioning = false) s
            JOIN entries f ON f.path = s.filename AND f.window_id = s.window_id""",
                                  [paths]).fetchall(), key=str)
    finally:
        con.close()


def _shown(data: Path) -> dict[str, list[tuple[object, ...]]]:
    con = duckdb.connect(str(data / "warehouse.duckdb"), read_only=True)
    try:
        con.execute("SET TimeZone = 'UTC'")
        return {view: sorted(con.execute(
            f"SELECT as_of, version, board, window_id, {_ROW_COLUMNS[kind]} FROM {view}"
        ).fetchall(), key=str) for view, kind in (("standings", "standings"),
                                                  ("histograms", "histograms"),
                                                  ("standings_current", "standings"))}
    finally:
        con.close()


def _assert_shows_the_lake(data: Path) -> dict[str, list[tuple[object, ...]]]:
    """The warehouse's standings, histograms and standings_current equal the explicit
    statement over each day's newest version and over the published one."""
    from leaderboard.manifest import list_versions

    lake = data / "lake"
    newest = {m.as_of: m for m in list_versions(lake)}
    days = [newest[d] for d in sorted(newest)]
    shown = _shown(data)
    assert shown["standings"] == _explicit(lake, days, "standings")
    assert shown["histograms"] == _explicit(lake, days, "histograms")
    assert shown["standings_current"] == _explicit(lake, [read_current(lake)], "standings")
    assert all(shown.values())
    return shown


def test_a_refresh_reads_only_the_new_versions_and_builds_the_same_warehouse(
        tmp_path, monkeypatch):
    """Issue 13 (large mode): rebuilding the warehouse read every manifest and every day's
    version index, copied the indexes into it and opened every standings and histogram
    file's footer, every night (1.2 s CPU at 80 nights of 3,000 events, 2.8 s at 173). A
    refresh now reads only the manifests and footers the warehouse it replaces had not seen
    (the indexes are read by a view when queried); the result is the warehouse a refresh
    from nothing builds, a version set aside is dropped, and a warehouse built from another
    lake is not reused, nor what an erasure rewrote.

    Then the `standings` and `histograms` views named every file of the history in their
    SQL, parsed and bound at every refresh; they now read the warehouse's link tree by
    glob. Their rows (and standings_current's) are those of the old statement naming every
    file, through the nights, a set-aside version, a day's version replaced by a rerun (the
    live version not its day's newest then), retention, an erasure (the id gone from every
    view), a build from nothing, a data dir moved, a batch writing its files in place in
    the lake, and the link tree lost."""
    from jobs.release import set_aside
    from leaderboard.manifest import Manifest

    data = tmp_path / "data"
    registry = load_registry()
    land(data / "lake", registry, random_stream(5, start=day("2026-11-27"), days=4,
                                                matches=60))
    settings = Settings.from_env({"LEADERBOARD_DATA": str(data)})
    for as_of in (date(2026, 11, 27), date(2026, 11, 28)):
        run_batch(settings, as_of)
    refresh_warehouse(data, registry)
    run_batch(settings, date(2026, 11, 29))
    rejected = run_batch(settings, date(2026, 11, 29), publish=False).manifest
    set_aside(data / "lake", rejected.version)
    read = []
    from_json = Manifest.from_json

    def counted(text: str) -> Manifest:
        manifest = from_json(text)
        read.append(manifest.version)
        return manifest

    monkeypatch.setattr(Manifest, "from_json", counted)
    refresh_warehouse(data, registry)
    live = read_current(data / "lake")
    assert set(read) == {live.version}  # the night's manifest only
    incremental = _contents(data / "warehouse.duckdb")
    _assert_shows_the_lake(data)
    (data / "warehouse.duckdb").unlink()
    read.clear()
    refresh_warehouse(data, registry)
    assert len(set(read)) == 3  # from nothing: every day's version
    assert _contents(data / "warehouse.duckdb") == incremental
    assert rejected.version not in {row[1] for row in incremental["standings_files"]}

    # A day's newest version replaced (a rerun of the night): what only the old one named
    # goes, as from nothing.
    run_batch(settings, date(2026, 11, 29), publish=False)
    refresh_warehouse(data, registry)
    rerun = _contents(data / "warehouse.duckdb")
    assert rerun != incremental
    _assert_shows_the_lake(data)
    (data / "warehouse.duckdb").unlink()
    refresh_warehouse(data, registry)
    assert _contents(data / "warehouse.duckdb") == rerun

    # Retention deletes raw events (the events view follows), standings stay.
    from jobs.compact import SpeedWatermark
    from jobs.retention import apply_retention

    def events() -> int:
        con = duckdb.connect(str(data / "warehouse.duckdb"), read_only=True)
        try:
            return int(con.execute("SELECT count(*) FROM events").fetchall()[0][0])
        finally:
            con.close()

    landed = events()
    report = apply_retention(data / "lake", date(2026, 11, 29), 1,
                             speed=SpeedWatermark(present=False), registry=load_registry())
    assert report.deleted, report
    refresh_warehouse(data, registry)
    assert 0 < events() < landed
    assert _contents(data / "warehouse.duckdb") == rerun
    _assert_shows_the_lake(data)

    # An erasure rewrites versions in place (the same ids): a refresh sees the rewrite.
    from datetime import UTC, datetime

    from jobs.erase import erase_from_lake

    player = rerun["standings"][0][4]
    erase_from_lake(data / "lake", registry, player, at=datetime.now(UTC))
    refresh_warehouse(data, registry)
    erased = _contents(data / "warehouse.duckdb")
    assert player not in {row[4] for row in erased["standings"]}
    shown = _assert_shows_the_lake(data)
    con = duckdb.connect(str(data / "warehouse.duckdb"), read_only=True)
    try:
        for view in ("standings", "standings_current", "rollups", "events"):
            assert con.execute(f"SELECT count(*) FROM {view} WHERE player_id = ?",
                               [player]).fetchall() == [(0,)], view
    finally:
        con.close()
    (data / "warehouse.duckdb").unlink()
    refresh_warehouse(data, registry)
    assert _contents(data / "warehouse.duckdb") == erased
    # A batch writing its files in place (or killed meanwhile): the views never read them.
    running = next((data / "lake" / "standings").glob("as_of=*/board=global/window=*"))
    (running / "part-running.parquet").write_bytes(b"PAR1 half written")
    refresh_warehouse(data, registry)
    assert _assert_shows_the_lake(data) == shown
    shutil.rmtree(data / "warehouse.files")  # the link tree lost: rebuilt
    refresh_warehouse(data, registry)
    assert _assert_shows_the_lake(data) == shown

    # A data dir moved elsewhere: its warehouse names the old paths, so nothing is reused.
    moved = tmp_path / "moved"
    data.rename(moved)
    read.clear()
    refresh_warehouse(moved, registry)
    assert len(set(read)) == 4  # every manifest, the rerun's too
    assert all(str(moved) in row[4] for row in _contents(moved / "warehouse.duckdb")[
        "standings_files"])
    assert _assert_shows_the_lake(moved) == shown


def _version_rows(lake: Path, manifest) -> list[tuple[object, ...]]:
    """(as_of, version, board, window_id, player_id, score, rank, last_match_id) of every
    row `manifest` publishes, read from its index and files with pyarrow (not the warehouse)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    rows = []
    files: dict[str, object] = {}
    for entry in manifest.standings(lake).to_pylist():
        if entry["path"] not in files:
            files[entry["path"]] = pq.read_table(lake / entry["path"])
        table = files[entry["path"]]
        window = table.filter(pc.equal(table.column("window_id"), entry["window_id"]))
        rows.extend((manifest.as_of_date, manifest.version, entry["board"], entry["window_id"],
                     r["player_id"], r["score"], r["rank"], r["last_match_id"])
                    for r in window.to_pylist())
    return sorted(rows, key=str)


def _current_rows(data: Path) -> list[tuple[object, ...]]:
    con = duckdb.connect(str(data / "warehouse.duckdb"), read_only=True)
    try:
        return sorted(con.execute(
            "SELECT as_of, version, board, window_id, player_id, score, rank, last_match_id "
            "FROM standings_current").fetchall(), key=str)
    finally:
        con.close()


def test_standings_current_is_the_published_version_even_when_not_its_days_newest(tmp_path):
    """`standings_current` is the version `current.json` publishes (what serving answers
    from), also when a newer version of the same day exists: one built and not published
    (the DAG's check failed, or a rerun written with publish=False) or one rolled back from
    (the pointer moved to an older version of the day). It filtered the `standings` view,
    which holds each day's newest version only, so it was empty then. `standings` keeps
    the day's newest (the history answers for a day with the last version computed)."""
    from jobs.release import publish_version

    data = tmp_path / "data"
    lake = data / "lake"
    registry = load_registry()
    land(lake, registry, random_stream(21, start=day("2026-11-27"), days=2, matches=60))
    settings = Settings.from_env({"LEADERBOARD_DATA": str(data)})
    run_batch(settings, date(2026, 11, 27))
    published = run_batch(settings, date(2026, 11, 28)).manifest
    # Events of the same day that arrive after its night: a rerun of the night sees them.
    land(lake, registry, random_stream(22, start=day("2026-11-28"), days=1, matches=40,
                                       late_share=0), writer="late")
    newer = run_batch(settings, date(2026, 11, 28), publish=False).manifest
    assert read_current(lake).version == published.version
    expected = _version_rows(lake, published)
    assert expected
    assert expected != [(*r[:1], published.version, *r[2:]) for r in _version_rows(lake, newer)]

    refresh_warehouse(data, registry)
    assert _current_rows(data) == expected  # the newer version of the day built, unpublished
    con = duckdb.connect(str(data / "warehouse.duckdb"), read_only=True)
    try:
        assert con.execute("SELECT DISTINCT version FROM standings "
                           "WHERE as_of = DATE '2026-11-28'").fetchall() == [(newer.version,)]
    finally:
        con.close()

    publish_version(lake, newer.version)
    refresh_warehouse(data, registry)
    assert _current_rows(data) == _version_rows(lake, newer)
    publish_version(lake, published.version)  # rolled back to the day's older version
    refresh_warehouse(data, registry)
    assert _current_rows(data) == expected
    (data / "warehouse.duckdb").unlink()  # and so from nothing
    refresh_warehouse(data, registry)
    assert _current_rows(data) == expected


def _one_night(data: Path, seed: int, night: str) -> None:
    """Land a day of 20 matches on `night`, run its batch and refresh the warehouse."""
    registry = load_registry()
    land(data / "lake", registry, random_stream(seed, start=day(night), days=1, matches=20))
    run_batch(Settings.from_env({"LEADERBOARD_DATA": str(data)}), date.fromisoformat(night))
    refresh_warehouse(data, registry)


def test_a_lake_replaced_or_copied_leaves_the_link_tree_right(tmp_path):
    """`leaderboard demo --fresh` deletes the lake and keeps the warehouse file and its link
    tree: the links to the old lake's files dangle, and a query whose glob opens one fails
    (DuckDB skips the files a view's join rules out, so today's views got by; a plain scan
    would not). A version the previous build knew whose index is gone makes the refresh
    prune dead links (a version set aside keeps its files, and no pruning)."""
    data = tmp_path / "data"
    registry = load_registry()
    _one_night(data, 41, "2026-11-27")
    shutil.rmtree(data / "lake")
    _one_night(data, 42, "2026-11-28")
    shown = _assert_shows_the_lake(data)
    assert {row[0] for row in shown["standings"]} == {date(2026, 11, 28)}
    links = [p for p in (data / "warehouse.files").rglob("*") if p.is_symlink()]
    assert links
    assert all(p.exists() for p in links)  # no dead link (a query's glob would meet it)
    # A data dir copied with its links followed (shutil.copytree's default): the copy's
    # link tree holds files, which an erasure would not rewrite; its refresh (from
    # nothing: another lake path) makes them links again (it failed reading them as links).
    copy = tmp_path / "copy"
    shutil.copytree(data, copy)
    refresh_warehouse(copy, registry)
    assert _assert_shows_the_lake(copy) == shown
    held = [p for p in (copy / "warehouse.files").rglob("*") if not p.is_dir()]
    assert held
    assert all(p.is_symlink() for p in held)


def test_a_data_dir_restored_from_a_copy_with_links_followed_is_relinked(tmp_path):
    """Regression (review s8, finding 4): a backup taken with the links followed (`cp -rL`,
    `rsync -L`, shutil.copytree) and restored to the same path keeps its warehouse's lake
    path, so the refresh was incremental and kept the copies in the link tree: the views
    read them, and an erasure rewriting the lake files left the erased player in them and
    in the `standings` view. The refresh now finds files where links belong and rebuilds
    the tree; and an erasure relinks it whole (a copy the cheap look would miss)."""
    import os

    from app.erasure import erase_player

    data = tmp_path / "data"
    registry = load_registry()
    settings = Settings.from_env({"LEADERBOARD_DATA": str(data)})
    land(data / "lake", registry, random_stream(43, start=day("2026-11-27"), days=2,
                                                matches=30))
    run_batch(settings, date(2026, 11, 27))
    run_batch(settings, date(2026, 11, 28))
    refresh_warehouse(data, registry)
    backup = tmp_path / "backup"
    shutil.copytree(data, backup)  # links followed: the tree holds copies
    shutil.rmtree(data)
    shutil.copytree(backup, data)  # restored to the same path
    held = [p for p in (data / "warehouse.files").rglob("*.parquet")]
    assert held
    assert not any(p.is_symlink() for p in held)
    refresh_warehouse(data, registry)
    held = [p for p in (data / "warehouse.files").rglob("*") if not p.is_dir()]
    assert held
    assert [p for p in held if not p.is_symlink()] == []
    shown = _assert_shows_the_lake(data)

    # A copy the cheap look misses (not the first entry of its generation): the erasure's
    # refresh relinks every entry, so no byte of the player stays in the tree.
    player = shown["standings"][0][4]
    standings = data / "warehouse.files" / "data" / "all" / "standings"
    first = next(os.path.join(root, name) for root, _dirs, names in os.walk(standings)
                 for name in names if name.endswith(".parquet"))
    copied = [p for p in standings.rglob("*.parquet") if str(p) != first
              and player in pq.read_table(p, columns=["player_id"]).column(0).to_pylist()]
    assert copied
    for path in copied:
        payload = path.read_bytes()
        path.unlink()
        path.write_bytes(payload)
    refresh_warehouse(data, registry)  # incremental: the sampled entries are links
    assert not any(p.is_symlink() for p in copied)
    erase_player(settings, None, player, settle=0.0)
    assert all(p.is_symlink() for p in (data / "warehouse.files").rglob("*")
               if not p.is_dir())
    for path in standings.rglob("*.parquet"):
        assert player not in pq.read_table(path, columns=["player_id"]).column(
            0).to_pylist(), path
    con = duckdb.connect(str(data / "warehouse.duckdb"), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM standings WHERE player_id = ?",
                           [player]).fetchall() == [(0,)]
    finally:
        con.close()
    _assert_shows_the_lake(data)


_REFRESH_REPORTING_ITS_WAIT = """
import fcntl, sys, types
from pathlib import Path
import jobs.warehouse as warehouse
from leaderboard.registry import load_registry

def flock(handle, operation):
    try:
        fcntl.flock(handle, operation | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        print("waits", flush=True)
    fcntl.flock(handle, operation)

warehouse.fcntl = types.SimpleNamespace(flock=flock, LOCK_EX=fcntl.LOCK_EX)
warehouse.refresh_warehouse(Path(sys.argv[1]), load_registry())
print("finished", flush=True)
"""


def test_a_refresh_waits_for_another_so_its_prune_spares_the_others_temp_link(
        tmp_path, monkeypatch):
    """Regression (review s8, finding 5): a full refresh's prune removed every `*.tmp` of
    the link tree, so another refresh correcting a link (temp link, then rename into place)
    failed on its rename (FileNotFoundError). Refreshes of a data dir now run one at a time
    (`<data>/.warehouse.lock`). Forced interleaving: the first refresh, about to rename its
    temp link, starts a second (another process, as the DAG's task beside an erasure's)
    and goes on once the second has finished (the old code: its temp link pruned) or
    reports waiting at the lock (told by a lock tried without blocking first, not by
    time)."""
    import os

    import jobs.warehouse_links as links_module

    data = tmp_path / "data"
    registry = load_registry()
    _one_night(data, 44, "2026-11-27")
    # A link naming its file by another path (the refresh corrects it: temp link, rename).
    link = next((data / "warehouse.files" / "data").rglob("*.parquet"))
    target = link.resolve()
    link.unlink()
    link.symlink_to(target)
    (data / "warehouse.duckdb").unlink()  # both refreshes from nothing: each prunes
    real = os.replace
    seen: list[str] = []

    def start_a_second_then_rename(src: str, dst: str) -> None:
        if str(src).endswith(".tmp") and os.path.islink(src) and not seen:
            second = subprocess.Popen([sys.executable, "-c", _REFRESH_REPORTING_ITS_WAIT,
                                       str(data)], stdout=subprocess.PIPE, text=True)
            seen.append(second.stdout.readline().strip() if second.stdout else "")
            started.append(second)
        real(src, dst)

    started: list[subprocess.Popen[str]] = []
    monkeypatch.setattr(links_module.os, "replace", start_a_second_then_rename)
    try:
        refresh_warehouse(data, registry)
    finally:
        monkeypatch.undo()
        for second in started:
            out, _ = second.communicate(timeout=300)
            seen.append(out.strip())
            assert second.returncode == 0
    assert seen == ["waits", "finished"]  # the second could not run meanwhile
    assert os.readlink(link) != str(target)  # corrected
    held = [p for p in (data / "warehouse.files").rglob("*") if not p.is_dir()]
    assert [p for p in held if not p.is_symlink() or p.name.endswith(".tmp")] == []
    _assert_shows_the_lake(data)


_KILLED_REFRESH = """
import os, sys, duckdb
con = duckdb.connect(os.path.join(sys.argv[1], f".warehouse.duckdb.{os.getpid()}.tmp"))
con.execute("CREATE TABLE half_built AS SELECT range AS x FROM range(1000)")
print("written", flush=True)
sys.stdin.read()
"""


def test_a_refresh_removes_a_killed_refreshs_temp_database_and_its_wal(tmp_path):
    """A refresh killed while it builds (kill -9, as a killed batch's task) leaves its
    temp database and DuckDB's write-ahead log beside it; the next refresh removes both,
    and the warehouse it builds opens."""
    registry = load_registry()
    killed = subprocess.Popen([sys.executable, "-c", _KILLED_REFRESH, str(tmp_path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert killed.stdout is not None
        assert killed.stdout.readline().strip() == "written"
    finally:
        killed.kill()
        killed.wait()
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [f".warehouse.duckdb.{killed.pid}.tmp",
                    f".warehouse.duckdb.{killed.pid}.tmp.wal"]
    refresh_warehouse(tmp_path, registry)
    assert [p.name for p in tmp_path.glob(".warehouse.duckdb.*")] == []
    con = duckdb.connect(str(tmp_path / "warehouse.duckdb"), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM boards").fetchone()[0] > 0
    finally:
        con.close()
