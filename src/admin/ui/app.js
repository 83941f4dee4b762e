// meridian's status page: renders the view model of /ui/state, kept live by /ui/events
// (server-sent events: a new view each time it changes). No framework, no build step.
"use strict";

const $ = (id) => document.getElementById(id);

// Builds an element: el("div", {class: "x", "data-name": n}, child, "text", ...).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null) e.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function text(v) {
  if (v === undefined || v === null || v === "") return "-";
  return typeof v === "object" ? JSON.stringify(v) : String(v);
}

// The server's clock less the browser's (each view carries the server's `now`): heartbeat
// ages are counted here, every second, not sent by the server every second.
let clockOffset = 0;

function secondsSince(millis) {
  if (millis === undefined || millis === null) return null;
  return Math.max(0, Math.floor((Date.now() + clockOffset - millis) / 1000));
}

function tickHeartbeats() {
  for (const dd of document.querySelectorAll("dd.heartbeat[data-at]")) {
    dd.textContent = ago(secondsSince(Number(dd.dataset.at)));
  }
}

function ago(seconds) {
  if (seconds === undefined || seconds === null) return "never";
  if (seconds < 60) return `${seconds} s ago`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
  return `${Math.floor(seconds / 3600)} h ago`;
}

// CPU as placement counts it: used by pods, assumed for decisions not running yet, of the
// Nodes' allocatable.
function capacityText(c) {
  if (!c) return "-";
  const cpu = (r) => `${(r.cpuMillis / 1000).toFixed(1)}`;
  return `CPU ${cpu(c.used)} used + ${cpu(c.assumed)} assumed of ${cpu(c.allocatable)}`;
}

function renderClusters(clusters) {
  const cards = clusters.map((c) => {
    const taints = (c.taints || []).map((t) =>
      el("span", { class: "badge" + (t.effect === "NoExecute" ? " bad" : "") },
        `${t.key}${t.value ? "=" + t.value : ""}:${t.effect}`));
    return el("div", { class: `cluster ${c.health}`, "data-name": c.name },
      el("div", {}, el("span", { class: "name" }, c.name), " ",
        el("span", { class: "health" }, c.health),
        c.withdrawn ? el("span", { class: "badge bad withdrawn" }, "withdrawn") : null),
      el("dl", {},
        el("dt", {}, "locality"), el("dd", {}, `${text(c.region)} / ${text(c.zone)}`),
        el("dt", {}, "network"), el("dd", {}, text(c.network)),
        el("dt", {}, "gateway"), el("dd", {}, c.gateway ? `${c.gateway.address}:${c.gateway.port}` : "-"),
        el("dt", {}, "endpoints"), el("dd", { class: "endpoints" }, c.endpoints),
        el("dt", {}, "heartbeat"), el("dd", { class: "heartbeat", "data-at": c.lastHeartbeat }, ago(secondsSince(c.lastHeartbeat))),
        el("dt", {}, "capacity"), el("dd", { class: "capacity" }, capacityText(c.capacity)),
        el("dt", {}, "taints"), el("dd", {}, taints.length ? taints : "-"),
        c.reason ? [el("dt", {}, "reason"), el("dd", { class: "reason" }, c.reason)] : null));
  });
  $("clusters").replaceChildren(...cards);
}

// The client chooser follows the members; the choice survives a redraw.
function renderClientChoices(clusters) {
  const select = $("client");
  const have = [...select.options].map((o) => o.value).slice(1).join(",");
  const want = clusters.map((c) => c.name).join(",");
  if (have === want) return;
  const chosen = select.value;
  select.replaceChildren(el("option", { value: "" }, "no member cluster"),
    ...clusters.map((c) => el("option", { value: c.name }, c.name)));
  select.value = clusters.some((c) => c.name === chosen) ? chosen : "";
}

