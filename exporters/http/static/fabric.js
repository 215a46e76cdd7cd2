// The fabric page of ibfm: reads /api/v1/health and /api/v1/view/fabric every few seconds and draws the
// switches by tier (cores on top, leaves at the bottom, hosts counted under each leaf) in one SVG, links
// coloured by utilization, down links dashed red. Names come from the fabric (NodeDescription): they are
// only ever set as text or attributes, never parsed as HTML.
"use strict";
(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const query = new URLSearchParams(location.search);
  const REFRESH_S = intParam("refresh", 1, 3600, 5);
  const VIEW_URL = "api/v1/view/fabric" + (query.has("max_switches")
    ? "?max_switches=" + encodeURIComponent(query.get("max_switches")) : "");
  const HEALTH_URL = "api/v1/health";
  // Utilization ramp: idle pale blue, green, yellow, orange, saturated purple (red is kept for down links).
  const STOPS = [[0, [188, 215, 234]], [0.25, [90, 174, 97]], [0.5, [230, 206, 60]], [0.75, [240, 128, 40]],
    [1, [122, 1, 119]]];
  const NO_DATA = "#b0b0b0";
  const TOP = 26, LEFT = 96, RIGHT = 12, BOX_H = 18, HOST_GAP = 40, HOST_H = 14;
  let ROW = 112;  // height of a tier's row: more when the window has room (dense tiers read better)

  const $ = (id) => document.getElementById(id);
  const svg = $("fabric");
  let drawn = null;  // {key, width, links: [elements], switches: [groups], hosts: [groups]}
  let lastView = null;
  let lastOk = 0;

  function intParam(name, lo, hi, dflt) {
    const v = parseInt(query.get(name), 10);
    return Number.isFinite(v) ? Math.min(hi, Math.max(lo, v)) : dflt;
  }

  function colour(u) {
    if (u === null || u === undefined || !Number.isFinite(u)) return NO_DATA;
    const x = Math.min(1, Math.max(0, u));
    for (let i = 1; i < STOPS.length; i++) {
      const [t1, c1] = STOPS[i];
      if (x <= t1) {
        const [t0, c0] = STOPS[i - 1];
        const f = (x - t0) / (t1 - t0);
        const c = c0.map((v, k) => Math.round(v + (c1[k] - v) * f));
        return `rgb(${c[0]},${c[1]},${c[2]})`;
      }
    }
    return NO_DATA;
  }

  function el(name, attrs, parent) {
    const e = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    if (parent) parent.appendChild(e);
    return e;
  }

  function text(parent, x, y, s, cls, anchor) {
    const t = el("text", {x, y, "text-anchor": anchor || "middle"}, parent);
    if (cls) t.setAttribute("class", cls);
    t.textContent = s;
    return t;
  }

  function title(parent, s) {
    let t = parent.querySelector(":scope > title");
    if (!t) t = el("title", {}, parent);
    t.textContent = s;
  }

  function pct(u) {
    return u === null || u === undefined ? "no data" : `${(100 * u).toFixed(u < 0.1 ? 1 : 0)}%`;
  }

  function ago(t) {
    if (!t) return "never";
    const s = Math.max(0, Date.now() / 1000 - t);
    if (s < 90) return `${s.toFixed(0)} s ago`;
    if (s < 5400) return `${(s / 60).toFixed(0)} min ago`;
    return `${(s / 3600).toFixed(1)} h ago`;
  }

  function clock(t) {
    return new Date(t * 1000).toLocaleTimeString([], {hour12: false});
  }

  function end(e) {
    return e ? `${e.node}[${e.port}]` : "?";
  }

  // -- the drawing ------------------------------------------------------------------------------------------

  function build(view) {
    const width = Math.max(640, Math.round(svg.parentElement.clientWidth - 26));
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    // rows from the top: unranked, then the highest rank down to the leaves, then the hosts
    const order = view.tiers.map((t, i) => i).sort((a, b) => {
      const ra = view.tiers[a].rank, rb = view.tiers[b].rank;
      return (ra < 0 ? -1 : 0) - (rb < 0 ? -1 : 0) || rb - ra;
    });
    const rowOf = new Map(order.map((ti, row) => [ti, row]));
    const leafTier = view.tiers.findIndex((t) => t.rank === 0);
    const rows = order.length + (leafTier >= 0 ? 0.55 : 0);
    const room = (window.innerHeight || 800) - svg.getBoundingClientRect().top - 24;
    ROW = Math.round(Math.max(112, Math.min(240, (room - TOP - 12) / rows)));
    const height = Math.round(TOP + rows * ROW + 12);
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);

    const span = width - LEFT - RIGHT;
    const byTier = view.tiers.map(() => []);
    view.switches.forEach((s, i) => byTier[s.tier].push(i));
    const pos = new Array(view.switches.length);
    let boxW = 84;
    byTier.forEach((members) => {
      if (members.length) boxW = Math.min(boxW, span / members.length - 2);
    });
    boxW = Math.max(2, boxW);
    byTier.forEach((members, ti) => {
      const y = TOP + rowOf.get(ti) * ROW + BOX_H / 2 + 8;
      const step = span / Math.max(1, members.length);
      members.forEach((si, k) => { pos[si] = {x: LEFT + step * (k + 0.5), y, w: Math.max(2, Math.min(84, step - 2))}; });
    });

    const gTiers = el("g", {class: "tiers"}, svg);
    view.tiers.forEach((t, ti) => {
      const y = TOP + rowOf.get(ti) * ROW + BOX_H / 2 + 8;
      text(gTiers, 4, y - 2, t.name, "tier", "start");
      text(gTiers, 4, y + 11, t.drawn < t.switches ? `${t.drawn} of ${t.switches} drawn` : `${t.switches}`,
        "tier-sub", "start");
    });

    const total = view.links.length;
    const base = total > 3000 ? 0.7 : total > 800 ? 1.1 : total > 200 ? 1.6 : 2.4;
    const gLinks = el("g", {class: "links"}, svg);
    const gDown = el("g", {class: "links-down"}, svg);
    const links = view.links.map((l) => {
      const a = pos[l.a], b = pos[l.b];
      const lower = a.y >= b.y ? a : b, upper = a.y >= b.y ? b : a;
      let e;
      if (Math.abs(a.y - b.y) < 1) {  // same tier (a ring, a torus): an arc above the row
        const lift = Math.min(ROW * 0.45, 12 + Math.abs(a.x - b.x) * 0.25);
        e = el("path", {d: `M${a.x},${a.y - BOX_H / 2} Q${(a.x + b.x) / 2},${a.y - BOX_H / 2 - lift} ${b.x},${b.y - BOX_H / 2}`});
      } else {
        e = el("line", {x1: lower.x, y1: lower.y - BOX_H / 2, x2: upper.x, y2: upper.y + BOX_H / 2});
      }
      e.dataset.a = view.switches[l.a].name;
      e.dataset.b = view.switches[l.b].name;
      e.setAttribute("stroke-width", (base * (1 + Math.log2(Math.max(1, l.cables)) * 0.5)).toFixed(2));
      (l.down ? gDown : gLinks).appendChild(e);
      return e;
    });

    const gHosts = el("g", {class: "host-blocks"}, svg);
    const hosts = view.switches.map((s, i) => {
      if (view.tiers[s.tier].rank !== 0 || (!s.hosts && !s.hosts_down)) return null;
      const p = pos[i];
      const g = el("g", {class: "hosts"}, gHosts);
      g.dataset.leaf = s.name;
      const w = Math.max(2, Math.min(p.w, 60));
      el("line", {x1: p.x, y1: p.y + BOX_H / 2, x2: p.x, y2: p.y + HOST_GAP}, g);
      el("rect", {x: p.x - w / 2, y: p.y + HOST_GAP, width: w, height: HOST_H, rx: 2}, g);
      if (w >= 14) text(g, p.x, p.y + HOST_GAP + 10.5, "");
      return g;
    });
    if (leafTier >= 0) {
      const y = TOP + rowOf.get(leafTier) * ROW + BOX_H / 2 + 8 + HOST_GAP + 10;
      text(gTiers, 4, y, "hosts", "tier", "start");
    }

    const gSw = el("g", {class: "switches"}, svg);
    const switches = view.switches.map((s, i) => {
      const p = pos[i];
      const g = el("g", {class: "switch"}, gSw);
      g.dataset.name = s.name;
      el("rect", {x: p.x - p.w / 2, y: p.y - BOX_H / 2, width: p.w, height: BOX_H, rx: 3}, g);
      const fits = Math.floor((p.w - 4) / 5.6);
      if (fits >= 3) {
        const label = s.name.length <= fits ? s.name : "\u2026" + s.name.slice(s.name.length - fits + 1);
        text(g, p.x, p.y + 3.5, label);
      }
      g.addEventListener("mouseenter", () => focus(s.name));
      g.addEventListener("mouseleave", () => focus(null));
      return g;
    });
    drawn = {key: view.layout, width, links, switches, hosts};
  }

  function focus(name) {
    if (!drawn) return;
    svg.classList.toggle("focus", name !== null);
    for (const e of drawn.links) e.classList.toggle("hl", name !== null && (e.dataset.a === name || e.dataset.b === name));
  }

  function update(view) {
    view.links.forEach((l, j) => {
      const e = drawn.links[j];
      e.setAttribute("class", "link" + (l.down ? " down" : "") + (!l.down && l.inactive ? " inactive" : ""));
      e.setAttribute("stroke", colour(l.utilization));
      const a = view.switches[l.a].name, b = view.switches[l.b].name;
      const cab = l.cables === 1 ? "1 cable" : `${l.cables} cables`;
      let s = `${a} \u2013 ${b}: ${cab}, utilization ${pct(l.utilization)}`;
      if (l.down) s += `, ${l.down} down`;
      if (l.inactive) s += `, ${l.inactive} not active`;
      title(e, s);
    });
    view.switches.forEach((s, i) => {
      const g = drawn.switches[i];
      g.setAttribute("class", "switch" + (s.ports_down ? " ports-down" : ""));
      const tier = view.tiers[s.tier].name;
      let t = `${s.name} (${s.guid})\n${tier}, rank ${s.rank}`;
      if (s.hosts || view.tiers[s.tier].rank === 0) t += `\n${s.hosts} hosts`;
      if (s.ports_down) t += `\n${s.ports_down} ports down`;
      if (s.hosts_down) t += `\n${s.hosts_down} host cables down`;
      title(g, t);
      const h = drawn.hosts[i];
      if (h) {
        h.setAttribute("class", "hosts" + (s.hosts_down ? " down" : ""));
        const label = h.querySelector("text");
        if (label) label.textContent = s.hosts_down ? `${s.hosts}\u2009/\u2009${s.hosts_down}\u2193` : String(s.hosts);
        title(h, `${s.name}: ${s.hosts} hosts` + (s.hosts_down ? `, ${s.hosts_down} host cables down` : ""));
      }
    });
  }

  function renderFabric(view) {
    $("waiting").hidden = true;
    svg.hidden = false;
    const width = Math.max(640, Math.round(svg.parentElement.clientWidth - 26));
    if (!drawn || drawn.key !== view.layout || Math.abs(drawn.width - width) > 40) build(view);
    update(view);
    lastView = view;
    const u = view.utilization;
    const src = u.source === "measured" ? `measured from counters (PerfManager sweep ${u.perf_sweep})`
      : u.source === "predicted" ? `predicted for traffic ${u.pattern} (no counters measured)` : "no data";
    const drawnSw = view.switches.length, allSw = view.counts.switches;
    let note = `Utilization ${src}; busiest link drawn ${pct(u.max)}. `;
    note += drawnSw < allSw ? `${drawnSw} of ${allSw} switches drawn` : `${allSw} switches`;
    note += `, ${view.links.length} switch pairs`;
    if (view.links_not_drawn) note += ` (${view.links_not_drawn} cables to switches not drawn)`;
    note += ". Hover a switch to follow its links.";
    $("note").textContent = note;
    $("shape").textContent = view.shape;
  }

  function renderWaiting(status, body) {
    svg.hidden = true;
    drawn = null;
    const w = $("waiting");
    w.hidden = false;
    w.textContent = status === 503 ? "Waiting for the first sweep\u2026" : `The API answered ${status}: ${body && body.detail || ""}`;
  }

  // -- health ----------------------------------------------------------------------------------------------

  function fact(dl, k, v) {
    const dt = document.createElement("dt");
    dt.textContent = k;
    const dd = document.createElement("dd");
    dd.textContent = v;
    dl.append(dt, dd);
  }

  function renderHealth(h, view) {
    const badge = $("state");
    const state = h ? h.state : "unknown";
    badge.textContent = state;
    badge.className = "badge " + String(state).replace(/[^a-z_]/g, "");
    const dl = $("facts");
    dl.replaceChildren();
    const problems = [];
    if (h) {
      const sm = h.sm || {};
      let role = sm.state || "?";
      if (sm.priority !== undefined) role += `, priority ${sm.priority}`;
      fact(dl, "This SM", role + (sm.node ? ` on ${sm.node}[${sm.port}], LID ${sm.lid}` : ""));
      const master = sm.state === "master" ? "this SM" : sm.master_guid
        ? `${sm.master_guid}` + (sm.master_lid ? `, LID ${sm.master_lid}` : "") : "unknown";
      fact(dl, "Master", master);
      if (h.sweep) {
        fact(dl, "Last sweep", `#${h.sweep.number}, ${ago(h.sweep.time)} (took ${h.sweep.duration_s.toFixed(2)} s, ` +
          `${h.sweep.smps} SMPs)`);
      }
      if (h.routing) {
        fact(dl, "Routing", `${h.routing.engine} (chain ${h.routing.chain.join(", ")})`);
        for (const r of h.routing.refused) problems.push(["info", `${r.engine} refused the topology: ${r.reason}`]);
      }
      if (h.fabric) {
        const down = view ? view.counts.links_down : 0;
        fact(dl, "Fabric", `${h.fabric.switches} switches, ${h.fabric.cas} CAs, ${h.fabric.links} links up` +
          (down ? `, ${down} down` : ""));
      }
      if (h.verify) {
        fact(dl, "Routes", h.verify.ok ? `all ${h.verify.pairs} pairs reach` : `${h.verify.unreachable} of ${h.verify.pairs} pairs unreachable`);
        for (const f of h.verify.failures.slice(0, 10)) problems.push(["error", f]);
      }
      if (h.perfmgr) {
        fact(dl, "Counters", `${h.perfmgr.sweeps} PerfManager sweeps, last ${ago(h.perfmgr.last_sweep_time)}`);
      }
      const lf = h.sweep && h.sweep.last_failure;
      if (lf) problems.push(["error", `sweep failed in ${lf.stage}: ${lf.reason}`]);
      for (const x of h.credit_loops || []) problems.push(["error", `credit loop: ${x}`]);
      for (const x of h.discovery_errors || []) problems.push(["error", `discovery: ${x}`]);
      for (const x of (h.program && h.program.failures) || []) problems.push(["error", `programming: ${x}`]);
      for (const x of (h.lids && h.lids.warnings) || []) problems.push(["warning", `LIDs: ${x}`]);
    }
    if (view) {
      for (const d of view.down_links) {
        const how = d.source === "event" ? `down since ${clock(d.since)}`
          : d.source === "expected" ? "missing (expected topology)" : "not LinkUp";
        problems.push(["error", `link ${end(d.a)} \u2013 ${end(d.b)} ${how}`]);
      }
      if (view.down_total > view.down_links.length) {
        problems.push(["error", `and ${view.down_total - view.down_links.length} more links down`]);
      }
    }
    const ul = $("problems");
    ul.replaceChildren();
    for (const [cls, s] of problems.slice(0, 60)) {
      const li = document.createElement("li");
      li.className = cls;
      li.textContent = s;
      ul.appendChild(li);
    }
    const serious = problems.filter((p) => p[0] !== "info").length;
    $("problem-count").textContent = serious ? `(${serious})` : "";
    $("problems-none").hidden = problems.length > 0;
  }

  // -- the loop --------------------------------------------------------------------------------------------

  async function getJson(url) {
    const r = await fetch(url, {cache: "no-store", headers: {Accept: "application/json"}});
    let body = null;
    try { body = await r.json(); } catch (e) { body = null; }
    return {status: r.status, body};
  }

  async function tick() {
    const status = $("status");
    try {
      const [h, v] = await Promise.all([getJson(HEALTH_URL), getJson(VIEW_URL)]);
      const view = v.status === 200 ? v.body : null;
      renderHealth(h.status === 200 ? h.body : null, view);
      if (view) renderFabric(view); else renderWaiting(v.status, v.body);
      lastOk = Date.now() / 1000;
      status.className = "";
      status.textContent = `updated ${clock(lastOk)} \u00b7 every ${REFRESH_S} s`;
    } catch (e) {
      status.className = "stale";
      status.textContent = `not updated since ${lastOk ? clock(lastOk) : "the start"}: ${e}`;
    } finally {
      setTimeout(tick, REFRESH_S * 1000);
    }
  }

  const ramp = $("ramp");
  for (let i = 0; i <= 10; i++) {
    const s = document.createElement("span");
    s.style.background = colour(i / 10);
    ramp.appendChild(s);
  }
  const hi = document.createElement("b");
  hi.textContent = "100%";
  ramp.appendChild(hi);
  window.addEventListener("resize", () => { if (lastView) renderFabric(lastView); });
  tick();
})();
