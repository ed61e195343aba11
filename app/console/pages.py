"""The console's pages as server-rendered HTML: the layout, the navigation, the forms and
the empty panels that `static/console.js` fills from the JSON API and keeps live.

Everything from outside the code (board names, window ids, player ids typed into a form)
goes through `html.escape` (text) or `urllib.parse.quote` (URLs): the pages echo query
parameters back into forms.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from leaderboard.registry import Board, Registry

__all__ = [
    "board_page",
    "boards_page",
    "distribution_page",
    "not_found_page",
    "ops_page",
    "player_page",
]

_NAV = (("boards", "/", "Boards"), ("players", "/console/players", "Players"),
        ("distribution", "/console/distribution", "Distribution"),
        ("ops", "/console/ops", "Operations"))


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def board_url(board: str, **query: str) -> str:
    path = f"/console/boards/{quote(board, safe=':')}"
    query = {k: v for k, v in query.items() if v}
    return f"{path}?{urlencode(query)}" if query else path


def _layout(page: str, title: str, body: str, data: Mapping[str, str] | None = None) -> str:
    attrs = "".join(f' data-{k}="{_e(v)}"' for k, v in (data or {}).items())
    nav = "".join(f'<a href="{href}"{" class=active" if key == page else ""}>{label}</a>'
                  for key, href, label in _NAV)
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)} · leaderboard console</title>"
        '<link rel="icon" href="data:,">'
        '<link rel="stylesheet" href="/console/static/console.css">'
        '<script src="/console/static/console.js" defer></script>'
        f'</head><body data-page="{page}"{attrs}>'
        f'<header><a class="brand" href="/">leaderboard</a><nav>{nav}</nav>'
        '<span id="live" class="live" aria-live="polite"></span></header>'
        f'<main><h1>{_e(title)}</h1><p id="problem" class="error" role="alert" hidden></p>'
        f"{body}</main>"
        '<footer>JSON API: <a href="/docs">/docs</a> · <a href="/openapi.json">/openapi.json'
        '</a> · <a href="/healthz">/healthz</a> · <a href="/metrics">/metrics</a></footer>'
        "</body></html>")


def _options(values: Iterable[tuple[str, str]], selected: str) -> str:
    return "".join(f'<option value="{_e(v)}"{" selected" if v == selected else ""}>{_e(label)}'
                   "</option>" for v, label in values)


def _board_and_window(registry: Registry, board: Board, window: str) -> str:
    """The board and window selects of a GET form (changing one resubmits it)."""
    boards = _options(((b.name, b.name) for b in registry.boards), board.name)
    windows = _options(((k, k) for k in board.windows), window)
    if window not in board.windows:  # a window id such as weekly:2026-W49
        windows += _options([(window, window)], window)
    return (f'<label>Board <select name="board" data-autosubmit>{boards}</select></label>'
            f'<label>Window <select name="window" data-autosubmit>{windows}</select></label>')


def boards_page(boards: Sequence[Mapping[str, Any]]) -> str:
    """Every board with its open windows and their next resets (server-rendered; the script
    adds each board's player count and leader, and turns resets into countdowns)."""
    rows = []
    for board in boards:
        name = str(board["board"])
        windows = "".join(
            f'<li><a href="{_e(board_url(name, window=w["kind"]))}">{_e(w["kind"])}</a> '
            f'<span class="muted">{_e(w["window"])}</span> '
            + ('<span class="muted">never resets</span>' if w["next_reset"] is None else
               f'<span class="muted">resets <time class="reset" datetime="{_e(w["next_reset"])}">'
               f'{_e(w["next_reset"])}</time></span>')
            + "</li>" for w in board["windows"])
        rows.append(
            f'<tr data-board="{_e(name)}"><td><a href="{_e(board_url(name))}">{_e(name)}</a></td>'
            f'<td>{_e(board["aggregation"])} · {_e(board["order"])} · ties {_e(board["ties"])}'
            f'</td><td><ul class="windows">{windows}</ul></td>'
            '<td class="num players">…</td><td class="leader">…</td></tr>')
    table = ('<table class="grid"><thead><tr><th>Board</th><th>Ranking</th><th>Windows</th>'
             '<th class="num">Players (all-time)</th><th>Leader</th></tr></thead>'
             f'<tbody>{"".join(rows)}</tbody></table>')
    return _layout("boards", "Boards", table)


def board_page(registry: Registry, board: Board, window: str, n: int) -> str:
    """The live top N of one board-window, paged by cursor."""
    switcher = "".join(
        f'<a href="{_e(board_url(board.name, window=k, n=str(n)))}"'
        f'{" class=active" if k == window else ""}>{_e(k)}</a>' for k in board.windows)
    sizes = _options(((str(s), f"{s} per page") for s in (10, 25, 50, 100)), str(n))
    body = (
        f'<nav class="tabs" aria-label="window">{switcher}</nav>'
        '<p class="summary"><span id="top-window"></span> · <span id="top-total">…</span> '
        'players · ranking by ' f"{_e(board.aggregation)} ({_e(board.order)}) · "
        f'<a href="/console/distribution?{_e(urlencode({"board": board.name, "window": window}))}"'
        '>score distribution</a></p>'
        '<form class="inline" method="get"><label>Page size <select name="n" data-autosubmit>'
        f'{sizes}</select></label><input type="hidden" name="window" value="{_e(window)}"></form>'
        '<table class="grid" id="top"><thead><tr><th class="num">Rank</th><th>Player</th>'
        '<th class="num">Score</th><th>Move</th></tr></thead><tbody id="top-rows"></tbody></table>'
        '<div class="pager"><button type="button" id="top-first">&laquo; First</button>'
        '<button type="button" id="top-prev">&lsaquo; Previous</button>'
        '<span id="top-page"></span>'
        '<button type="button" id="top-next">Next &rsaquo;</button></div>')
    return _layout("board", f"Board {board.name}", body,
                   {"board": board.name, "window": window, "n": str(n)})


def _matches(board: Board, window: str, searched: str,
             matches: Sequence[Mapping[str, str]]) -> str:
    """The players whose display name starts with what was searched, as links."""
    if not searched:
        return ""
    if not matches:
        return (f'<p class="muted" id="name-matches">No player named “{_e(searched)}…” '
                "(display names are set with the profile API).</p>")
    links = "".join(
        '<li><a href="/console/players?'
        f'{_e(urlencode({"board": board.name, "window": window, "player": m["player_id"]}))}">'
        f'{_e(m["display_name"])}</a> <span class="id">{_e(m["player_id"])}</span></li>'
        for m in matches)
    return (f'<section id="name-matches"><h2>Players named “{_e(searched)}…”</h2>'
            f"<ul>{links}</ul></section>")


def player_page(registry: Registry, board: Board, window: str, player: str,
                friends: str, *, searched: str = "",
                matches: Sequence[Mapping[str, str]] = ()) -> str:
    """Player search by id or display name: live rank card, neighbours, rank history, and a
    friends view; `matches` lists the players whose name starts with `searched`."""
    form = (
        '<form class="search" method="get" action="/console/players">'
        f"{_board_and_window(registry, board, window)}"
        f'<label>Player id or name <input name="player" id="player-input" '
        f'value="{_e(player or searched)}" required maxlength="64" '
        'placeholder="e.g. p00042 or a display name" autocomplete="off"></label>'
        f'<input type="hidden" name="friends" value="{_e(friends)}">'
        '<button type="submit" id="player-search">Search</button></form>'
        + _matches(board, window, searched, matches))
    panels = ""
    if player:
        panels = (
            '<section class="cards" id="player-card">'
            '<div class="card"><span class="label">Rank</span><span class="big" id="player-rank">'
            '…</span><span class="muted" id="player-total"></span></div>'
            '<div class="card"><span class="label">Score</span><span class="big" '
            'id="player-score">…</span></div>'
            '<div class="card"><span class="label">Percentile</span><span class="big" '
            'id="player-percentile">…</span></div>'
            '<div class="card"><span class="label">As of yesterday</span><span class="big" '
            'id="player-yesterday">…</span><span id="player-change"></span></div></section>'
            '<div class="two"><section><h2>Around</h2><table class="grid"><thead><tr>'
            '<th class="num">Rank</th><th>Player</th><th class="num">Score</th></tr></thead>'
            '<tbody id="around-rows"></tbody></table></section>'
            '<section><h2>Rank history <span class="muted" id="history-note"></span></h2>'
            '<div id="history-chart" class="chart"></div></section></div>')
    friends_form = (
        '<section><h2>Friends</h2><form method="get" action="/console/players" '
        'class="friends">'
        f'<input type="hidden" name="board" value="{_e(board.name)}">'
        f'<input type="hidden" name="window" value="{_e(window)}">'
        f'<input type="hidden" name="player" value="{_e(player)}">'
        '<label>Player ids (commas, spaces or lines)<textarea name="friends" id="friends-input" '
        f'rows="3">{_e(friends)}</textarea></label><button type="submit">Rank together</button>'
        '</form><table class="grid"><thead><tr><th class="num">#</th><th class="num">Rank</th>'
        '<th>Player</th><th class="num">Score</th></tr></thead><tbody id="friends-rows">'
        '</tbody></table><p class="muted" id="friends-unranked"></p></section>')
    return _layout("player", "Players", form + panels + friends_form,
                   {"board": board.name, "window": window, "player": player,
                    "friends": friends})


def distribution_page(registry: Registry, board: Board, window: str) -> str:
    """The score distribution: a log-count histogram and a quantile curve, both marked with
    the scores needed for the top 1/10/25/50 %."""
    body = (
        '<form class="search" method="get" action="/console/distribution">'
        f"{_board_and_window(registry, board, window)}</form>"
        '<p class="summary" id="dist-summary">…</p>'
        '<div class="two"><section><h2>Players per score <span class="muted">(count axis: '
        '<button type="button" id="dist-scale" class="link">log</button>)</span></h2>'
        '<div id="dist-histogram" class="chart"></div></section>'
        '<section><h2>Score needed for the top x %</h2><div id="dist-quantiles" class="chart">'
        '</div></section></div>'
        '<table class="grid" id="dist-table"><thead><tr><th class="num">Top</th>'
        '<th class="num">Score needed</th><th class="num">At rank</th></tr></thead>'
        '<tbody id="dist-rows"></tbody></table>')
    return _layout("distribution", "Score distribution", body,
                   {"board": board.name, "window": window})


def ops_page() -> str:
    """Batch, speed layer, health, quarantine; ban, unban, void and erase: all behind the
    admin key, which the page asks for once (the API checks it: the page holds no power of
    its own)."""
    body = (
        '<section id="ops-gate" hidden><h2>Admin key</h2>'
        '<form id="ops-unlock" class="search" autocomplete="off"><label>Admin key '
        '<input type="password" id="ops-key" autocomplete="off" placeholder="X-Admin-Key">'
        '</label><button type="submit">Show operations</button></form>'
        '<p id="ops-gate-note" class="muted"></p></section>'
        '<div class="two"><section><h2>Batch view</h2><dl id="ops-batch" class="kv"></dl>'
        '</section><section><h2>Speed layer</h2><dl id="ops-speed" class="kv"></dl></section>'
        '</div><section><h2>Health <span id="ops-health-status"></span></h2>'
        '<ul id="ops-health" class="problems"></ul></section>'
        '<section><h2>Quarantine <span class="muted" id="ops-quarantine-note"></span></h2>'
        '<table class="grid" id="ops-quarantine"></table></section>'
        '<section><h2>Admin</h2><form id="admin" class="search" autocomplete="off">'
        '<label>Admin key <input type="password" id="admin-key" autocomplete="off" '
        'placeholder="X-Admin-Key"></label>'
        '<label>Player id <input id="admin-player" maxlength="64" required></label>'
        '<label>Reason <input id="admin-reason" maxlength="500"></label>'
        '<button type="submit" data-action="bans">Ban</button>'
        '<button type="submit" data-action="unbans">Unban</button></form>'
        '<p id="admin-result" class="muted">The key is sent as the X-Admin-Key header and kept '
        "in this tab only (sessionStorage).</p></section>" + _void_section()
        + _erase_section() + _review_section())
    return _layout("ops", "Operations", body)


def _confirm(name: str, button: str, extra: str = "") -> str:
    """The confirm step of an action that cannot be undone: hidden until its form is sent,
    it says what will happen; only its button sends the request."""
    return (f'<div id="{name}-confirm" class="confirm" hidden role="alertdialog" '
            f'aria-labelledby="{name}-confirm-text"><p id="{name}-confirm-text"></p>{extra}'
            f'<button type="button" id="{name}-yes" class="danger">{button}</button>'
            f'<button type="button" id="{name}-no">Cancel</button></div>')


def _void_section() -> str:
    """A void of a match, or of one player's result in it (POST /v1/admin/voids)."""
    return (
        '<section><h2>Void a result</h2><form id="void" class="search" autocomplete="off">'
        '<label>Match id <input id="void-match" maxlength="128" required></label>'
        '<label>Player id <input id="void-player" maxlength="64" placeholder="every player">'
        '</label><label>Reason <input id="void-reason" maxlength="500" required></label>'
        '<button type="submit">Void…</button></form>' + _confirm("void", "Void it")
        + '<p id="void-result" class="muted">With the admin key above. A void cannot be '
        "undone: a corrected result is a new submission with a new match id.</p></section>")


def _erase_section() -> str:
    """The erasure of a player everywhere (DELETE /v1/admin/players/{id}): the confirm
    step asks for the id again."""
    return (
        '<section><h2>Erase a player</h2><form id="erase" class="search" autocomplete="off">'
        '<label>Player id <input id="erase-player" maxlength="64" required></label>'
        '<button type="submit">Erase…</button></form>'
        + _confirm("erase", "Erase for good", '<label>Type the player id again <input '
                   'id="erase-again" maxlength="64" autocomplete="off"></label>')
        + '<p id="erase-result" class="muted">With the admin key above. Right to erasure: '
        "the player's events, standings, profile and live state go everywhere, and later "
        "events of the id are refused. It cannot be undone.</p></section>")


def _review_section() -> str:
    """Quarantined rows listed by reason, and a release of the ones ticked (admin key)."""
    from leaderboard.validation import REASONS

    options = "".join(f'<option value="{_e(r)}" title="{_e(REASONS[r])}">{_e(r)}</option>'
                      for r in sorted(REASONS))
    return (
        '<section><h2>Quarantine review</h2><form id="review" class="search" '
        'autocomplete="off"><label>Reason <select id="review-reason"><option value="">any'
        f"</option>{options}</select></label><button type=\"submit\">List</button>"
        '<button type="button" id="review-release" disabled>Release ticked</button></form>'
        '<table class="grid" id="review-rows"></table>'
        '<p id="review-result" class="muted">With the admin key above: the first 50 rows, '
        "oldest first. A release validates each row again and lands it once.</p></section>")


def not_found_page(message: str, registry: Registry) -> str:
    links = "".join(f'<li><a href="{_e(board_url(b.name))}">{_e(b.name)}</a></li>'
                    for b in registry.boards)
    return _layout("boards", "Not found",
                   f'<p class="error">{_e(message)}</p><p>Boards:</p><ul>{links}</ul>')