// One service as a picture: the client, an arrow, then the tiers in priority order, each
// cluster a bar as wide as its share of the tier's weight; the DNS answer; the EDS priorities.
function renderService(s, client) {
  if (s.error) {
    return el("div", { class: "service", "data-service": s.service },
      el("div", { class: "title" }, s.service), el("div", { class: "error" }, s.error));
  }
  const route = [el("div", { class: "client" }, client || "client of no member cluster")];
  s.tiers.forEach((t, i) => {
    const total = t.clusters.reduce((sum, m) => sum + m.weight, 0) || 1;
    route.push(el("div", { class: "arrow" }, i === 0 ? "→" : "⇢"));
    route.push(el("div", { class: "tier" + (i === 0 ? " first" : ""), "data-priority": t.priority },
      el("div", { class: "label" }, `priority ${t.priority}: ${t.why.join(" + ")} · ${t.ready} ready`),
      t.clusters.map((m) => el("div", { class: "member", "data-cluster": m.cluster, "data-weight": m.weight },
        el("div", { class: "what" },
          `${m.cluster} · weight ${m.weight} (${Math.round((100 * m.weight) / total)} %) · ${m.ready} ready`,
          m.viaGateway ? " · via gateway" : ""),
        el("div", { class: "bar", style: `width: ${Math.max(2, (160 * m.weight) / total)}px` })))));
  });
  if (!s.tiers.length) {
    route.push(el("div", { class: "arrow" }, "→"), el("div", { class: "tier" }, "nowhere: no cluster serves it"));
  }
  const filtered = s.filtered.map((f) =>
    el("div", { class: "filtered", "data-cluster": f.cluster }, `✕ ${f.cluster}: ${f.why}`));
  const dns = el("div", { class: "dns" }, `DNS ${s.dns.name} A → ${s.dns.rcode} `,
    el("span", { class: "answers" }, s.dns.answers.length ? s.dns.answers.join(" ") : "(no addresses)"));
  const eds = (assignments, role, label) => assignments.map((a) => el("div", { class: "eds", "data-resource": a.name, "data-role": role },
    el("div", { class: "muted" }, `xDS (${label}) ${a.name}`),
    el("table", {},
      el("tr", {}, el("th", {}, "priority"), el("th", {}, "cluster"), el("th", {}, "weight"), el("th", {}, "endpoints")),
      ((a.detail && a.detail.localities) || []).map((l) => el("tr", {},
        el("td", {}, l.priority), el("td", {}, text(l.cluster)), el("td", {}, text(l.weight)),
        el("td", {}, l.endpoints.map(endpointBadge)))))));
  return el("div", { class: "service", "data-service": s.service },
    el("div", { class: "title" }, s.service),
    el("div", { class: "route" }, route), filtered, dns,
    el("div", { class: "feeds" },
      el("div", {}, eds(s.eds, "envoy", "Envoy")),
      el("div", {}, eds(s.edsProxyless || [], "proxyless", "proxyless gRPC"))));
}

// One endpoint of an assignment: its address, marked when it is not plainly in use (draining,
// unhealthy) or is another network's gateway.
function endpointBadge(e) {
  const marks = [];
  if (e.viaGateway) marks.push("gateway");
  if (e.health && e.health !== "HEALTHY") marks.push(e.health.toLowerCase());
  const cls = "endpoint" + (marks.includes("draining") ? " draining" : "") + (marks.includes("unhealthy") ? " unhealthy" : "");
  return el("span", { class: cls, "data-health": e.health || "" },
    e.address + (marks.length ? ` (${marks.join(", ")})` : ""), " ");
}

function renderServices(view) {
  $("services").replaceChildren(...view.services.map((s) => renderService(s, view.clientCluster)));
  const shown = view.services.length;
  $("service-count").textContent = shown < view.servicesMatching
    ? `${shown} of ${view.servicesMatching} matching (${view.servicesTotal} in all); filter to see the rest`
    : `${view.servicesMatching} of ${view.servicesTotal}`;
}

