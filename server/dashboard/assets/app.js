// sluice dashboard: plain browser JavaScript, no dependencies, no build step.
// It speaks only to the service's JSON API on the same origin.
"use strict";

(() => {
  const MAX_RESULTS = 50; // per card; older results scroll away
  const BURST = 10;
  const POLL_MS = 2000;
  const TOKEN_STORE = "sluice.adminToken";
  const KEY_STORE = "sluice.key";
  const SVG_NS = "http://www.w3.org/2000/svg";
  const CHART_W = 300;
  const CHART_H = 90;

  // ---- pure helpers (exported on window.sluiceDashboard for tests) ----

  // formatDuration renders milliseconds for people: "350 ms", "4.2 s",
  // "1 min 5 s", "2 h 3 min".
  function formatDuration(ms) {
    ms = Number(ms);
    if (!Number.isFinite(ms) || ms <= 0) return "0 ms";
    if (ms < 1000) return Math.ceil(ms) + " ms";
    if (ms < 10000) return (Math.ceil(ms / 100) / 10).toFixed(1) + " s";
    let s = Math.ceil(ms / 1000);
    if (s < 60) return s + " s";
    let m = Math.floor(s / 60);
    s %= 60;
    if (m < 60) return s ? `${m} min ${s} s` : `${m} min`;
    const h = Math.floor(m / 60);
    m %= 60;
    if (h < 48) return m ? `${h} h ${m} min` : `${h} h`;
    return Math.round(h / 24) + " days";
  }

  // formatPeriod names a policy period: "second", "minute", "10 s".
  function formatPeriod(ms) {
    switch (Number(ms)) {
      case 1000: return "second";
      case 60000: return "minute";
      case 3600000: return "hour";
      case 86400000: return "day";
    }
    return formatDuration(ms);
  }

  const WINDOWED = new Set(["fixed_window", "sliding_window_log", "sliding_window_counter"]);

  // capacity is the most units a fresh key admits at once: the burst for
  // the bucket algorithms and GCRA, the rate for the window algorithms.
  // inFlight reports an in-flight policy: it bounds requests in progress,
  // acquired and released through the JSON API, so its card shows the
  // slots held rather than a playground.
  function inFlight(p) {
    return p.kind === "in_flight";
  }

  function capacity(p) {
    if (inFlight(p)) return Number(p.max) || 0;
    const rate = Number(p.rate) || 0;
    const burst = Number(p.burst) || 0;
    if (!burst || WINDOWED.has(p.algorithm)) return rate;
    return burst;
  }

  // describeLimit prefers the server's own wording of the limit and builds
  // one from rate, period and burst otherwise.
  function describeLimit(p) {
    let text;
    if (typeof p.limit === "string" && p.limit) {
      // The algorithm has its own badge; do not repeat it ("fixed_window 5/min").
      text = p.algorithm && p.limit.startsWith(p.algorithm + " ") ? p.limit.slice(p.algorithm.length + 1) : p.limit;
    } else {
      text = `${p.rate} per ${formatPeriod(p.period_ms)}`;
      const c = capacity(p);
      if (c && c !== Number(p.rate)) text += `, burst ${c}`;
    }
    return text;
  }

  // niceMax rounds a chart's top up to 1, 2 or 5 × 10^k so the scale does not
  // jitter with every new request.
  function niceMax(n) {
    if (!(n > 0)) return 1;
    const mag = Math.pow(10, Math.floor(Math.log10(n)));
    for (const f of [1, 2, 5, 10]) if (n <= f * mag) return f * mag;
    return 10 * mag;
  }

  // chartBars lays out stacked bars (allowed below, denied above) in a
  // CHART_W × CHART_H box; one bar per bucket, oldest on the left.
  function chartBars(allowed, denied, width, height) {
    const n = Math.max(allowed.length, denied.length, 1);
    const totals = [];
    for (let i = 0; i < n; i++) totals.push((allowed[i] || 0) + (denied[i] || 0));
    const top = niceMax(Math.max(0, ...totals));
    const slot = width / n;
    const gap = slot > 3 ? Math.min(1, slot / 4) : 0;
    const bars = [];
    for (let i = 0; i < n; i++) {
      const a = allowed[i] || 0;
      const d = denied[i] || 0;
      const ha = (a / top) * height;
      const hd = (d / top) * height;
      bars.push({
        x: i * slot + gap / 2, w: slot - gap,
        allowed: a, denied: d,
        ya: height - ha, ha,
        yd: height - ha - hd, hd,
      });
    }
    return { top, bars };
  }


  // breakable splits a name after its separators (". _ - / :"), where a
  // long Envoy descriptor path may wrap: never inside a word.
  function breakable(name) {
    return String(name).split(/(?<=[._\-/:])/);
  }

  function setBreakable(el, name) {
    const parts = breakable(name);
    const nodes = [];
    parts.forEach((part, i) => {
      if (i > 0) nodes.push(document.createElement("wbr"));
      nodes.push(document.createTextNode(part));
    });
    el.replaceChildren(...nodes);
  }

  // formatRate renders decisions per second: "0.12", "35.0", "1200".
  function formatRate(x) {
    x = Number(x) || 0;
    if (x >= 1000) return String(Math.round(x));
    if (x >= 10) return x.toFixed(1);
    return x.toFixed(2);
  }

  // formatRatio renders a share as a percentage: "42.9%".
  function formatRatio(x) { return ((Number(x) || 0) * 100).toFixed(1) + "%"; }

  // formatLatency renders a latency bucket's bound: "≤ 0.5 ms", "–" without
  // decisions, "> 1 s" beyond the last bound.
  function formatLatency(ms) {
    ms = Number(ms);
    if (!(ms >= 0)) return "\u2013";
    if (ms > 1000) return "> 1 s";
    return "\u2264 " + ms + " ms";
  }

  // describeStore renders a store's health: "redis (cluster) · breaker closed".
  function describeStore(st) {
    if (!st || !st.store) return "unknown";
    let text = st.store + (st.mode ? ` (${st.mode})` : "");
    if (st.breaker) text += " \u00b7 breaker " + st.breaker.replace("_", "-");
    if (st.fallback_active) text += " \u00b7 fallback deciding";
    // A Cluster master's own breaker: the fallback decides its keys only.
    const parts = st.open_partitions || [];
    if (parts.length) text += ` \u00b7 breaker open for master${parts.length === 1 ? "" : "s"} ${parts.join(", ")}: fallback deciding their keys`;
    return text;
  }

  // describeScope says whose figures the overview shows.
  function describeScope(o) {
    if (o && o.scope === "fleet") {
      const n = Number(o.instances) || 1;
      return { badge: `fleet \u00b7 ${n} ${n === 1 ? "instance" : "instances"}`, text: `the fleet, summed over ${n} ${n === 1 ? "instance" : "instances"} sharing Redis` };
    }
    return { badge: "this instance", text: "this instance only (no shared Redis)" };
  }

  function sum(xs) { return xs.reduce((s, x) => s + (Number(x) || 0), 0); }

  // problemMessage extracts a readable message from an API error body
  // (problem+json or a plain {"error": ...}).
  function problemMessage(status, data) {
    if (data && typeof data === "object") {
      const parts = [data.title, data.detail || data.error || data.message].filter(Boolean);
      if (parts.length) return parts.join(": ");
    }
    return `HTTP ${status}`;
  }

  // adminMessage explains a refused admin action.
  function adminMessage(status, data) {
    const why = data ? " (" + problemMessage(status, data) + ")" : "";
    if (status === 401) {
      return "Reset needs an admin token: enter the server's admin token in \u201cToken\u201d and try again." + why;
    }
    if (status === 403) {
      return "Reset was refused: the admin token is wrong, or this server allows resets only from its own machine." + why;
    }
    return "Reset failed: " + problemMessage(status, data);
  }

  window.sluiceDashboard = {
    formatDuration, formatPeriod, capacity, describeLimit, niceMax, chartBars, problemMessage, adminMessage,
    breakable, formatRate, formatRatio, formatLatency, describeStore, describeScope,
  };

  // ---- page state ----

  const cards = new Map(); // policy name → card record
  let policies = [];
  let seq = 0;
  let statsTimer = 0;
  let statsSoon = 0;
  let statsBusy = false;
  let statsAgain = false; // an action finished while a poll was in flight
  let polls = 0;
  let cardSeq = 0;
  let loading = null; // the policies request in flight
  let seenConfig = null; // config_version of /v1/stats the cards were last loaded for
  let configRejected = false; // /v1/status's last answer: the files on disk were rejected

  const $ = (id) => document.getElementById(id);

  function session(name, value) {
    try {
      if (value === undefined) return sessionStorage.getItem(name) || "";
      if (value) sessionStorage.setItem(name, value); else sessionStorage.removeItem(name);
    } catch {
      // Storage may be disabled; the page still works without it.
    }
    return "";
  }

  function currentKey() { return $("key").value.trim(); }

  function setStatus(text, kind) {
    const el = $("status");
    el.textContent = text;
    el.dataset.kind = kind || "info";
  }

  async function api(method, path, body) {
    const headers = { Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    // Every call: the decision endpoints may need a token too.
    const t = $("admin-token").value.trim();
    if (t) headers.Authorization = "Bearer " + t;
    const res = await fetch(path, {
      method, headers, cache: "no-store", credentials: "same-origin",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    let data = null;
    if (res.status !== 204 && /json/i.test(res.headers.get("Content-Type") || "")) {
      try { data = await res.json(); } catch { data = null; }
    }
    return { status: res.status, data };
  }

  // ---- cards ----

  function buildCard(p) {
    const tpl = $("card-template").content.firstElementChild.cloneNode(true);
    const id = "policy-" + ++cardSeq;
    tpl.id = id;
    tpl.dataset.policy = p.name;
    tpl.dataset.algorithm = p.algorithm || "";
    tpl.dataset.capacity = String(capacity(p));
    tpl.setAttribute("aria-labelledby", id + "-title");
    const title = tpl.querySelector(".card-title");
    title.id = id + "-title";
    setBreakable(title, p.name);
    tpl.querySelector(".algorithm").textContent = inFlight(p) ? "in flight" : (p.algorithm || "").replaceAll("_", " ");
    if (inFlight(p)) {
      tpl.dataset.kind = "in_flight";
      tpl.querySelector(".actions").hidden = true;
      tpl.querySelector(".now").hidden = true;
      tpl.querySelector(".held-line").hidden = false;
    }
    tpl.querySelector(".shadow").hidden = !p.shadow;
    const lease = tpl.querySelector(".lease");
    lease.hidden = !(p.lease_ms > 0);
    if (p.lease_ms > 0) lease.textContent = "lease " + formatDuration(p.lease_ms);
    tpl.querySelector(".tally-local-line").hidden = !(p.lease_ms > 0);
    if (p.shadow) tpl.querySelector(".tally-denied-label").textContent = "would deny (shadow, let through)";
    tpl.querySelector(".limit").textContent = describeLimit(p);
    const results = tpl.querySelector(".results");
    results.id = id + "-results";
    results.setAttribute("aria-label", "Responses for " + p.name);
    const chart = tpl.querySelector(".chart");
    chart.id = id + "-chart";
    chart.dataset.policy = p.name;
    chart.dataset.renders = "0";
    chart.setAttribute("aria-label", "Allowed and denied requests for " + p.name + ": no data yet");
    tpl.querySelector(".chart-caption").textContent = "Waiting for statistics…";

    const card = {
      policy: p, el: tpl, results, chart,
      remainingNow: tpl.querySelector(".remaining-now"),
      heldNow: tpl.querySelector(".held-now"),
      tallyAllowed: tpl.querySelector(".tally-allowed"),
      tallyDenied: tpl.querySelector(".tally-denied"),
      tallyLocal: tpl.querySelector(".tally-local"),
      allowed: 0, denied: 0, local: 0,
    };
    for (const b of tpl.querySelectorAll("button[data-action]")) {
      b.setAttribute("aria-describedby", title.id);
      b.addEventListener("click", () => run(card, b.dataset.action === "burst" ? BURST : 1));
    }
    return card;
  }

  // setBusy disables a card's buttons while a request runs, and gives the
  // focus back to the one that had it (a disabled button loses it).
  function setBusy(card, busy) {
    card.el.dataset.busy = busy ? "true" : "false";
    card.el.setAttribute("aria-busy", busy ? "true" : "false");
    if (busy && card.el.contains(document.activeElement)) card.focused = document.activeElement;
    for (const b of card.el.querySelectorAll("button[data-action]")) b.disabled = busy;
    if (!busy && card.focused) {
      if (document.activeElement === document.body || document.activeElement === null) card.focused.focus();
      card.focused = null;
    }
  }

  // setRemaining takes the capacity from the response when it has one: a
  // per-key override applies its own, not the policy's.
  function setRemaining(card, remaining, limit) {
    if (remaining === undefined || remaining === null) return;
    const of = typeof limit === "number" ? limit : capacity(card.policy);
    card.remainingNow.textContent = `${remaining} of ${of}`;
    card.el.dataset.remaining = String(remaining);
  }

  function clearResults(card) {
    card.results.replaceChildren();
    card.allowed = card.denied = card.local = 0;
    card.tallyAllowed.textContent = "0";
    card.tallyDenied.textContent = "0";
    card.tallyLocal.textContent = "0";
    card.el.dataset.allowedCount = "0";
    card.el.dataset.deniedCount = "0";
  }

  // addResult shows one /v1/check response at the top of the card's list.
  function addResult(card, res) {
    const li = document.createElement("li");
    li.className = "result";
    li.dataset.seq = String(++seq);
    li.dataset.status = String(res.status);
    const num = document.createElement("span");
    num.className = "seq";
    num.textContent = "#" + seq;
    const verdict = document.createElement("span");
    verdict.className = "verdict";
    const detail = document.createElement("span");
    detail.className = "detail";

    const d = res.data;
    if ((res.status === 200 || res.status === 429) && d && typeof d === "object") {
      const allowed = res.status === 200;
      const shadow = allowed && d.shadow_denied === true;
      li.dataset.allowed = String(allowed);
      li.dataset.remaining = String(d.remaining ?? "");
      li.dataset.retryAfterMs = String(d.retry_after_ms ?? 0);
      li.dataset.resetAfterMs = String(d.reset_after_ms ?? 0);
      if (shadow) li.dataset.shadowDenied = "true";
      verdict.textContent = shadow ? "shadow deny" : allowed ? "allowed" : "denied";
      if (shadow) verdict.title = "Allowed: the policy is in shadow mode and would have denied this request";
      // A lease answered without a store call: what is left is the key's
      // figure as of the lease's grant.
      const local = d.source === "lease";
      if (d.source) li.dataset.source = d.source;
      let text = `${d.remaining ?? "?"} left${local ? " · local" : ""}`;
      if (!allowed || shadow) text += ` · retry in ${formatDuration(d.retry_after_ms)}`;
      detail.textContent = text;
      li.title = `reset in ${formatDuration(d.reset_after_ms)}` + (local ? "; answered from this instance's lease, without a store call (what is left: as of the lease's grant)" : "");
      if (local) card.tallyLocal.textContent = String(++card.local);
      // A shadow denial counts as denied, as in the chart; its verdict says it was let through.
      if (allowed && !shadow) card.allowed++; else card.denied++;
      card.tallyAllowed.textContent = String(card.allowed);
      card.tallyDenied.textContent = String(card.denied);
      card.el.dataset.allowedCount = String(card.allowed);
      card.el.dataset.deniedCount = String(card.denied);
      setRemaining(card, d.remaining, d.limit);
    } else {
      li.classList.add("error");
      li.dataset.error = "true";
      verdict.textContent = "error";
      detail.textContent = res.error || problemMessage(res.status, d);
    }
    li.append(num, verdict, detail);
    card.results.prepend(li);
    while (card.results.children.length > MAX_RESULTS) card.results.lastElementChild.remove();
  }

  // run sends n checks one after another, as a client would, and shows each
  // response as it arrives.
  async function run(card, n) {
    const key = currentKey();
    if (!key) {
      setStatus("Enter a key first.", "error");
      $("key").focus();
      return;
    }
    setBusy(card, true);
    try {
      for (let i = 0; i < n; i++) {
        let res;
        try {
          // No cost: the server applies the policy's own cost, as for any client.
          res = await api("POST", "v1/check", { policy: card.policy.name, key });
        } catch (e) {
          res = { status: 0, data: null, error: "network error: " + e.message };
        }
        addResult(card, res);
        if (res.status === 0) break;
      }
    } finally {
      setBusy(card, false);
      scheduleStats(150);
    }
  }

  // unpeekable remembers policy and key pairs a peek was refused for (an
  // Envoy-format policy no descriptor reaches with the key): they are not
  // asked again.
  const unpeekable = new Set();

  async function peekAll() {
    const key = currentKey();
    if (!key) return;
    await Promise.all(policies.filter((p) => !inFlight(p) && !unpeekable.has(p.name + "\u0000" + key)).map(async (p) => {
      const card = cards.get(p.name);
      try {
        const res = await api("POST", "v1/peek", { policy: p.name, key });
        if (res.status === 200 && res.data) setRemaining(card, res.data.remaining, res.data.limit);
        if (res.status === 400) unpeekable.add(p.name + "\u0000" + key);
      } catch {
        // Leave the old value; the next action refreshes it.
      }
    }));
  }

  async function resetAll() {
    const key = currentKey();
    if (!key) {
      setStatus("Enter a key first.", "error");
      return;
    }
    const btn = $("reset-all");
    btn.disabled = true;
    setStatus("Resetting…", "info");
    try {
      let done = 0;
      // A policy that cannot take this key (4xx: an Envoy-format policy no
      // descriptor reaches with it, or one a reload dropped) is skipped;
      // the others are still reset.
      const skipped = [], failed = [];
      // policies may be replaced while this awaits; a dropped policy is skipped.
      for (const p of policies) {
        if (!cards.has(p.name) || inFlight(p)) continue;
        let res;
        try {
          res = await api("POST", "v1/reset", { policy: p.name, key });
        } catch (e) {
          failed.push(`${p.name}: network error: ${e.message}`);
          continue;
        }
        if (res.status === 401 || res.status === 403) {
          // The same answer awaits every policy.
          setStatus(adminMessage(res.status, res.data), "error");
          if (res.status === 401) $("admin-token").focus();
          return;
        }
        if (res.status >= 400 && res.status <= 499) {
          skipped.push(`${p.name} (${problemMessage(res.status, res.data)})`);
          continue;
        }
        if (res.status < 200 || res.status > 299) {
          failed.push(`${p.name}: ${problemMessage(res.status, res.data)}`);
          continue;
        }
        const card = cards.get(p.name);
        if (card) clearResults(card);
        done++;
      }
      const plural = (n) => `${n} ${n === 1 ? "policy" : "policies"}`;
      let msg = `Reset key “${key}” for ${plural(done)}.`;
      if (skipped.length) msg += ` Skipped ${plural(skipped.length)} that cannot take this key: ${skipped.join("; ")}.`;
      if (failed.length) msg += ` Reset failed for ${plural(failed.length)}: ${failed.join("; ")}.`;
      setStatus(msg, failed.length || (!done && skipped.length) ? "error" : "ok");
      await peekAll();
    } catch (e) {
      // Never leave the status on "Resetting…".
      setStatus("Reset failed: " + e.message, "error");
    } finally {
      btn.disabled = false;
    }
  }


  // ---- overview ----

  // cell is a table cell; names and keys (the first columns) may wrap only
  // after their separators.
  function cell(text, i) {
    const td = document.createElement("td");
    if (i < 2) setBreakable(td, text); else td.textContent = text;
    return td;
  }

  function fillRows(table, rows) {
    table.tBodies[0].replaceChildren(...rows.map((cells) => {
      const tr = document.createElement("tr");
      tr.append(...cells.map(cell));
      return tr;
    }));
  }

  // utc renders an RFC 3339 time as "2030-01-02 03:04:05 UTC", "" if it is none.
  function utc(text) {
    const at = text ? new Date(text) : null;
    return at && !isNaN(at) ? at.toISOString().replace("T", " ").slice(0, 19) + " UTC" : "";
  }

  // renderConfig shows /v1/status's config: while the last reload was
  // rejected, what runs is not the files on disk, and the overview's
  // version and load time are those of the configuration still in force.
  function renderConfig(cfg) {
    const r = cfg && typeof cfg === "object" ? cfg.rejected : null;
    const el = $("config-rejected");
    configRejected = !!(r && typeof r === "object");
    document.body.dataset.config = configRejected ? "rejected" : "ok";
    if (!configRejected) {
      el.hidden = true;
      $("config-rejected-text").textContent = "";
      $("config-rejected-error").textContent = "";
      return;
    }
    const loaded = utc(cfg.loaded_at);
    $("config-rejected-text").textContent = `Configuration reload rejected${r.at ? " at " + utc(r.at) : ""}: ` +
      `still serving version ${cfg.version}${loaded ? ", loaded " + loaded : ""}. Fix the file and reload.`;
    $("config-rejected-error").textContent = String(r.error || "");
    el.hidden = false;
  }

  function renderOverview(data) {
    const o = data.overview;
    if (!o) return;
    const scope = describeScope(o);
    $("scope").textContent = scope.badge;
    $("scope-text").textContent = scope.text;
    $("overview").dataset.scope = o.scope;
    $("ov-rate").textContent = formatRate(o.decisions_per_second);
    $("ov-denied-ratio").textContent = formatRatio(o.denied_ratio);
    $("ov-allowed").textContent = String(o.allowed);
    $("ov-denied").textContent = String(o.denied);
    // Checks the store failed: no decision, so in neither figure above.
    $("ov-error-ratio").textContent = formatRatio(o.error_ratio || 0);
    $("ov-errors").textContent = String(o.errors || 0);
    $("store-health").textContent = describeStore(data.store);
    const at = utc(data.config_loaded_at);
    $("config-info").textContent = `version ${data.config_version}` + (at ? ` \u00b7 loaded ${at}` : "") +
      (configRejected ? " \u00b7 reload rejected" : "");
    fillRows($("policy-figures"), (o.policies || []).map((p) =>
      [p.policy, String(p.allowed), String(p.denied), formatLatency(p.latency_p50_ms), formatLatency(p.latency_p99_ms),
        p.in_flight ? String(p.held || 0) : "\u2013", p.in_flight ? "\u2013" : String(p.local || 0), String(p.errors || 0)]));
    for (const p of o.policies || []) {
      const card = cards.get(p.policy);
      if (!p.in_flight || !card || !card.heldNow) continue;
      card.heldNow.textContent = `${p.held || 0} of ${capacity(card.policy)}`;
      card.el.dataset.held = String(p.held || 0);
    }
  }

  // refreshTop shows the top keys: an admin endpoint, as keys are clients' own.
  // topRefused is the token the top keys were last refused with: the poll
  // asks again only once another is entered.
  let topRefused = null;
  // adminDisabled: the server has no admin token and listens beyond
  // loopback (health says so), so no token typed here can help.
  let adminDisabled = false;

  async function refreshTop() {
    if (topRefused !== null && topRefused === $("admin-token").value.trim()) return;
    let res;
    try {
      res = await api("GET", "v1/top", undefined, true);
    } catch (e) {
      $("top-note").textContent = "Top keys unavailable: " + e.message;
      return;
    }
    if (res.status === 401 || res.status === 403) {
      topRefused = $("admin-token").value.trim();
      fillRows($("top-denials"), []);
      fillRows($("top-near"), []);
      $("top-note").textContent = adminDisabled
        ? "The top keys are clients' own keys, shown only with an admin token: this server listens beyond loopback and has none (start it with --admin-token)."
        : "The top keys are clients' own keys: enter the admin token above to see them.";
      return;
    }
    if (res.status !== 200 || !res.data) {
      $("top-note").textContent = "Top keys unavailable: " + problemMessage(res.status, res.data);
      return;
    }
    topRefused = null;
    const t = res.data;
    fillRows($("top-denials"), (t.denials || []).map((e) => [e.key, e.policy, String(e.count)]));
    fillRows($("top-near"), (t.near_limit || []).map((e) => [e.key, e.policy, String(e.count), formatRatio(e.utilisation)]));
    const whose = t.scope === "fleet" ? `across ${t.instances} instance${t.instances === 1 ? "" : "s"}` : "on this instance";
    $("top-note").textContent = `Top keys ${whose}, over the last ${formatDuration(t.window_ms)} to ${formatDuration(2 * t.window_ms)}. ` +
      "\u201cNear\u201d is within 20% of the limit. Counts come from a bounded sketch and may overstate a key that entered it late.";
    $("overview").dataset.topLoads = String(Number($("overview").dataset.topLoads || 0) + 1);
  }

  // ---- charts ----

  function svg(name, attrs) {
    const el = document.createElementNS(SVG_NS, name);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
    return el;
  }

  function drawChart(card, allowed, denied, bucketMs, local, errors) {
    const { top, bars } = chartBars(allowed, denied, CHART_W, CHART_H);
    const nodes = [];
    // A shadow policy's denials were let through: drawn apart from real ones.
    const deniedClass = card.policy.shadow ? "bar shadow-denied" : "bar denied";
    for (let i = 0; i < bars.length; i++) {
      const b = bars[i];
      const partial = i === bars.length - 1 ? " partial" : "";
      if (b.ha > 0) nodes.push(svg("rect", { class: "bar allowed" + partial, x: b.x, y: b.ya, width: b.w, height: b.ha }));
      if (b.hd > 0) nodes.push(svg("rect", { class: deniedClass + partial, x: b.x, y: b.yd, width: b.w, height: b.hd }));
    }
    nodes.push(svg("line", { class: "baseline", x1: 0, y1: CHART_H - 0.5, x2: CHART_W, y2: CHART_H - 0.5 }));
    card.chart.replaceChildren(...nodes);

    const a = sum(allowed);
    const d = sum(denied);
    const span = formatDuration(bucketMs * Math.max(allowed.length, denied.length));
    const c = card.chart.dataset;
    c.seriesAllowed = JSON.stringify(allowed);
    c.seriesDenied = JSON.stringify(denied);
    c.allowedTotal = String(a);
    c.deniedTotal = String(d);
    c.bucketMs = String(bucketMs);
    c.scaleMax = String(top);
    c.renders = String(Number(c.renders || 0) + 1);
    let summary = `Last ${span}, all traffic on this instance: ${a} allowed, ${d} ${card.policy.shadow ? "would have been denied" : "denied"}`;
    // A leased policy: the share its lease answered without a store call.
    if (card.policy.lease_ms > 0) {
      const l = sum(local);
      c.localTotal = String(l);
      summary += `; ${l} answered locally from the lease (${a + d > 0 ? Math.round((100 * l) / (a + d)) : 0}%)`;
    }
    // Checks the store failed are no bars (no decision) but are said.
    const e = sum(errors);
    c.errorsTotal = String(e);
    if (e > 0) summary += `; ${e} failed in the store (no decision${card.policy.shadow ? ", let through" : ""})`;
    card.chart.setAttribute("aria-label", `Allowed and denied requests for ${card.policy.name}. ${summary}.`);
    card.el.querySelector(".axis-start").textContent = "\u2212" + span;
    card.el.querySelector(".chart-caption").textContent =
      `${summary}. One bar per ${formatDuration(bucketMs)}; full height is ${top} ${top === 1 ? "decision" : "decisions"}; the last bar is still filling.`;
  }

  async function pollStats() {
    if (statsBusy) {
      statsAgain = true;
      return;
    }
    statsBusy = true;
    statsAgain = false;
    clearTimeout(statsTimer);
    try {
      const res = await api("GET", "v1/stats");
      if (res.status !== 200 || !res.data || !Array.isArray(res.data.series)) {
        $("stats-note").textContent = "Statistics unavailable: " + problemMessage(res.status, res.data);
        return;
      }
      const bucketMs = Number(res.data.bucket_ms) || 0;
      // A new config_version means the server reloaded, even if only a
      // limit changed. The first poll reloads once, as the page's first load
      // had no version. Not while a reload runs: it may predate this version.
      const version = res.data.config_version;
      if (version !== seenConfig && !loading) {
        loadPolicies().then((ok) => {
          // Marked only on success, so a failed reload is retried.
          if (!ok) return;
          seenConfig = version;
          scheduleStats(0);
        });
      }
      for (const s of res.data.series) {
        const card = cards.get(s.policy);
        if (!card) continue;
        drawChart(card, (s.allowed || []).map(Number), (s.denied || []).map(Number), bucketMs, (s.local || []).map(Number), (s.errors || []).map(Number));
      }
      renderOverview(res.data);
      await refreshTop();
      polls++;
      document.body.dataset.statsPolls = String(polls);
      $("stats-note").textContent = `Charts: last ${formatDuration(bucketMs * (Number(res.data.buckets) || 0))}, updated every ${POLL_MS / 1000} s.`;
    } catch (e) {
      $("stats-note").textContent = "Statistics unavailable: " + e.message;
    } finally {
      statsBusy = false;
      statsTimer = setTimeout(tick, statsAgain ? 0 : POLL_MS);
    }
  }

  // pollHealth shows the service's own view (/v1/status) as a banner: not
  // ready, or degraded (Redis lost, the failure policy answering), and
  // hides Reset when the server has admin endpoints disabled.
  async function pollHealth() {
    let res;
    try {
      res = await api("GET", "v1/status");
    } catch {
      return;
    }
    const st = res.data;
    if (res.status !== 200 || !st || typeof st !== "object") return;
    const banner = $("health");
    const reasons = Array.isArray(st.reasons) ? st.reasons.join("; ") : "";
    if (!st.ready) {
      banner.textContent = "Not ready: " + (reasons || "this instance cannot answer decisions.");
      banner.dataset.kind = "error";
      banner.hidden = false;
    } else if (st.degraded) {
      banner.textContent = "Degraded: " + (reasons || "decisions do not come from the shared store.");
      banner.dataset.kind = "warn";
      banner.hidden = false;
    } else {
      banner.hidden = true;
      banner.textContent = "";
    }
    document.body.dataset.health = !st.ready ? "not-ready" : st.degraded ? "degraded" : "ok";
    renderConfig(st.config);
    const off = st.admin === "disabled";
    // The top keys' note depends on it: a refusal noted before this answer
    // came (a slow status) is shown again with the right words.
    if (off !== adminDisabled) topRefused = null;
    adminDisabled = off;
    $("reset-all").hidden = off;
    $("reset-off").hidden = !off;
  }

  function tick() {
    // A hidden tab does not poll; it catches up when shown again.
    if (document.hidden) {
      statsTimer = setTimeout(tick, POLL_MS);
      return;
    }
    pollHealth();
    pollStats();
  }

  // scheduleStats refreshes the charts soon after an action, so a burst shows
  // up without waiting for the next poll.
  function scheduleStats(ms) {
    clearTimeout(statsSoon);
    statsSoon = setTimeout(pollStats, ms);
  }

  // ---- start ----

  async function start() {
    const savedKey = session(KEY_STORE);
    if (savedKey) $("key").value = savedKey;
    $("admin-token").value = session(TOKEN_STORE);
    // A new token may be the one the decision endpoints wanted: look again
    // once typing pauses (the peeks refused without it showed nothing).
    let tokenPeek;
    $("admin-token").addEventListener("input", (e) => {
      session(TOKEN_STORE, e.target.value.trim());
      clearTimeout(tokenPeek);
      tokenPeek = setTimeout(peekAll, 400);
    });
    $("key").addEventListener("change", () => {
      session(KEY_STORE, currentKey());
      for (const c of cards.values()) clearResults(c);
      peekAll();
    });
    $("controls").addEventListener("submit", (e) => e.preventDefault());
    $("reset-all").addEventListener("click", resetAll);
    document.addEventListener("visibilitychange", () => { if (!document.hidden) scheduleStats(0); });

    // Until the API answers (the server may be starting), try again.
    while (!(await loadPolicies())) await new Promise((r) => setTimeout(r, 3000));
    document.body.dataset.ready = "true";
    pollHealth();
    pollStats();
  }

  // sameDefinition reports whether a reloaded policy is unchanged, so its
  // card (and its results) can stay.
  function sameDefinition(a, b) {
    const f = (p) => JSON.stringify([p.name, p.algorithm, p.limit, p.rate, p.period_ms, p.burst, p.shadow, p.kind, p.max, p.hold_ms, p.reserve, p.lease_ms]);
    return f(a) === f(b);
  }

  function loadPolicies() {
    if (!loading) loading = fetchPolicies().finally(() => { loading = null; });
    return loading;
  }

  // fetchPolicies builds one card per policy. On a reload (the server's
  // configuration changed) unchanged cards are kept as they are.
  async function fetchPolicies() {
    unpeekable.clear(); // a reload may let a policy take the key
    let res;
    try {
      res = await api("GET", "v1/policies");
    } catch (e) {
      res = { status: 0, data: null, error: e.message };
    }
    if (res.status !== 200 || !res.data || !Array.isArray(res.data.policies)) {
      const msg = "Could not load policies: " + (res.error || problemMessage(res.status, res.data));
      const el = $("loading");
      if (el) {
        el.textContent = msg;
        el.classList.add("error");
      } else {
        setStatus(msg, "error");
      }
      return false;
    }
    const next = res.data.policies;
    const kept = new Map();
    let changed = JSON.stringify(next.map((p) => p.name)) !== JSON.stringify([...cards.keys()]);
    for (const p of next) {
      const old = cards.get(p.name);
      let card = old;
      if (!old || !sameDefinition(old.policy, p)) {
        card = buildCard(p);
        clearResults(card);
        setBusy(card, false);
        changed = true;
      }
      kept.set(p.name, card);
    }
    const reload = policies.length > 0 || cards.size > 0;
    // Only when something changed: re-inserting the cards would drop focus.
    if (changed) $("cards").replaceChildren(...[...kept.values()].map((c) => c.el));
    cards.clear();
    for (const [name, card] of kept) cards.set(name, card);
    policies = next;
    $("loading")?.remove();
    if (!policies.length) setStatus("The server has no policies configured.", "info");
    else if (reload && changed) setStatus("The server's policies changed; the cards were updated.", "info");
    document.body.dataset.policies = String(policies.length);
    peekAll();
    return true;
  }

  document.addEventListener("DOMContentLoaded", start);
})();
