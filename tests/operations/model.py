"""The checker's model for the operations tests: what every merged query must answer, computed
from the history of accepted events and bans alone.

Written from docs/design.md sections 3 to 6, independently of the product: it imports nothing from
leaderboard/, jobs/, speed_layer/ or serving/ (no calendar, sort-key codec, fold or validation
code), and counts in plain Python over the events the test saw accepted. Windows are the
`daily` and `all-time` kinds only; a board is (scope, aggregation, tie policy, grace, windows).
A direct board (scope `board:<name>`, docs/design.md section 3) counts only the scores
submitted to it; its scores count nowhere else; a score's identity is (board, match, player).

Exceptions docs/design.md allows, stated here and nowhere else:

- *A duplicate older than the horizon* lands (the door forgot it) and may be counted twice by
  the speed layer until the batch absorbs it. The operations test re-delivers late only rows
  whose second count changes no answer (0 points: sum +0; max/min/last: the same event again),
  so every answer is still checked exactly. A re-delivery of any points of a result the
  live version absorbed is counted once by every recompute of the player's live part and
  by the batch (docs/architecture.md), so the test sends one only with such a recompute
  (or the nights) right after it, and only while the first copy's raw row is kept
  (retention deletes the identities the dedupe reads: a documented limit).
- *Voids* (docs/design.md section 3): an event a void names (its match, or its match and
  player) counts nowhere once the void is in force: the live version's base applies the
  voids from before its watermark, merged answers all of them. (Past retention a void
  cannot reach a result the live version absorbed on an event date at or before the safe
  line, where raw events may be gone; once retention deleted raw events the operations test
  voids only matches or results with no such absorbed row, absorbed or not. Retention waits
  until the live version holds every void, so it never takes back one made before.)
- *Unbanned across the watermark* (docs/architecture.md, "known limits"): a player the live
  base excludes (banned before W) who is unbanned after W is served with the results first
  accepted since W at once (a late copy of a result accepted before W is no new one) and
  the whole history from the next batch on.

- *Erasure* (README, "Erasure"): an erased player leaves no trace: their events (landed,
  held or voided), bans and voids are gone from every version and the live answers, the
  others re-ranked exactly as if the player had never played; a later event of the id is
  refused (reason `erased`).
- *Sums at the key's limit* (README, "Limits"): a `sum` board's score is the exact total of
  its counted points clamped once to [-L, L], L the board's key limit (`BoardSpec.limit`;
  with `shared` ties every key is an integer below 2^53, so L = 2^53 - 1), whatever the
  signs and order of the points. A landed row of the model may stand for many rows
  (`Event.rows`: a whale's burst of identical scores), counted `rows` times.
- *Implausible rates* (README, "Implausible rates (per player)"): with
  `limits.player_events_per_minute = N`, a player's events past N in one landing minute
  (fixed minutes of the landing clock, shared by every writer) are held in the quarantine
  with reason `implausible_rate` and count nowhere; match events and direct scores count
  alike; within a batch rows count in batch order; a retry dropped at the door and a
  backfill do not count. `Model.admit` is that rule.

A player's percentile is checked as docs/architecture.md keeps it (the share at or behind the
player, the batch's column), not design.md's share strictly behind; `Answer` has both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

__all__ = ["Answer", "BoardSpec", "Event", "Model"]

ALL_TIME = "all-time"


@dataclass(frozen=True)
class BoardSpec:
    name: str
    scope: str  # "global", "region:<r>", "mode:<m>", or "board:<name>" (a direct board)
    aggregation: str  # sum | max | last (desc order)
    ties: str  # shared | earliest
    grace: timedelta
    windows: tuple[str, ...]
    #: a sum's key limit L (its score is the exact total clamped once to [-L, L])
    limit: int | None = None

    def applies(self, event: Event) -> bool:
        if self.scope.startswith("board:") or event.board is not None:
            return self.scope == f"board:{event.board}"
        if self.scope == "global":
            return True
        kind, _, value = self.scope.partition(":")
        return (event.region if kind == "region" else event.mode) == value


@dataclass(frozen=True)
class Event:
    match_id: str
    player_id: str
    points: int
    event_time: datetime
    region: str
    mode: str
    ingested_at: datetime
    backfill: bool = False
    #: landing order across the test (ties on ingested_at: the earlier landing wins)
    order: int = 0
    #: the direct board a score was submitted to (None: a match event)
    board: str | None = None
    #: how many landed rows this one stands for (a whale's burst: `rows` scores of `points`,
    #: under match ids `<match_id>.<i>`; never retried, re-delivered or voided by the test)
    rows: int = 1

    @property
    def identity(self) -> tuple[str, str, str]:
        return (self.match_id, self.player_id, self.board or "")


@dataclass(frozen=True)
class Answer:
    """One player's line on one board-window."""

    player_id: str
    score: int
    rank: int
    #: share of the board strictly behind the player (docs/design.md section 6)
    percentile: float
    #: share at or behind the player (100 * (total - rank + 1) / total), what the build
    #: answered before issue 11 item 5
    percentile_at_or_behind: float