function renderPlacements(placements) {
  const decisions = (placements && placements.decisions) || [];
  $("placements-section").hidden = decisions.length === 0;
  $("placements").replaceChildren(...decisions.map((d) => {
    const t = d.template || {};
    const name = `${t.kind || "?"} ${t.namespace || ""}/${t.name || "?"}`;
    const outcome = d.outcome && d.outcome.result === "unschedulable"
      ? el("span", { class: "error" }, `unschedulable: ${d.outcome.reason}`)
      : el("span", { class: "muted" }, d.tier ? `tier ${d.tier}` : "scheduled");
    return el("div", { class: "placement", "data-template": name },
      el("div", {}, el("b", {}, name), " ", outcome),
      el("div", { class: "replicas" }, (d.placed || []).map((p) =>
        el("span", { class: "replica", "data-cluster": p.cluster },
          `${p.cluster}: ${p.replicas === null || p.replicas === undefined ? "whole" : p.replicas}`))),
      (d.excluded || []).length
        ? el("div", { class: "filtered" }, "left out: " + d.excluded.map((x) => x.cluster).join(", "))
        : null);
  }));
}

function problemText(p) {
  if (typeof p !== "object" || p === null) return String(p);
  const where = [p.origin, p.subject, p.file || p.path].filter((x) => x).map(text).join(" ");
  return where ? `${where}: ${p.reason}` : text(p.reason || p);
}

function renderProblems(view) {
  const items = [
    ...(view.problems || []).map((p) => el("li", { class: "problem" }, problemText(p))),
    ...(view.warnings || []).map((p) => el("li", { class: "warning" }, problemText(p))),
  ];
  $("problems").replaceChildren(...(items.length ? items : [el("li", { class: "muted" }, "none")]));
}

function render(view) {
  if (view.error) {
    $("snapshot").textContent = view.error;
    return;
  }
  if (typeof view.now === "number") clockOffset = view.now - Date.now();
  $("snapshot").textContent = `snapshot ${view.version}${view.synced ? "" : " (not synced yet)"}`;
  renderClusters(view.clusters);
  renderClientChoices(view.clusters);
  renderServices(view);
  renderPlacements(view.placements);
  renderProblems(view);
  document.body.dataset.version = view.version;
}

let source = null;

function query() {
  const params = new URLSearchParams();
  const client = $("client").value;
  const filter = $("filter").value.trim();
  if (client) params.set("cluster", client);
  if (filter) params.set("filter", filter);
  const q = params.toString();
  return q ? "?" + q : "";
}

// An address on this page's origin, without the user:password a sign-in may have left in the
// page's own address (fetch refuses those; the admin token's cookie goes with the request).
function here(path) {
  return location.origin + path;
}

// (Re)subscribes for the current choice; the browser reconnects by itself when a stream ends.
function subscribe() {
  if (source) source.close();
  source = new EventSource(here("/ui/events" + query()));
  source.addEventListener("state", (e) => {
    $("live").classList.add("on");
    render(JSON.parse(e.data));
  });
  source.addEventListener("error", () => $("live").classList.remove("on"));
}

// The choice lives in the URL, so a reload or a shared link shows the same client.
// (An empty cluster= is kept too: the client of no member cluster, chosen.)
function remember() {
  const params = new URLSearchParams(query().slice(1));
  params.set("cluster", $("client").value);
  history.replaceState(null, "", location.pathname + "?" + params.toString());
}

function start() {
  setInterval(tickHeartbeats, 1000);
  const params = new URLSearchParams(location.search);
  if (params.has("filter")) $("filter").value = params.get("filter");
  // No client named: the first member's (a client of no member cluster is one choice away).
  const wanted = params.has("cluster") ? params.get("cluster") : null;
  fetch(here("/ui/state")).then((r) => r.json()).then((view) => {
    render(view);
    const first = (view.clusters || [])[0];
    $("client").value = wanted !== null ? wanted : (first ? first.name : "");
    remember();
    subscribe();
  });
  $("client").addEventListener("change", () => { remember(); subscribe(); });
  let typing = null;
  $("filter").addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => { remember(); subscribe(); }, 250);
  });
}

document.addEventListener("DOMContentLoaded", start);
