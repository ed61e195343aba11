// The leaderboard console's one script: it fills the server-rendered pages from the JSON
// API (/v1/...) and keeps them live by short polling (a poll starts a second after the
// previous one settled, and pauses while the tab is hidden). No libraries, no build step.
"use strict";

(function () {
  const body = document.body;
  const nf = new Intl.NumberFormat("en-US");
  const SVG = "http://www.w3.org/2000/svg";
  const POLL_MS = 1000;

  // -- helpers ---------------------------------------------------------------------------

  function $(selector) { return document.querySelector(selector); }

  function h(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value; else node.setAttribute(key, value);
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function s(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function num(value) { return value === null || value === undefined ? "—" : nf.format(value); }
  function enc(value) { return encodeURIComponent(value); }
  function boardPath(board) { return "/v1/boards/" + enc(board); }
  function playerLink(board, win, id, label) {
    const q = new URLSearchParams({ board, window: win, player: id });
    return h("a", { href: "/console/players?" + q }, label || id);
  }
  function who(entry) {
    // Display names where the API provides them (profiles), the player id otherwise.
    return entry.display_name
      ? [entry.display_name, h("span", { class: "id" }, entry.player_id)]
      : [entry.player_id];
  }

  class ApiError extends Error {
    constructor(status, answer) {
      super(answer && answer.message ? answer.message : "HTTP " + status);
      this.status = status;
      this.answer = answer;
    }
  }

  async function api(path, options) {
    const response = await fetch(path, Object.assign({ headers: { Accept: "application/json" } },
                                                      options || {}));
    let answer = null;
    try { answer = await response.json(); } catch (_) { answer = null; }
    if (!response.ok) throw new ApiError(response.status, answer);
    return answer;
  }

  // The header's live indicator, and the page's problem line (the API's message, which
  // says what to do next) while polls fail.
  const live = $("#live");
  const problem = $("#problem");
  function liveOk() {
    live.className = "live ok";
    live.textContent = "live · " + new Date().toLocaleTimeString();
    problem.hidden = true;
  }
  function liveError(error) {
    const text = error instanceof ApiError ? error.message
      : `the server does not answer (${error instanceof Error ? error.message : error}); ` +
        "retrying";
    live.className = "live error";
    live.textContent = "not updating";
    problem.textContent = text;
    problem.hidden = false;
  }

  // Run `task` now and again `ms` after each run settles; `refresh()` runs it at once.
  function poll(task, ms) {
    let timer = null;
    let running = false;
    async function run() {
      if (timer) { clearTimeout(timer); timer = null; }
      if (running) return;
      running = true;
      try {
        if (!document.hidden) { await task(); liveOk(); }
      } catch (error) {
        liveError(error);
      } finally {
        running = false;
        timer = setTimeout(run, ms);
      }
    }
    run();
    return { refresh: run };
  }

  function relative(iso) {
    const seconds = Math.round((Date.parse(iso) - Date.now()) / 1000);
    if (!isFinite(seconds)) return iso;
    const abs = Math.abs(seconds);
    const [d, hr, m] = [Math.floor(abs / 86400), Math.floor(abs % 86400 / 3600),
                        Math.floor(abs % 3600 / 60)];
    const text = d ? `${d} d ${hr} h` : hr ? `${hr} h ${m} min` : m ? `${m} min` : `${abs} s`;
    return seconds >= 0 ? "in " + text : text + " ago";
  }

  function move(change) {
    if (change === null || change === undefined) return h("span", { class: "muted" }, "—");
    if (change > 0) return h("span", { class: "up" }, "▲ " + nf.format(change));
    if (change < 0) return h("span", { class: "down" }, "▼ " + nf.format(-change));
    return h("span", { class: "muted" }, "=");
  }

  // Selects marked data-autosubmit resubmit their form (board and window switchers).
  for (const select of document.querySelectorAll("select[data-autosubmit]")) {
    select.addEventListener("change", () => select.form.submit());
  }

  // -- boards ------------------------------------------------------------------------------

  function boardsPage() {
    for (const node of document.querySelectorAll("time.reset")) {
      node.title = node.getAttribute("datetime");
      node.textContent = relative(node.getAttribute("datetime"));
    }
    const rows = [...document.querySelectorAll("tr[data-board]")];
    poll(async () => {
      await Promise.all(rows.map(async (row) => {
        const board = row.dataset.board;
        const top = await api(boardPath(board) + "/top?n=1");
        row.querySelector(".players").textContent = num(top.total);
        const leader = row.querySelector(".leader");
        const first = top.entries[0];
        leader.replaceChildren(first
          ? h("span", {}, playerLink(board, "all-time", first.player_id,
                                     first.display_name || first.player_id),
              h("span", { class: "muted" }, " · " + num(first.score)))
          : h("span", { class: "muted" }, "nobody yet"));
      }));
    }, 5000);
  }

  // -- one board's live top N --------------------------------------------------------------

  function boardPage() {
    const board = body.dataset.board;
    const win = body.dataset.window;
    const n = Number(body.dataset.n) || 25;
    const cursors = [null];        // the cursor of each page up to the current one
    let nextCursor = null;
    let lastRanks = null;          // player -> rank at the previous poll of this page
    let lastText = "";
    const moves = new Map();       // player -> {delta, until}: arrows shown for 10 s
    const rows = $("#top-rows");

    function render(top) {
      $("#top-window").textContent = top.window;
      $("#top-total").textContent = num(top.total);
      nextCursor = top.next_cursor;
      const page = cursors.length;
      const first = top.entries.length ? top.entries[0].rank : 0;
      const last = top.entries.length ? top.entries[top.entries.length - 1].rank : 0;
      $("#top-page").textContent = top.entries.length
        ? `page ${page} · ranks ${num(first)}–${num(last)}` : `page ${page} · empty`;
      $("#top-prev").disabled = $("#top-first").disabled = page === 1;
      $("#top-next").disabled = !nextCursor;
      const text = JSON.stringify(top.entries);
      if (text === lastText) return;
      lastText = text;
      const now = Date.now();
      const ranks = new Map(top.entries.map((e) => [e.player_id, e.rank]));
      const flashed = new Set();
      if (lastRanks) {
        for (const e of top.entries) {
          const before = lastRanks.get(e.player_id);
          if (before !== e.rank) {
            moves.set(e.player_id, { delta: before === undefined ? null : before - e.rank,
                                     until: now + 10000 });
            flashed.add(e.player_id);
          }
        }
      }
      lastRanks = ranks;
      rows.replaceChildren(...top.entries.map((e) => {
        const moved = moves.get(e.player_id);
        const recent = moved && moved.until > now;
        return h("tr", { class: flashed.has(e.player_id) ? "flash" : null,
                         "data-player": e.player_id },
          h("td", { class: "num" }, num(e.rank)),
          h("td", {}, playerLink(board, win, e.player_id, who(e))),
          h("td", { class: "num" }, num(e.score)),
          h("td", {}, recent ? (moved.delta === null ? h("span", { class: "up" }, "new")
                                                     : move(moved.delta)) : ""));
      }));
    }

    async function load() {
      const q = new URLSearchParams({ window: win, n: String(n) });
      const cursor = cursors[cursors.length - 1];
      if (cursor) q.set("cursor", cursor);
      render(await api(boardPath(board) + "/top?" + q));
    }

    const poller = poll(load, POLL_MS);
    function turn(change) {
      change();
      lastRanks = null;   // a new page: nothing to compare with
      lastText = "";
      poller.refresh();
    }
    $("#top-next").addEventListener("click", () => {
      if (nextCursor) turn(() => cursors.push(nextCursor));
    });
    $("#top-prev").addEventListener("click", () => {
      if (cursors.length > 1) turn(() => cursors.pop());
    });
    $("#top-first").addEventListener("click", () => turn(() => cursors.splice(1)));
  }

  // -- player search -----------------------------------------------------------------------

  function historyChart(target, points, liveRank, liveLabel) {
    const data = points.filter((p) => p.rank !== null).map((p) => ({ label: p.as_of,
                                                                      rank: p.rank }));
    if (liveRank !== null && liveRank !== undefined) {
      data.push({ label: liveLabel, rank: liveRank, live: true });
    }
    if (!data.length) {
      target.replaceChildren(h("p", { class: "muted" }, "No ranked days yet."));
      return;
    }
    const [W, H, L, R, T, B] = [560, 220, 56, 16, 14, 30];
    const worst = Math.max(...data.map((d) => d.rank));
    const best = Math.min(...data.map((d) => d.rank));
    const span = Math.max(1, worst - best);
    const x = (i) => L + (data.length === 1 ? (W - L - R) / 2 : i * (W - L - R) / (data.length - 1));
    const y = (rank) => T + (rank - best) * (H - T - B) / span;  // rank 1 at the top
    const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img",
                           "aria-label": "rank by day (higher is better)" });
    svg.append(s("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }),
               s("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }),
               s("text", { x: L - 6, y: y(best) + 4, "text-anchor": "end" }, "#" + nf.format(best)),
               s("text", { x: L - 6, y: y(worst) + 4, "text-anchor": "end" },
                 "#" + nf.format(worst)),
               s("text", { x: x(0), y: H - 10, "text-anchor": "start" }, data[0].label),
               s("text", { x: x(data.length - 1), y: H - 10, "text-anchor": "end" },
                 data[data.length - 1].label));
    svg.append(s("polyline", { class: "line",
                               points: data.map((d, i) => `${x(i)},${y(d.rank)}`).join(" ") }));
    data.forEach((d, i) => {
      const dot = s("circle", { class: d.live ? "dot live" : "dot", cx: x(i), cy: y(d.rank),
                                r: d.live ? 5 : 3.5 });
      dot.append(s("title", {}, `${d.label}: rank ${nf.format(d.rank)}`));
      svg.append(dot);
    });
    target.replaceChildren(svg);
  }

  function splitIds(text) {
    return [...new Set(text.split(/[\s,;]+/).map((id) => id.trim()).filter(Boolean))];
  }

  function playerPage() {
    const board = body.dataset.board;
    const win = body.dataset.window;
    const player = body.dataset.player;
    const friends = splitIds(body.dataset.friends || "");
    const kind = win.split(":")[0];
    let history = null;
    let liveRank = null;

    function drawHistory() {
      if (history) historyChart($("#history-chart"), history.history, liveRank, "now");
    }

    async function loadHistory() {
      try {
        history = await api(`${boardPath(board)}/players/${enc(player)}/history?window=${enc(kind)}`);
        $("#history-note").textContent = `(${kind}, one point per published day; now is live)`;
      } catch (error) {
        history = null;
        $("#history-chart").replaceChildren(h("p", { class: "error" }, error.message));
      }
      drawHistory();
    }

    async function loadPlayer() {
      const q = "?window=" + enc(win);
      const [me, around] = await Promise.all([
        api(`${boardPath(board)}/players/${enc(player)}${q}`),
        api(`${boardPath(board)}/players/${enc(player)}/around${q}&k=5`)]);
      $("#player-rank").textContent = me.rank === null ? "unranked" : "#" + num(me.rank);
      $("#player-total").textContent = `of ${num(me.total)} in ${me.window}`;
      $("#player-score").textContent = num(me.score);
      $("#player-percentile").textContent = me.percentile === null ? "—"
        : me.percentile.toFixed(2);
      const then = me.as_of_yesterday;
      $("#player-yesterday").textContent = then ? "#" + num(then.rank) : "—";
      $("#player-change").replaceChildren(then
        ? h("span", {}, move(me.change), h("span", { class: "muted" }, ` since ${then.as_of}`))
        : h("span", { class: "muted" }, "not ranked in the last batch"));
      const entries = [...around.above, ...(around.player ? [around.player] : []),
                       ...around.below];
      $("#around-rows").replaceChildren(...(entries.length ? entries.map((e) =>
        h("tr", { class: e.player_id === player ? "me" : null },
          h("td", { class: "num" }, num(e.rank)),
          h("td", {}, playerLink(board, win, e.player_id, who(e))),
          h("td", { class: "num" }, num(e.score))))
        : [h("tr", {}, h("td", { colspan: 3, class: "muted" }, "This player is unranked."))]));
      if (me.rank !== liveRank) {
        liveRank = me.rank;
        drawHistory();
      }
    }

    async function loadFriends() {
      const answer = await api(`${boardPath(board)}/friends?ids=${enc(friends.join(","))}` +
                               `&window=${enc(win)}`);
      $("#friends-rows").replaceChildren(...answer.entries.map((e) =>
        h("tr", { class: e.player_id === player ? "me" : null },
          h("td", { class: "num" }, num(e.friend_rank)), h("td", { class: "num" }, num(e.rank)),
          h("td", {}, playerLink(board, win, e.player_id, who(e))),
          h("td", { class: "num" }, num(e.score)))));
      $("#friends-unranked").textContent = answer.unranked.length
        ? "Unranked: " + answer.unranked.join(", ") : "";
    }

    if (!friends.length) {
      $("#friends-rows").closest("table").hidden = true;
      $("#friends-unranked").textContent = "Paste player ids to rank them together, live.";
    }
    if (!player && !friends.length) {
      $("#player-input").focus();
      return;
    }
    if (player) loadHistory();
    poll(async () => {
      await Promise.all([player ? loadPlayer() : null, friends.length ? loadFriends() : null]);
    }, POLL_MS);
    if (player) setInterval(() => { if (!document.hidden) loadHistory(); }, 60000);
  }

  // -- score distribution ------------------------------------------------------------------

  const MARKS = [1, 10, 25, 50];

  function rowFor(rows, top) {
    // The bucket holding the top-x% boundary: the first listed at or past x.
    return rows.reduce((found, r) => (r.top_percent >= top
      && (!found || r.top_percent < found.top_percent) ? r : found), null);
  }

  function threshold(row) {
    // The score needed now to be in the top x% (the score at rank ceil(x/100 * total)).
    return row.score;
  }

  function histogramChart(target, bins, marks, logScale) {
    if (!bins.length) {
      target.replaceChildren(h("p", { class: "muted" }, "No histogram for this window yet."));
      return;
    }
    const [W, H, L, R, T, B] = [560, 260, 56, 12, 14 + 11 * marks.length, 34];
    const lo = Math.min(...bins.map((b) => b.lower));
    const hi = Math.max(...bins.map((b) => b.upper));
    const most = Math.max(1, ...bins.map((b) => b.players));
    const x = (score) => L + (hi === lo ? 0.5 : (score - lo) / (hi - lo)) * (W - L - R);
    const height = (count) => (logScale ? Math.log10(count + 1) / Math.log10(most + 1)
                                        : count / most) * (H - T - B);
    const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img",
                           "aria-label": "players per score bucket" });
    const ticks = logScale
      ? Array.from({ length: Math.floor(Math.log10(most)) + 1 }, (_, i) => 10 ** i)
      : [0, Math.round(most / 2)];
    // The largest count is labelled; a round tick too close under it is dropped.
    while (ticks.length && height(most) - height(ticks[ticks.length - 1]) < 14) ticks.pop();
    ticks.push(most);
    for (const tick of ticks) {
      const ty = H - B - height(tick);
      svg.append(s("line", { class: "axis", x1: L, y1: ty, x2: W - R, y2: ty }),
                 s("text", { x: L - 6, y: ty + 4, "text-anchor": "end" }, nf.format(tick)));
    }
    const barWidth = Math.max(1, (W - L - R) / bins.length - 1);
    bins.forEach((b, i) => {
      const bh = b.players ? Math.max(1, height(b.players)) : 0;
      const bar = s("rect", { class: "bar", x: L + i * (W - L - R) / bins.length,
                              y: H - B - bh, width: barWidth, height: bh });
      bar.append(s("title", {}, `${nf.format(b.lower)}–${nf.format(b.upper)}: ` +
                                `${nf.format(b.players)} players`));
      svg.append(bar);
    });
    marks.forEach((m, i) => {
      // Thresholds are live, the histogram is the batch's: one past its range sits at the edge.
      const beyond = m.score > hi ? " ›" : m.score < lo ? " ‹" : "";
      const mx = x(Math.min(hi, Math.max(lo, m.score)));
      const right = mx > (L + W - R) / 2;  // labels lean inwards, one row each
      const ly = 12 + 11 * i;
      svg.append(s("line", { class: "marker", x1: mx, y1: ly + 3, x2: mx, y2: H - B }),
                 s("text", { class: "marker-label", x: right ? mx - 3 : mx + 3, y: ly + 1,
                             "text-anchor": right ? "end" : "start" },
                   `top ${m.top}%: ${nf.format(m.score)}${beyond}`));
    });
    svg.append(s("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }),
               s("text", { x: L, y: H - 12 }, nf.format(lo)),
               s("text", { x: W - R, y: H - 12, "text-anchor": "end" }, nf.format(hi)),
               s("text", { x: (L + W - R) / 2, y: H - 12, "text-anchor": "middle" }, "score"));
    target.replaceChildren(svg);
  }

  function quantileChart(target, rows) {
    if (!rows.length) {
      target.replaceChildren(h("p", { class: "muted" }, "No percentile table for this window yet."));
      return;
    }
    const [W, H, L, R, T, B] = [560, 240, 64, 12, 16, 34];
    const points = rows.map((r) => ({ top: r.top_percent, score: threshold(r) }));
    const scores = points.map((p) => p.score);
    const [lo, hi] = [Math.min(...scores), Math.max(...scores)];
    // Heavy tails: a log score axis (of score + 1) when no score is negative and the top
    // score is 10x the median or more.
    const median = (rowFor(rows, 50) || rows[rows.length - 1]).score;
    const logScale = lo >= 0 && hi >= 10 * Math.max(1, median);
    const f = (v) => (logScale ? Math.log10(v + 1) : v);
    const y = (v) => H - B - (f(hi) === f(lo) ? 0.5 : (f(v) - f(lo)) / (f(hi) - f(lo))) * (H - T - B);
    const x = (top) => L + (top - 1) / 99 * (W - L - R);
    const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img",
                           "aria-label": "score needed for each top percent" });
    const ticks = logScale
      ? [lo, ...Array.from({ length: Math.floor(Math.log10(hi)) }, (_, i) => 10 ** (i + 1))]
        .filter((t) => t < hi && y(t) - y(hi) >= 14).concat([hi])
      : [lo, (lo + hi) / 2, hi];
    for (const tick of ticks) {
      svg.append(s("line", { class: "axis", x1: L, y1: y(tick), x2: W - R, y2: y(tick) }),
                 s("text", { x: L - 6, y: y(tick) + 4, "text-anchor": "end" },
                   nf.format(Math.round(tick))));
    }
    svg.append(s("polyline", { class: "line",
                               points: points.map((p) => `${x(p.top)},${y(p.score)}`).join(" ") }));
    for (const mark of MARKS) {
      const row = rowFor(rows, mark);
      if (!row) continue;
      const score = threshold(row);
      svg.append(s("line", { class: "marker", x1: x(mark), y1: T, x2: x(mark), y2: H - B }),
                 s("circle", { class: "dot", cx: x(row.top_percent), cy: y(score), r: 3 }),
                 s("text", { class: "marker-label", x: x(mark) + 4,
                             y: Math.max(T + 10, y(score) - 6) },
                   `top ${mark}%: ${nf.format(score)}`));
    }
    svg.append(s("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }),
               s("text", { x: L, y: H - 12 }, "top 1%"),
               s("text", { x: W - R, y: H - 12, "text-anchor": "end" }, "top 100%"),
               s("text", { x: (L + W - R) / 2, y: H - 12, "text-anchor": "middle" },
                 logScale ? "score axis: log" : "score axis: linear"));
    target.replaceChildren(svg);
  }

  function distributionPage() {
    const board = body.dataset.board;
    const win = body.dataset.window;
    let answer = null;
    let logScale = true;
    function draw() {
      if (!answer) return;
      const rows = answer.top_percent || [];
      const marks = MARKS.map((top) => ({ top, row: rowFor(rows, top) }))
        .filter((m) => m.row).map((m) => ({ top: m.top, score: threshold(m.row) }));
      histogramChart($("#dist-histogram"), answer.histogram || [], marks, logScale);
      quantileChart($("#dist-quantiles"), rows);
      const counted = (answer.histogram || []).reduce((sum, b) => sum + b.players, 0);
      $("#dist-summary").textContent = `${answer.board} · ${answer.window} · ` +
        `${num(answer.total)} players now (thresholds are live) · histogram: batch as of ` +
        `${answer.as_of || "— (no batch yet)"}, ${nf.format(counted)} players`;
      const wanted = [1, 5, 10, 25, 50, 75, 90, 100];
      $("#dist-rows").replaceChildren(...wanted.map((top) => [top, rowFor(rows, top)])
        .filter(([, r]) => r)
        .map(([top, r]) => h("tr", {}, h("td", { class: "num" }, top + " %"),
                             h("td", { class: "num" }, num(threshold(r))),
                             h("td", { class: "num" }, "#" + num(r.players)))));
    }
    $("#dist-scale").addEventListener("click", () => {
      logScale = !logScale;
      $("#dist-scale").textContent = logScale ? "log" : "linear";
      draw();
    });
    poll(async () => {
      answer = await api(`${boardPath(board)}/percentiles?window=${enc(win)}`);
      draw();
    }, 5000);
  }

  // -- operations --------------------------------------------------------------------------

  function kv(target, pairs) {
    target.replaceChildren(...pairs.flatMap(([key, value]) => [h("dt", {}, key),
                                                                h("dd", {}, value)]));
  }

  function bytes(value) {
    return value >= 1e9 ? (value / 1e9).toFixed(2) + " GB" : value >= 1e6
      ? (value / 1e6).toFixed(1) + " MB" : (value / 1e3).toFixed(1) + " kB";
  }

  // The admin key: asked for once (the operations summary needs it), kept in this tab only.
  const ADMIN_KEY_ITEM = "leaderboard-admin-key";

  function opsPage() {
    const key = $("#admin-key");
    key.value = sessionStorage.getItem(ADMIN_KEY_ITEM) || "";
    const gate = $("#ops-gate");
    function ask(message) {
      gate.hidden = false;
      $("#ops-gate-note").textContent = message;
      if (document.activeElement !== $("#ops-key")) $("#ops-key").focus();
    }
    const summary = poll(async () => {
      const stored = sessionStorage.getItem(ADMIN_KEY_ITEM);
      if (!stored) {
        ask("The operations summary needs the admin key. It is kept in this tab only " +
            "(sessionStorage) and sent as the X-Admin-Key header.");
        return;
      }
      let ops;
      try {
        ops = await api("/console/api/ops", { headers: { Accept: "application/json",
                                                          "X-Admin-Key": stored } });
      } catch (error) {
        if (!(error instanceof ApiError) || (error.status !== 401 && error.status !== 403)) {
          throw error;
        }
        sessionStorage.removeItem(ADMIN_KEY_ITEM);
        ask(`${error.message}: enter the admin key again.`);
        return;
      }
      gate.hidden = true;
      const health = await fetch("/healthz", { headers: { Accept: "application/json" } })
        .then((r) => r.json());
      const b = ops.batch;
      kv($("#ops-batch"), b ? [
        ["version", b.version], ["as of", b.as_of], ["watermark", b.watermark],
        ["built", b.created_at + " (" + relative(b.created_at) + ")"],
        ["engine · mode", `${b.engine} · ${b.mode || "—"}`],
        ["duration", b.duration_seconds === null ? "— (not recorded)"
          : b.duration_seconds.toFixed(1) + " s"],
        ["new events", num(b.new_events)], ["events in total", num(b.events)],
        ["board-windows built", num(b.windows_built)], ["standings rows", num(b.standings_rows)],
      ] : [["problem", ops.batch_problem]]);
      const sp = ops.speed;
      kv($("#ops-speed"), sp ? [
        ["base version", sp.version || "— (none)"], ["watermark", sp.watermark || "—"],
        ["lag", `${num(sp.lag_files)} landed file(s) not yet folded` + (ops.invisible_files
          ? ` · ${num(ops.invisible_files)} holding accepted events on no live board (health)`
          : "")],
        ["board-windows", num(sp.board_windows)], ["keys", num(sp.keys)],
        ["memory", bytes(sp.memory_bytes)], ["banned players", num(sp.banned)],
        ["folded (writer: seq)", Object.entries(sp.folded).map(([w, q]) => `${w}: ${q}`)
          .join(", ") || "—"],
        ...(sp.open_day_cut_ahead ? [["open-day cut ahead of the clock",
          `${sp.open_day_cut_ahead}: every landing is stamped at it until then`]] : []),
      ] : [["problem", ops.speed_problem]]);
      const ok = health.status === "ok";
      $("#ops-health-status").replaceChildren(h("span", { class: ok ? "badge" : "badge bad" },
                                                ok ? "ok" : health.status || "unknown"));
      const problems = Object.entries(health.problems || {});
      $("#ops-health").replaceChildren(...(problems.length
        ? problems.map(([what, why]) => h("li", { class: "error" }, `${what}: ${why}`))
        : [h("li", { class: "muted" }, `no problems · serving version ` +
                                        `${health.serving_version || "—"} · now ${health.now}`)]));
      const q = ops.quarantine;
      $("#ops-quarantine-note").textContent =
        `(${num(q.rows)} rows in ${num(q.files)} files, ${q.days[0]} to ${q.days[q.days.length - 1]})`;
      const head = h("tr", {}, h("th", {}, "Reason"), h("th", { class: "num" }, "Rows"),
                     ...q.days.map((d) => h("th", { class: "num" }, d.slice(5))));
      const lines = q.reasons.length ? q.reasons.map((r) => h("tr", {},
        h("td", {}, r.reason), h("td", { class: "num" }, num(r.rows)),
        ...r.per_day.map((c) => h("td", { class: c ? "num" : "num muted" }, num(c)))))
        : [h("tr", {}, h("td", { colspan: q.days.length + 2, class: "muted" },
                          "Nothing quarantined in these days."))];
      $("#ops-quarantine").replaceChildren(h("thead", {}, head), h("tbody", {}, ...lines));
    }, 5000);
    $("#ops-unlock").addEventListener("submit", (event) => {
      event.preventDefault();
      const given = $("#ops-key").value.trim();
      if (!given) return;
      sessionStorage.setItem(ADMIN_KEY_ITEM, given);
      key.value = given;
      $("#ops-key").value = "";
      gate.hidden = true;
      summary.refresh();
    });

    // An admin request with the key typed above; a key the API took is kept for the tab
    // (a mistyped one is not: the summary keeps the key it has).
    async function adminApi(path, options) {
      const headers = { Accept: "application/json", "X-Admin-Key": key.value };
      if (options && options.body) headers["Content-Type"] = "application/json";
      const answer = await api(path, Object.assign({}, options || {}, { headers }));
      sessionStorage.setItem(ADMIN_KEY_ITEM, key.value);
      return answer;
    }
    reviewQuarantine(adminApi);
    irreversible("void", () => {
      const match = $("#void-match").value.trim();
      const player = $("#void-player").value.trim();
      return { text: `Void ${player ? player + "'s result in" : "every result of"} match ` +
                     `${match}? It counts nowhere from now on; this cannot be undone.`,
               match, player, reason: $("#void-reason").value };
    }, async (asked) => {
      const answer = await adminApi("/v1/admin/voids", { method: "POST",
        body: JSON.stringify({ match_id: asked.match, player_id: asked.player || null,
                               reason: asked.reason }) });
      const what = `${answer.match_id}${answer.player_id ? " / " + answer.player_id : ""}: `;
      const changed = `${num(answer.players.length)} player(s)' live standings changed`;
      const said = answer.earlier
        ? `already voided at ${answer.earlier.at} (reason: ${answer.earlier.reason || "none"}); ` +
          (answer.players.length ? `its unfinished application is done now: ${changed}`
                                 : "nothing changed")
        : `voided (${changed})`;
      return what + said + (answer.not_removed ? ". " + answer.not_removed.message : "");
    });
    irreversible("erase", () => {
      const player = $("#erase-player").value.trim();
      return { text: `Erase player ${player} everywhere (events, standings, profile, live ` +
                     "state)? Later events of the id are refused; this cannot be undone.",
               id: player };
    }, async (asked) => {
      const answer = await adminApi("/v1/admin/players/" + enc(asked.id),
                                    { method: "DELETE" });
      return `${answer.player_id}: ${answer.status} (${num(answer.lake.rows)} row(s) ` +
        "removed from the lake)";
    });
    $("#admin").addEventListener("submit", async (event) => {
      event.preventDefault();
      const action = event.submitter ? event.submitter.dataset.action : "bans";
      const result = $("#admin-result");
      const player = $("#admin-player").value.trim();
      try {
        const answer = await adminApi("/v1/admin/" + action, {
          method: "POST",
          body: JSON.stringify({ player_id: player, reason: $("#admin-reason").value }) });
        result.className = "up";
        result.textContent = `${answer.player_id}: ${answer.status} ` +
          `(${nf.format(answer.board_windows)} board-windows)`;
      } catch (error) {
        result.className = "error";
        result.textContent = error.message;
      }
    });
  }

  // An action that cannot be undone (void, erase): its form only arms a confirm step that
  // says what will happen; the confirm button sends it (for an erasure, once the id is
  // typed again). `describe` reads the form, `send` makes the request and says what it did.
  function irreversible(name, describe, send) {
    const panel = $(`#${name}-confirm`);
    const yes = $(`#${name}-yes`);
    const again = $(`#${name}-again`);
    const result = $(`#${name}-result`);
    let armed = null;
    function disarm() {
      armed = null;
      panel.hidden = true;
      if (again) again.value = "";
    }
    $("#" + name).addEventListener("submit", (event) => {
      event.preventDefault();
      armed = describe();
      $(`#${name}-confirm-text`).textContent = armed.text;
      panel.hidden = false;
      yes.disabled = Boolean(again);
      (again || yes).focus();
    });
    if (again) {
      again.addEventListener("input", () => {
        yes.disabled = !armed || again.value.trim() !== armed.id;
      });
    }
    $(`#${name}-no`).addEventListener("click", () => {
      disarm();
      result.className = "muted";
      result.textContent = "Cancelled: nothing was sent.";
    });
    yes.addEventListener("click", async () => {
      const asked = armed;
      disarm();
      if (!asked) return;
      result.className = "muted";
      result.textContent = "Working…";
      try {
        result.textContent = await send(asked);
        result.className = "up";
      } catch (error) {
        result.className = "error";
        result.textContent = error.message;
      }
    });
  }

  // Quarantine review: list rows by reason, release the ticked ones (admin key).
  function reviewQuarantine(adminApi) {
    const form = $("#review");
    const result = $("#review-result");
    const release = $("#review-release");
    async function list() {
      const reason = $("#review-reason").value;
      try {
        const page = await adminApi("/v1/admin/quarantine?limit=50" +
                                    (reason ? "&reason=" + enc(reason) : ""));
        // `board`: a direct score's board (a match event's row has none: "—").
        const head = h("tr", {}, ["", "id", "reason", "board", "player", "match", "points",
                                  "released", "detail"].map((t) => h("th", {}, t)));
        const lines = page.rows.map((r) => h("tr", {},
          h("td", {}, h("input", { type: "checkbox", "data-id": r.id, disabled: r.released || !!r.moved_to,
                                   "aria-label": "release " + r.id })),
          h("td", { class: "id" }, r.id), h("td", {}, r.reason),
          h("td", { class: r.board ? "board" : "board muted" }, r.board || "—"),
          h("td", {}, r.player_id || ""),
          h("td", {}, r.match_id || ""), h("td", { class: "num" }, r.points || ""),
          h("td", {}, r.released ? "yes" : r.moved_to ? "moved to " + r.moved_to : ""),
          h("td", { class: "muted" }, r.detail)));
        $("#review-rows").replaceChildren(h("thead", {}, head), h("tbody", {}, ...lines));
        release.disabled = !page.rows.some((r) => !r.released && !r.moved_to);
        result.className = "muted";
        result.textContent = page.rows.length
          ? `${num(page.count)} row(s)${page.next_cursor ? " (the first 50)" : ""}`
          : "No quarantined rows match.";
      } catch (error) {
        result.className = "error";
        result.textContent = error.message;
      }
    }
    form.addEventListener("submit", (event) => { event.preventDefault(); list(); });
    release.addEventListener("click", async () => {
      const ids = [...document.querySelectorAll("#review-rows input:checked")]
        .map((box) => box.dataset.id);
      if (!ids.length) {
        result.className = "error";
        result.textContent = "Tick the rows to release first.";
        return;
      }
      try {
        const answer = await adminApi("/v1/admin/quarantine/release", {
          method: "POST", body: JSON.stringify({ ids }) });
        await list();
        result.className = "up";
        result.textContent = `released ${num(answer.released)}: ` + answer.results.map((r) =>
          `${r.id} ${r.status}${r.reason ? " (" + r.reason + ")" : ""}`).join("; ");
      } catch (error) {
        result.className = "error";
        result.textContent = error.message;
      }
    });
  }

  const pages = { boards: boardsPage, board: boardPage, player: playerPage,
                  distribution: distributionPage, ops: opsPage };
  (pages[body.dataset.page] || (() => {}))();
})();