def _window_id(kind: str, event_time: datetime) -> str:
    return ALL_TIME if kind == ALL_TIME else f"daily:{event_time.date().isoformat()}"


def _window_end(window_id: str) -> datetime | None:
    if window_id == ALL_TIME:
        return None
    day = date.fromisoformat(window_id.removeprefix("daily:"))
    return datetime.combine(day + timedelta(days=1), datetime.min.time(), UTC)


@dataclass
class Model:
    boards: tuple[BoardSpec, ...]
    #: every landed row, in landing order (late duplicates included)
    landed: list[Event] = field(default_factory=list)
    #: (player, action, at, order) tombstones
    tombstones: list[tuple[str, str, datetime, int]] = field(default_factory=list)
    #: the live version's watermark (None: no batch published): a midnight, or the instant
    #: a batch of a day not ended (`--allow-open-day`) read the lake
    watermark: datetime | None = None
    #: (match_id, player_id or None for every player, at) voids
    voids: list[tuple[str, str | None, datetime]] = field(default_factory=list)
    #: erased players: no trace of them anywhere, their later events refused
    erased: set[str] = field(default_factory=set)
    #: rows held for rate (in the quarantine, counting nowhere): (match_id, player, board)
    held: list[tuple[str, str, str | None]] = field(default_factory=list)
    #: events counted against each (player, landing minute) by the rate rule
    minute_counts: dict[tuple[str, int], int] = field(default_factory=dict)

    # -- history ---------------------------------------------------------------------------

    def land(self, event: Event) -> None:
        self.landed.append(event)

    def tombstone(self, player: str, action: str, at: datetime) -> None:
        self.tombstones.append((player, action, at, len(self.tombstones)))

    def void(self, match_id: str, player_id: str | None, at: datetime) -> None:
        self.voids.append((match_id, player_id, at))

    def erase(self, player: str) -> None:
        """Every trace of the player goes: events, held rows, bans, voids of their result."""
        self.erased.add(player)
        self.landed = [e for e in self.landed if e.player_id != player]
        self.held = [h for h in self.held if h[1] != player]
        self.tombstones = [t for t in self.tombstones if t[0] != player]
        self.voids = [v for v in self.voids if v[1] != player]

    def admit(self, rows: list[tuple[str, str, str | None]], landed_at: datetime,
              limit: int) -> list[bool]:
        """Which rows (match_id, player_id, board) of one batch count (True) and which are
        held for rate (False, recorded in `held`): each player's rows in batch order, up to
        `limit` in the landing minute of `landed_at` with what counted there before."""
        minute = int(landed_at.timestamp() // 60)
        kept = []
        for row in rows:
            used = self.minute_counts.get((row[1], minute), 0)
            kept.append(used < limit)
            if used < limit:
                self.minute_counts[(row[1], minute)] = used + 1
            else:
                self.held.append(row)
        return kept

    def voided(self, event: Event, before: datetime | None = None) -> bool:
        """Whether a void (at < before; all if None) names the event."""
        return any(match == event.match_id and player in (None, event.player_id)
                   and (before is None or at < before) for match, player, at in self.voids)

    def banned(self, before: datetime | None = None) -> set[str]:
        """The latest tombstone (at < before) decides; an unban wins a tie on `at`."""
        latest: dict[str, tuple[datetime, int, str]] = {}
        for player, action, at, _order in self.tombstones:
            if before is not None and at >= before:
                continue
            rank = (at, 1 if action == "unban" else 0, action)
            if player not in latest or rank >= latest[player]:
                latest[player] = rank
        return {p for p, (_at, _u, action) in latest.items() if action == "ban"}

    def first_accepted(self) -> dict[tuple[str, str, str], Event]:
        """The first landed copy of each identity (earliest ingested_at, then landing)."""
        found: dict[tuple[str, str, str], Event] = {}
        for event in sorted(self.landed, key=lambda e: (e.ingested_at, e.order)):
            found.setdefault(event.identity, event)
        return found

    def accepted_at(self, identity: tuple[str, str, str]) -> datetime | None:
        first = self.first_accepted().get(identity)
        return None if first is None else first.ingested_at

    # -- counting --------------------------------------------------------------------------

    @staticmethod
    def _counts(board: BoardSpec, window_id: str, event: Event) -> bool:
        end = _window_end(window_id)
        return event.backfill or end is None or event.ingested_at <= end + board.grace

    def _cells(self, events: list[Event]) -> dict[tuple[str, str], dict[str, list[Event]]]:
        cells: dict[tuple[str, str], dict[str, list[Event]]] = {}
        for event in events:
            for board in self.boards:
                if not board.applies(event):
                    continue
                for kind in board.windows:
                    window_id = _window_id(kind, event.event_time)
                    if self._counts(board, window_id, event):
                        cells.setdefault((board.name, window_id), {}).setdefault(
                            event.player_id, []).append(event)
        return cells

    def _standings(self, board: BoardSpec, players: dict[str, list[Event]],
                   banned: set[str]) -> list[Answer]:
        scored = []
        for player, events in players.items():
            if player in banned:
                continue
            if board.aggregation == "sum":
                score = sum(e.points * e.rows for e in events)
                if board.limit is not None:
                    score = max(-board.limit, min(board.limit, score))
                reached = max(e.event_time for e in events)
            elif board.aggregation == "max":
                best = max(e.points for e in events)
                score = best
                reached = min(e.event_time for e in events if e.points == best)
            else:  # last: the latest event (ties on event_time: the larger match_id)
                latest = max(events, key=lambda e: (e.event_time, e.match_id))
                score, reached = latest.points, latest.event_time
            # earliest ties: who reached the score first (to the second) ranks higher
            tiebreak = int(reached.timestamp()) if board.ties == "earliest" else 0
            scored.append((score, tiebreak, player))
        scored.sort(key=lambda s: (-s[0], s[1], s[2]))
        total = len(scored)
        answers: list[Answer] = []
        for position, (score, tiebreak, player) in enumerate(scored, start=1):
            if board.ties == "earliest":
                rank = position
                behind = sum(1 for s in scored if (s[0], -s[1]) < (score, -tiebreak))
            else:
                rank = 1 + sum(1 for s in scored if s[0] > score)
                behind = sum(1 for s in scored if s[0] < score)
            answers.append(Answer(player, score, rank, 100.0 * behind / total,
                                  100.0 * (total - rank + 1) / total))
        return answers

    def base(self) -> dict[tuple[str, str], list[Answer]]:
        """The live batch version: events ingested before W, first ingested wins, bans
        before W applied."""
        if self.watermark is None:
            return {}
        watermark = self.watermark
        absorbed = [e for e in self.first_accepted().values()
                    if e.ingested_at < watermark and not self.voided(e, watermark)]
        banned = self.banned(before=watermark)
        return {key: self._standings(self.board(key[0]), players, banned)
                for key, players in self._cells(absorbed).items()}

    def merged(self) -> dict[tuple[str, str], list[Answer]]:
        """What every merged query must answer now: batch(all) with today's bans, but for the
        players unbanned across the watermark (see the module doc)."""
        firsts = list(self.first_accepted().values())
        banned_now = self.banned()
        back = set()
        if self.watermark is not None:
            back = self.banned(before=self.watermark) - banned_now
        firsts = [e for e in firsts if not self.voided(e)]
        events = [e for e in firsts if e.player_id not in back]
        if back:
            assert self.watermark is not None
            since: dict[tuple[str, str, str], Event] = {}
            for event in sorted(self.landed, key=lambda e: (e.ingested_at, e.order)):
                if event.player_id in back and event.ingested_at >= self.watermark:
                    since.setdefault(event.identity, event)
            # a copy of a result the base absorbed (first accepted before W) is not new
            absorbed = {e.identity for e in firsts if e.ingested_at < self.watermark}
            since = {k: e for k, e in since.items()
                     if not self.voided(e) and k not in absorbed}
            events += list(since.values())
        return {key: self._standings(self.board(key[0]), players, banned_now)
                for key, players in self._cells(events).items()}

    def board(self, name: str) -> BoardSpec:
        for board in self.boards:
            if board.name == name:
                return board
        raise KeyError(name)
