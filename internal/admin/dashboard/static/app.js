// Sinew dashboard: polls the admin API (/api/v1/...) and renders it.
// No framework and no build step: plain DOM, with text always set through
// textContent so nothing the broker returns is ever parsed as HTML.
"use strict";

(() => {
  const params = new URLSearchParams(location.search);
  // How often to poll, in ms (?refresh=ms), bounded so a typo cannot flood the broker.
  const refreshMs = Math.min(60000, Math.max(250, Number(params.get("refresh")) || 2000));
  const historyMax = 90;        // samples kept per chart
  const requestTimeoutMs = 10000;
  const peekLimit = 20;         // messages per peek page
  // Dead letters listed per page (?dl_limit=n, 1 to 200, the API's bound).
  const dlLimit = Math.min(200, Math.max(1, Number(params.get("dl_limit")) || 50));

  const state = {
    prev: null,                 // {uptime, started, counters} of the last overview
    rates: { publish: [], deliver: [], ack: [] },
    depth: new Map(),           // queue key -> [depth samples]
    openQueues: new Set(),      // queue keys whose partitions are shown
    sessions: [], sessionsAt: 0,
    dlTopic: "", deadLetters: [], selected: new Set(), inspected: null,
    dlCursor: "", dlNext: "",   // the listed page's cursor ("" = first) and the next one's
    settings: null, settingsDirty: false,
    timer: 0, busy: false,
  };

  // ---- helpers ----
  const $ = (sel, root = document) => root.querySelector(sel);

  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "text") el.textContent = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (k.startsWith("data-")) el.setAttribute(k, String(v));
      else if (k in el) el[k] = v;
      else el.setAttribute(k, String(v));
    }
    for (const kid of kids.flat()) {
      if (kid === null || kid === undefined) continue;
      el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return el;
  }

  // parseJSON parses an API answer, keeping each "generation" as the decimal
  // string the broker sent: it is a random 64-bit number, which a JS number
  // would round. Inside a JSON string the key's quotes are escaped, so the
  // pattern cannot match text within a value.
  function parseJSON(text) {
    return JSON.parse(text.replace(/"generation"(\s*):(\s*)(\d+)/g, '"generation"$1:$2"$3"'));
  }

  // api calls the admin API and never throws for an HTTP status: it resolves
  // to {status, ok, data}; a network failure resolves to status 0.
  async function api(method, path, body) {
    const ctl = new AbortController();
    const t = setTimeout(() => ctl.abort(), requestTimeoutMs);
    try {
      const init = { method, cache: "no-store", signal: ctl.signal, headers: {} };
      if (body !== undefined) {
        init.headers["Content-Type"] = "application/json";
        init.body = JSON.stringify(body);
      }
      const res = await fetch(path, init);
      const text = await res.text();
      let data = null;
      if (text) {
        try { data = parseJSON(text); } catch { data = { error: text.trim() }; }
      }
      return { status: res.status, ok: res.ok, data };
    } catch (e) {
      return { status: 0, ok: false, data: { error: e.name === "AbortError" ? "timed out" : String(e.message || e) } };
    } finally {
      clearTimeout(t);
    }
  }

  function errText(r) {
    if (r.status === 0) return "broker unreachable: " + r.data.error;
    const msg = r.data && (r.data.error || r.data.message);
    return "HTTP " + r.status + (msg ? ": " + msg : "");
  }

  function setMsg(id, text, cls) {
    const el = document.getElementById(id);
    el.textContent = text || "";
    el.className = "msg" + (cls ? " " + cls : "");
  }

  const fmtInt = (n) => (n === undefined || n === null) ? "–" : Number(n).toLocaleString("en-US");
  function fmtBytes(n) {
    if (n === undefined || n === null) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0, v = Number(n);
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i === 0 ? v : v.toFixed(1)) + " " + units[i];
  }
  function fmtRate(r) {
    if (r === null || r === undefined) return "–";
    return r >= 100 ? Math.round(r).toLocaleString("en-US") : r.toFixed(1);
  }
  function fmtDuration(ms) {
    if (ms === null || ms === undefined) return "–";
    ms = Math.max(0, ms);
    const s = Math.floor(ms / 1000);
    if (s < 60) return (ms / 1000).toFixed(1) + " s";
    const m = Math.floor(s / 60), hh = Math.floor(m / 60);
    if (hh > 0) return hh + " h " + (m % 60) + " m";
    return m + " m " + (s % 60) + " s";
  }
  const fmtTime = (ms) => ms ? new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z") : "–";
  const queueName = (topic, group) => group ? topic + " / " + group : topic;
  const queueKey = (topic, group) => topic + "\u0000" + group;
  const qs = (group) => group ? "?group=" + encodeURIComponent(group) : "";

  function push(arr, v) {
    arr.push(v);
    if (arr.length > historyMax) arr.splice(0, arr.length - historyMax);
  }

  // spark draws samples into an <svg viewBox="0 0 120 28">.
  function spark(svg, samples) {
    const ns = "http://www.w3.org/2000/svg";
    svg.replaceChildren();
    const vals = samples.filter((v) => typeof v === "number");
    const max = Math.max(1, ...vals);
    // Spread the samples over the width; a new chart fills as it grows.
    const n = Math.max(2, samples.length);
    const pts = samples.map((v, i) => {
      const x = (120 * i) / (n - 1);
      const y = 27 - (26 * (v || 0)) / max;
      return x.toFixed(1) + "," + y.toFixed(1);
    });
    if (pts.length === 0) return;
    if (pts.length === 1) pts.push("120," + pts[0].split(",")[1]);
    const area = document.createElementNS(ns, "polygon");
    const first = pts[0].split(",")[0], last = pts[pts.length - 1].split(",")[0];
    area.setAttribute("points", first + ",28 " + pts.join(" ") + " " + last + ",28");
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", pts.join(" "));
    const title = document.createElementNS(ns, "title");
    title.textContent = "max " + max.toLocaleString("en-US") + " over the last " + samples.length + " samples";
    svg.append(title, area, line);
  }

  function newSpark() {
    const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    svg.setAttribute("class", "spark");
    svg.setAttribute("viewBox", "0 0 120 28");
    svg.setAttribute("preserveAspectRatio", "none");
    return svg;
  }

  // ---- overview and health ----
  async function loadOverview() {
    const [r, ready] = await Promise.all([api("GET", "/api/v1/overview"), fetchReady()]);
    const health = $("#health");
    health.textContent = ready.text;
    health.className = "badge " + (ready.ok ? "ready" : "notready");
    health.title = ready.detail;
    if (!r.ok) {
      setMsg("overview-msg", "overview: " + errText(r), "error");
      return r.status !== 0;
    }
    const o = r.data;
    setMsg("overview-msg", o.draining ? "The broker is draining: it takes no new work and will stop." : "", o.draining ? "error" : "");
    if (o.draining) {
      health.textContent = "draining";
      health.className = "badge draining";
    }
    $("#ident").textContent = [o.version, "owner " + (o.owner_id || "?"), "generation " + String(o.generation),
      "up " + fmtDuration(o.uptime_ms)].join(" · ");
    const c = o.counters || {};
    const cur = { uptime: o.uptime_ms, started: o.started_at_ms, generation: o.generation, counters: c };
    const p = state.prev;
    // Rates come from two reads of monotonic counters, over the broker's own
    // uptime clock; a restart (new start time) begins the series again.
    let rates = null;
    if (p && p.started === cur.started && p.generation === cur.generation && cur.uptime > p.uptime) {
      const dt = (cur.uptime - p.uptime) / 1000;
      const rate = (k) => (typeof c[k] === "number" && typeof p.counters[k] === "number" && c[k] >= p.counters[k]) ? (c[k] - p.counters[k]) / dt : null;
      rates = { publish: rate("publishes"), deliver: rate("deliveries"), ack: rate("acks") };
    }
    state.prev = cur;
    for (const k of ["publish", "deliver", "ack"]) {
      const card = document.getElementById("rate-" + k);
      if (rates) push(state.rates[k], rates[k]);
      $(".value", card).textContent = rates ? fmtRate(rates[k]) : "–";
      // The highest rate the chart holds, for a quick look (and for tests).
      card.dataset.peak = String(Math.max(0, ...state.rates[k].filter((v) => typeof v === "number")));
      spark($("svg", card), state.rates[k]);
    }
    const t = o.totals || {};
    const dl = $("#totals dl");
    dl.replaceChildren();
    const rows = [
      ["queues", fmtInt(o.queues)], ["partitions", fmtInt(o.partitions)],
      ["ready", fmtInt(t.ready)], ["inflight", fmtInt(t.inflight)],
      ["dead-lettering", fmtInt(t.dead_lettering)], ["on disk", fmtBytes(t.bytes_on_disk)],
      ["connections", fmtInt(t.connections_open)],
      ["sessions", fmtInt(t.sessions_attached) + " attached, " + fmtInt(t.sessions_dormant) + " dormant"],
      ["dead-lettered", fmtInt(c.dead_lettered)],
    ];
    for (const [k, v] of rows) dl.append(h("dt", { text: k }), h("dd", { text: v, "data-total": k }));
    // Every counter the broker reports (resume, grace, reconcile and
    // late-settle outcomes among them), and dead letters by reason.
    const all = $("#counters dl");
    all.replaceChildren();
    const byReason = o.dead_lettered_by_reason || {};
    const entries = Object.entries(c).concat(Object.entries(byReason).map(([k, v]) => ["dead_lettered{" + k + "}", v]));
    entries.sort((a, b) => a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0);
    for (const [k, v] of entries) all.append(h("dt", { text: k }), h("dd", { text: fmtInt(v), "data-counter": k }));
    return true;
  }

  async function fetchReady() {
    try {
      const res = await fetch("/readyz", { cache: "no-store" });
      const text = (await res.text()).trim();
      return { ok: res.ok, text: res.ok ? "ready" : "not ready", detail: text };
    } catch (e) {
      return { ok: false, text: "unreachable", detail: String(e.message || e) };
    }
  }

  // ---- queues ----
  async function loadQueues() {
    const r = await api("GET", "/api/v1/queues");
    const tbody = $("#queues tbody");
    if (!r.ok) {
      setMsg("queues-msg", "queues: " + errText(r), "error");
      return r.status !== 0;
    }
    const queues = (r.data && r.data.queues) || [];
    setMsg("queues-msg", "");
    const seen = new Set();
    tbody.replaceChildren();
    for (const q of queues) {
      const key = queueKey(q.topic, q.group);
      seen.add(key);
      const depth = (q.ready || 0) + (q.delayed || 0) + (q.inflight || 0);
      if (!state.depth.has(key)) state.depth.set(key, []);
      const hist = state.depth.get(key);
      push(hist, depth);
      const svg = newSpark();
      spark(svg, hist);
      const reasons = (q.partitions || []).filter((p) => p.state && p.state !== "ok")
        .map((p) => "partition " + p.partition + ": " + p.state + (p.reason ? " (" + p.reason + ")" : ""));
      tbody.append(h("tr", { class: "queue-row", "data-topic": q.topic, "data-group": q.group || "" },
        h("td", {}, partitionsDetails(key, q), q.dead_letter_queue ? h("span", { class: "badge", text: "dead-letter queue" }) : null,
          q.replication && q.replication.under_replicated ? h("span", { class: "badge quarantined under-replicated",
            text: "replicas " + q.replication.replicas + " of " + q.replication.factor,
            title: "fewer replicas than the replication factor, or a replica move under way: the cluster is adding or moving one" }) : null),
        h("td", {}, h("span", { class: "badge " + (q.state || "ok"), text: q.state || "ok", title: reasons.join("\n") })),
        h("td", { class: "num", text: fmtInt(q.partition_count ?? (q.partitions || []).length) }),
        h("td", { class: "num ready", text: fmtInt(q.ready) }),
        h("td", { class: "num", text: fmtInt(q.delayed) }),
        h("td", { class: "num", text: fmtInt(q.inflight) }),
        h("td", { class: "num", text: fmtInt(q.dead_lettering) }),
        h("td", { class: "num", text: fmtInt(q.consumers) }),
        h("td", { class: "num", text: fmtBytes(q.bytes_on_disk) }),
        h("td", { class: "num depth", "data-depth": depth, text: fmtInt(depth) }),
        h("td", {}, svg)));
    }
    for (const k of [...state.depth.keys()]) if (!seen.has(k)) state.depth.delete(k);
    if (queues.length === 0) tbody.append(h("tr", { class: "empty" }, h("td", { colSpan: 11, text: "no queues" })));
    return true;
  }

  // partitionsDetails is the queue's name, opening onto one line per
  // partition; which queues are open survives the next poll's re-render.
  function partitionsDetails(key, q) {
    const lines = (q.partitions || []).map((p) => h("li", { class: "partition", "data-partition": p.partition },
      "partition " + p.partition + ": ",
      h("span", { class: "badge " + (p.state || "ok"), text: p.state || "ok" }),
      (p.reason ? " " + p.reason : "") +
      " · ready " + fmtInt(p.ready) + " · delayed " + fmtInt(p.delayed) + " · inflight " + fmtInt(p.inflight) +
      " · dead-lettering " + fmtInt(p.dead_lettering) + " · settled below " + fmtInt(p.settled_frontier) +
      " of " + fmtInt(p.next_offset) + " · " + fmtBytes(p.bytes_on_disk) +
      (p.replicas ? " · owner " + (p.owner || "none (election)") + " · term " + fmtInt(p.term || 0) +
        " · replicas " + p.replicas.join(", ") : "") + " ",
      h("button", { type: "button", class: "peek", text: "Peek", title: "show its unsettled messages; settles nothing",
        onclick: () => peek(q.topic, q.group || "", p.partition, 0) })));
    const d = h("details", { open: state.openQueues.has(key),
      ontoggle: (e) => { e.target.open ? state.openQueues.add(key) : state.openQueues.delete(key); } },
      h("summary", {}, h("strong", { text: queueName(q.topic, q.group) })),
      h("ul", { class: "partitions" }, lines));
    return d;
  }

  // peek shows a page of a partition's unsettled messages with their key,
  // headers and body. The API reads the log: nothing is leased or settled.
  async function peek(topic, group, partition, from) {
    const box = $("#peek");
    const path = "/api/v1/queues/" + encodeURIComponent(topic) + "/messages?partition=" + partition +
      "&from=" + from + "&limit=" + peekLimit + (group ? "&group=" + encodeURIComponent(group) : "");
    const r = await api("GET", path);
    const title = h("div", { class: "toolbar" },
      h("strong", { text: queueName(topic, group) + ", partition " + partition + ", from offset " + from }),
      h("button", { type: "button", text: "Close", onclick: () => { box.hidden = true; box.replaceChildren(); } }));
    if (!r.ok) {
      box.replaceChildren(title, h("p", { class: "msg error", text: "messages: " + errText(r) }));
      box.hidden = false;
      return;
    }
    const d = r.data || {};
    const rows = (d.messages || []).map((m) => h("tr", { class: "peek-row", "data-offset": m.offset },
      h("td", { class: "num", text: String(m.offset) }),
      h("td", {}, h("span", { class: "badge", text: m.state })),
      h("td", { class: "num", text: fmtInt(m.attempt) }),
      h("td", { text: fmtTime(m.published_at_ms) }),
      h("td", { text: typeof m.key_text === "string" ? m.key_text : (m.key_b64 ? "base64: " + m.key_b64 : "–") }),
      h("td", { text: (m.headers || []).map((x) => x.key + "=" + (typeof x.value === "string" ? x.value : "base64:" + (x.value_b64 || ""))).join(", ") || "–" }),
      h("td", { class: "preview", text: m.error ? "unreadable: " + m.error : preview(m), title: preview(m) })));
    const more = d.next < d.next_offset ? [h("button", { type: "button", text: "More", onclick: () => peek(topic, group, partition, d.next) })] : [];
    box.replaceChildren(title,
      h("table", {},
        h("thead", {}, h("tr", {}, ["offset", "state", "attempt", "published", "key", "headers", "body"].map((x) => h("th", { text: x })))),
        h("tbody", {}, rows.length ? rows : h("tr", { class: "empty" }, h("td", { colSpan: 7, text: "no unsettled messages from this offset" })))),
      ...more);
    box.hidden = false;
  }

  // ---- cohorts ----
  // The section shows only while the broker knows a cohort.
  async function loadCohorts() {
    const r = await api("GET", "/api/v1/cohorts");
    if (!r.ok) {
      setMsg("cohorts-msg", "cohorts: " + errText(r), "error");
      return r.status !== 0;
    }
    setMsg("cohorts-msg", "");
    const cohorts = (r.data && r.data.cohorts) || [];
    $("#cohorts").hidden = cohorts.length === 0;
    const tbody = $("#cohorts tbody");
    tbody.replaceChildren();
    for (const c of cohorts) {
      const lines = (c.partitions || []).map((p) => h("li", { class: "cohort-partition", "data-partition": p.partition,
        "data-member": p.member || "", "data-paused": String(!!p.paused) },
        "partition " + p.partition + ": " + (p.held ? (p.member ? "member " + p.member : "held for nobody") : "not held by the cohort") +
        " · epoch " + fmtInt(p.epoch) + " · lag " + fmtInt(p.lag) +
        (p.planned && p.planned !== p.member ? " · planned for " + p.planned : "") +
        (p.owned ? "" : " · owner " + (p.owner || "unknown")) + " ",
        p.paused ? h("span", { class: "badge dormant", text: "paused" }) : null));
      tbody.append(h("tr", { class: "cohort-row", "data-topic": c.topic, "data-group": c.group || "", "data-cohort": c.cohort },
        h("td", {}, h("strong", { text: c.cohort })),
        h("td", { text: queueName(c.topic, c.group) }),
        h("td", { text: c.planner }),
        h("td", { class: "num", text: String(c.generation) }),
        h("td", { class: "members", text: (c.members || []).join(", ") || "–" }),
        h("td", { class: "num paused", text: fmtInt(c.paused) + " of " + fmtInt((c.partitions || []).length) }),
        h("td", { class: "num lag", "data-lag": c.lag, text: fmtInt(c.lag) }),
        h("td", {}, h("ul", { class: "partitions" }, lines))));
    }
    return true;
  }

  // ---- nodes ----
  // A node that runs alone (cluster false) hides the section.
  async function loadNodes() {
    const r = await api("GET", "/api/v1/nodes");
    if (!r.ok) {
      setMsg("nodes-msg", "nodes: " + errText(r), "error");
      return r.status !== 0;
    }
    setMsg("nodes-msg", "");
    const v = r.data || {};
    $("#nodes").hidden = !v.cluster;
    if (!v.cluster) return true;
    $("#nodes-fenced").hidden = !v.fenced;
    const c = v.controller;
    // A node's place in the controller group: leader, voter, learner,
    // left, or "–" when the committed table does not hold it.
    const role = (id) => {
      if (!c) return "–";
      if (id === c.leader) return "leader";
      if ((c.voters || []).includes(id)) return "voter";
      if ((c.learners || []).includes(id)) return "learner";
      if ((c.nodes || []).some((x) => x.id === id && x.left)) return "left";
      return "–";
    };
    $("#nodes-controller").textContent = !c ? "" : c.error ? "this node's controller replica failed: " + c.error
      : c.leader ? "controller: term " + c.term + ", " + (c.voters || []).length + " voters, " +
        (c.learners || []).length + " learners, table at index " + c.applied
      : "controller: no leader known";
    const tbody = $("#nodes tbody");
    tbody.replaceChildren();
    for (const n of [v.self, ...(v.nodes || [])]) {
      if (!n) continue;
      const r = role(n.id);
      tbody.append(h("tr", { class: "node-row", "data-node-id": n.id, "data-state": n.state, "data-controller": r },
        h("td", { text: n.id }),
        h("td", {}, h("span", { class: "badge " + n.state, text: n.state })),
        h("td", { text: n.gossip_addr || "–" }),
        h("td", { text: n.client_addr || "–" }),
        h("td", { text: r })));
    }
    return true;
  }

  // ---- moves ----
  // Operator moves of a queue's replicas: each partition's step (with the
  // target's lag where this node owns the partition), and a cancel button
  // while a move has not cut over. A node that runs alone hides the section.
  async function loadMoves() {
    const r = await api("GET", "/api/v1/moves");
    if (!r.ok) {
      setMsg("moves-msg", "moves: " + errText(r), "error");
      return r.status !== 0;
    }
    const v = r.data || {};
    $("#moves").hidden = !v.cluster;
    if (!v.cluster) return true;
    const moves = v.moves || [];
    $("#moves-empty").hidden = moves.length > 0;
    const pinned = (v.pinned || []).map((q) => queueName(q.topic, q.group));
    $("#moves-pinned").hidden = pinned.length === 0;
    $("#moves-pinned").textContent = "Pinned (the rebalancer leaves them; sinew admin partition unpin hands one back): " + pinned.join(", ");
    const tbody = $("#moves tbody");
    tbody.replaceChildren();
    for (const m of moves) {
      const steps = m.ended_at ? "–" : !(m.partitions || []).length ? "known to the queue's replicas"
        : m.partitions.map((p) => p.partition + ": " + p.step + (p.lag != null ? " (lag " + fmtInt(p.lag) + ")" : "")).join(", ");
      const cancel = m.cancellable ? h("button", { class: "move-cancel", "data-move-id": m.id, text: "cancel" }) : "";
      if (cancel) {
        cancel.addEventListener("click", async () => {
          const c = await api("POST", "/api/v1/moves/" + m.id + "/cancel");
          setMsg("moves-msg", c.ok ? "move " + m.id + " cancelled" : "cancel: " + errText(c), c.ok ? "" : "error");
          loadMoves();
        });
      }
      tbody.append(h("tr", { class: "move-row", "data-move-id": m.id, "data-state": m.state },
        h("td", { class: "num", text: String(m.id) }),
        h("td", { text: queueName(m.topic, m.group) }),
        h("td", { text: m.from_addr || m.from }),
        h("td", { text: m.to_addr || m.to }),
        h("td", { title: m.reason || "" }, h("span", { class: "badge " + m.state, text: m.state + (m.reason ? ": " + m.reason : "") })),
        h("td", { text: steps }),
        h("td", {}, cancel)));
    }
    return true;
  }

  // ---- sessions ----
  async function loadSessions() {
    const r = await api("GET", "/api/v1/sessions");
    if (!r.ok) {
      setMsg("sessions-msg", "sessions: " + errText(r), "error");
      return r.status !== 0;
    }
    setMsg("sessions-msg", "");
    state.sessions = (r.data && r.data.sessions) || [];
    state.sessionsAt = performance.now();
    const tbody = $("#sessions tbody");
    tbody.replaceChildren();
    for (const s of state.sessions) {
      const subs = (s.subscriptions || []).map((x) => queueName(x.topic, x.group) + " (" + fmtInt(x.inflight) + " inflight, prefetch " + fmtInt(x.prefetch) + ")");
      tbody.append(h("tr", { class: "session-row", "data-client-id": s.client_id, "data-state": s.state },
        h("td", { text: s.client_id }),
        h("td", {}, h("span", { class: "badge " + s.state, text: s.state })),
        h("td", { class: "num", text: s.conn_id ? String(s.conn_id) : "–" }),
        h("td", { class: "num grace", "data-grace-left-ms": s.grace_left_ms ?? "" }),
        h("td", { class: "num", text: fmtInt(s.inflight) }),
        h("td", { class: "num", text: fmtInt(s.pending) }),
        h("td", { text: subs.join("; ") || "–" })));
    }
    if (state.sessions.length === 0) tbody.append(h("tr", { class: "empty" }, h("td", { colSpan: 7, text: "no sessions" })));
    tickGrace();
    return true;
  }

  // tickGrace counts the grace of dormant sessions down between polls.
  function tickGrace() {
    const elapsed = performance.now() - state.sessionsAt;
    for (const td of document.querySelectorAll("#sessions td.grace")) {
      const left = td.dataset.graceLeftMs;
      td.textContent = left === "" ? "–" : fmtDuration(Number(left) - elapsed);
    }
  }

  // ---- dead letters ----
  const dlKey = (d) => d.partition + ":" + d.offset;

  function preview(m) {
    if (!m) return "–";
    if (typeof m.body_text === "string") return m.body_text + (m.body_truncated ? "…" : "");
    return "binary, " + fmtInt(m.body_bytes) + " bytes";
  }

  async function loadDeadLetters() {
    const r = await api("GET", "/api/v1/deadletters?limit=" + dlLimit + (state.dlCursor ? "&cursor=" + encodeURIComponent(state.dlCursor) : ""));
    if (r.status === 400 && state.dlCursor) {
      // The page's cursor is no longer valid (say, after a purge): start over.
      state.dlCursor = "";
      return loadDeadLetters();
    }
    if (!r.ok) {
      setMsg("deadletters-msg", "dead letters: " + errText(r), "error");
      return r.status !== 0;
    }
    const d = r.data || {};
    state.dlTopic = d.topic || "";
    state.deadLetters = d.dead_letters || [];
    $("#dlq-topic").textContent = state.dlTopic ? "(" + state.dlTopic + ")" : "";
    const present = new Set(state.deadLetters.map(dlKey));
    for (const k of [...state.selected]) if (!present.has(k)) state.selected.delete(k);
    state.dlNext = d.next_cursor || "";
    $("#dl-next").disabled = !state.dlNext;
    $("#dl-first").disabled = !state.dlCursor;
    setMsg("deadletters-msg", (state.dlCursor ? "A later page. " : "") +
      (state.dlNext ? "Showing " + state.deadLetters.length + "; more follow." : ""));
    const tbody = $("#deadletters tbody");
    tbody.replaceChildren();
    for (const dl of state.deadLetters) {
      const key = dlKey(dl);
      tbody.append(h("tr", { class: "dl-row", "data-partition": dl.partition, "data-offset": dl.offset, "data-source-topic": dl.source_topic || "" },
        h("td", {}, h("input", { type: "checkbox", class: "dl-select", checked: state.selected.has(key),
          onchange: (e) => { e.target.checked ? state.selected.add(key) : state.selected.delete(key); syncDLButtons(); } })),
        h("td", { class: "num", text: String(dl.partition) }),
        h("td", { class: "num", text: String(dl.offset) }),
        h("td", {}, h("span", { class: "badge failed", text: dl.reason || "?" })),
        h("td", { text: dl.source_topic ? queueName(dl.source_topic, dl.source_group) + " #" + dl.source_partition + "@" + dl.source_offset : "–" }),
        h("td", { class: "num", text: fmtInt(dl.retries) }),
        h("td", { text: fmtTime(dl.dead_lettered_at_ms) }),
        h("td", { class: "preview", text: preview(dl.message), title: preview(dl.message) }),
        h("td", {},
          h("button", { type: "button", class: "dl-inspect", text: "Inspect", onclick: () => inspect(key) }), " ",
          h("button", { type: "button", class: "dl-replay", text: "Replay", onclick: () => replay([dl]) }))));
    }
    if (state.deadLetters.length === 0) tbody.append(h("tr", { class: "empty" }, h("td", { colSpan: 9, text: "no dead letters" })));
    syncDLButtons();
    if (state.inspected && !present.has(state.inspected)) inspect(null);
    return true;
  }

  function syncDLButtons() {
    $("#dl-replay-selected").disabled = state.selected.size === 0;
    $("#dl-replay-selected").textContent = "Replay selected (" + state.selected.size + ")";
    $("#dl-all").checked = state.deadLetters.length > 0 && state.selected.size === state.deadLetters.length;
  }

  function inspect(key) {
    state.inspected = key;
    const box = $("#dl-inspect");
    const dl = key && state.deadLetters.find((d) => dlKey(d) === key);
    if (!dl) { box.hidden = true; box.replaceChildren(); return; }
    const m = dl.message || {};
    const headers = (m.headers || []).map((x) => h("tr", {}, h("td", { text: x.key }),
      h("td", { text: typeof x.value === "string" ? x.value : "base64: " + (x.value_b64 || "") })));
    box.replaceChildren(
      h("div", { class: "toolbar" }, h("strong", { text: "Dead letter " + key + " of " + state.dlTopic }),
        h("button", { type: "button", text: "Close", onclick: () => inspect(null) })),
      h("table", {}, h("tbody", {},
        h("tr", {}, h("th", { text: "reason" }), h("td", { text: dl.reason || "?" })),
        h("tr", {}, h("th", { text: "source" }), h("td", { text: dl.source_topic ? queueName(dl.source_topic, dl.source_group) + ", partition " + dl.source_partition + ", offset " + dl.source_offset : "–" })),
        h("tr", {}, h("th", { text: "retries" }), h("td", { text: fmtInt(dl.retries) })),
        h("tr", {}, h("th", { text: "published" }), h("td", { text: fmtTime(m.published_at_ms) })),
        h("tr", {}, h("th", { text: "content type" }), h("td", { text: m.content_type || "–" })),
        h("tr", {}, h("th", { text: "key" }), h("td", { text: typeof m.key_text === "string" ? m.key_text : (m.key_b64 ? "base64: " + m.key_b64 : "–") })),
        h("tr", {}, h("th", { text: "body" }), h("td", { text: fmtInt(m.body_bytes) + " bytes" + (m.body_truncated ? " (preview truncated)" : "") })))),
      h("h3", { text: "Headers" }),
      headers.length ? h("table", {}, h("tbody", {}, headers)) : h("p", { class: "muted", text: "none" }),
      h("h3", { text: typeof m.body_text === "string" ? "Body" : "Body (base64: not valid UTF-8)" }),
      h("pre", { class: "dl-body", text: typeof m.body_text === "string" ? m.body_text : (m.body_b64 || "") }));
    box.hidden = false;
  }

  async function replay(items) {
    if (items.length === 0) return;
    const keep = $("#dl-keep").checked;
    setMsg("dl-result", "replaying " + items.length + "…");
    const r = await api("POST", "/api/v1/deadletters/replay", {
      topic: state.dlTopic || undefined, keep,
      items: items.map((d) => ({ partition: d.partition, offset: d.offset })),
    });
    if (!r.ok) {
      setMsg("dl-result", "replay: " + errText(r), "error");
      return;
    }
    const results = (r.data && r.data.results) || [];
    const good = results.filter((x) => x.status === "replayed");
    const bad = results.filter((x) => x.status !== "replayed");
    const parts = good.map((x) => x.partition + ":" + x.offset + " → " + queueName(x.target_topic, x.target_group) +
      " #" + x.target_partition + "@" + x.target_offset + (x.removed ? "" : " (copy kept)"));
    const fails = bad.map((x) => x.partition + ":" + x.offset + " " + x.status + (x.error ? ": " + x.error : ""));
    setMsg("dl-result", "Replayed " + good.length + (parts.length ? ": " + parts.join(", ") : "") +
      (fails.length ? ". Not replayed: " + fails.join(", ") : ""), fails.length ? "error" : "good");
    for (const d of items) state.selected.delete(dlKey(d));
    await Promise.all([loadDeadLetters(), loadQueues()]);
  }

  // ---- settings ----
  function renderSettings(doc, note) {
    state.settings = doc;
    state.settingsDirty = false;
    $("#settings-version").textContent = "(version " + doc.version + ")";
    const box = $("#settings-fields");
    box.replaceChildren();
    const keys = doc.runtime_keys && doc.runtime_keys.length ? doc.runtime_keys : Object.keys(doc.values || {}).map((k) => ({ key: k }));
    for (const k of keys) {
      const v = (doc.values || {})[k.key];
      const input = h("input", { type: "number", name: k.key, step: 1, value: v ?? "", "data-key": k.key,
        min: k.min ?? undefined, max: k.max ?? undefined, required: true,
        oninput: (e) => { e.target.classList.toggle("changed", e.target.value !== String(v)); state.settingsDirty = true; } });
      box.append(h("div", { class: "setting" },
        h("label", { text: k.key }), input,
        h("span", { class: "muted", text: (k.description || "") + (k.min !== undefined ? " [" + k.min + " … " + k.max + "]" : "") })));
    }
    if (note) setMsg("settings-msg", note.text, note.cls);
  }

  async function loadSettings(force) {
    if (state.settingsDirty && !force) return true;
    const r = await api("GET", "/api/v1/settings");
    if (!r.ok) {
      setMsg("settings-msg", "settings: " + errText(r), "error");
      return r.status !== 0;
    }
    if (force || !state.settings || state.settings.version !== r.data.version) renderSettings(r.data);
    return true;
  }

  async function saveSettings(ev) {
    ev.preventDefault();
    if (!state.settings) return;
    const values = {};
    for (const input of document.querySelectorAll("#settings-fields input")) {
      const key = input.dataset.key;
      if (input.value.trim() === "") { setMsg("settings-msg", key + ": a value is required", "error"); return; }
      const n = Number(input.value);
      if (!Number.isInteger(n)) { setMsg("settings-msg", key + ": " + input.value + " is not an integer", "error"); return; }
      if (n !== state.settings.values[key]) values[key] = n;
    }
    if (Object.keys(values).length === 0) { setMsg("settings-msg", "Nothing changed."); return; }
    const based = state.settings.version;
    setMsg("settings-msg", "saving…");
    const r = await api("PUT", "/api/v1/settings", { version: based, values });
    if (r.ok) {
      renderSettings(r.data, { text: "Saved: version " + r.data.version + ".", cls: "good" });
      return;
    }
    if (r.status === 409) {
      // Someone else changed the settings since this form loaded: show what
      // is in force now and ask for the change again, rather than overwrite.
      const cur = { version: r.data.version, values: r.data.values, runtime_keys: state.settings.runtime_keys };
      renderSettings(cur);
      const msg = $("#settings-msg");
      msg.className = "msg";
      msg.replaceChildren(h("span", { class: "conflict", id: "settings-conflict",
        text: "Not saved: the settings were changed elsewhere (this form had version " + based + ", the broker is at version " +
          r.data.version + "). The form now shows the values in force; make your change again and save." }));
      return;
    }
    setMsg("settings-msg", "Not saved: " + errText(r), "error");
  }

  // ---- refresh loop ----
  async function refresh() {
    if (state.busy) return;
    state.busy = true;
    try {
      const results = await Promise.all([loadOverview(), loadQueues(), loadCohorts(), loadNodes(), loadMoves(), loadSessions(), loadDeadLetters(), loadSettings(false)]);
      const banner = $("#banner");
      if (results.some((ok) => !ok)) {
        banner.textContent = "The broker's admin API is unreachable; showing the last data received.";
        banner.hidden = false;
      } else {
        banner.hidden = true;
      }
      $("#refreshed").textContent = "updated " + new Date().toLocaleTimeString("en-GB");
      document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
    } finally {
      state.busy = false;
    }
  }

  function schedule() {
    clearInterval(state.timer);
    if ($("#autorefresh").checked) state.timer = setInterval(refresh, refreshMs);
  }

  function start() {
    $("#refresh-s").textContent = String(refreshMs / 1000);
    $("#autorefresh").addEventListener("change", schedule);
    $("#settings-form").addEventListener("submit", saveSettings);
    $("#settings-reset").addEventListener("click", () => { state.settingsDirty = false; setMsg("settings-msg", ""); loadSettings(true); });
    $("#dl-replay-selected").addEventListener("click", () => replay(state.deadLetters.filter((d) => state.selected.has(dlKey(d)))));
    $("#dl-next").addEventListener("click", () => { state.dlCursor = state.dlNext; state.selected.clear(); loadDeadLetters(); });
    $("#dl-first").addEventListener("click", () => { state.dlCursor = ""; state.selected.clear(); loadDeadLetters(); });
    $("#dl-all").addEventListener("change", (e) => {
      state.selected = new Set(e.target.checked ? state.deadLetters.map(dlKey) : []);
      for (const cb of document.querySelectorAll("#deadletters .dl-select")) cb.checked = e.target.checked;
      syncDLButtons();
    });
    setInterval(tickGrace, 250);
    refresh();
    schedule();
  }

  start();
})();
