// managoat dashboard: plain JavaScript over the platform's API, through
// /ui/v1 (the dashboard forwards it with the signed-in key, which no
// script here ever sees). Every state-changing call carries the session's
// CSRF token.
"use strict";

const $ = (s) => document.querySelector(s);
let session = null; // {account, key_id, csrf}
let poll = null;    // the list's polling timer
let closers = [];   // what a view opened (sockets, terminals), closed on leaving it

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? "" : v);
  }
  for (const k of kids) if (k !== null && k !== undefined) e.append(k instanceof Node ? k : String(k));
  return e;
}

// showError shows an API error body ({error: {kind, reason, field, message}}) as the API gives it.
function showError(err) {
  const box = $("#error");
  if (!err) { box.hidden = true; box.textContent = ""; return; }
  const e = err.error || err;
  box.textContent = (e.kind ? e.kind + (e.reason ? "{" + e.reason + "}" : "") + ": " : "") + (e.message || String(err));
  box.hidden = false;
}

class APIError extends Error {
  constructor(status, body) { super((body && body.error && body.error.message) || ("HTTP " + status)); this.status = status; this.body = body; }
}

async function call(method, path, body) {
  const opts = { method, headers: {}, credentials: "same-origin" };
  if (method !== "GET" && method !== "HEAD") opts.headers["X-CSRF-Token"] = session ? session.csrf : "";
  if (body !== undefined) { opts.headers["Content-Type"] = "application/json"; opts.body = JSON.stringify(body); }
  const r = await fetch(path, opts);
  const text = await r.text();
  let j = null;
  try { j = text ? JSON.parse(text) : null; } catch (_) { j = { error: { kind: "unavailable", message: text.slice(0, 300) } }; }
  if (!r.ok) {
    if (r.status === 401 && path !== "/ui/login") { session = null; route(); }
    throw new APIError(r.status, j);
  }
  return j;
}
const api = (method, path, body) => call(method, "/ui/v1" + path, body);
const enc = encodeURIComponent;

function age(t) {
  const s = Math.max(0, (Date.now() - new Date(t).getTime()) / 1000);
  if (s < 60) return Math.floor(s) + "s";
  if (s < 3600) return Math.floor(s / 60) + "m";
  if (s < 86400) return Math.floor(s / 3600) + "h";
  return Math.floor(s / 86400) + "d";
}

function limitsText(l) {
  if (!l) return "none";
  const parts = [];
  if (l.memory_bytes) parts.push((l.memory_bytes / 1048576) + " MiB");
  if (l.cpu_millis) parts.push(l.cpu_millis + "m CPU");
  if (l.pids) parts.push(l.pids + " pids");
  if (l.disk_bytes) parts.push((l.disk_bytes / 1048576) + " MiB disk");
  if (l.wall_clock_ms) parts.push((l.wall_clock_ms / 1000) + " s wall");
  return parts.join(", ") || "none";
}

function rawField(sb, ...names) {
  const r = sb.raw || {};
  for (const n of names) if (r[n] !== undefined && r[n] !== null && r[n] !== "") return r[n];
  return null;
}

function labelsText(sb) {
  const l = sb.labels || rawField(sb, "labels", "metadata");
  if (!l || typeof l !== "object") return "—";
  const ks = Object.keys(l);
  return ks.length ? ks.map((k) => k + "=" + l[k]).join(", ") : "—";
}

// portsOf is the ports a sandbox publishes: GET .../ports, else none.
async function portsOf(name) {
  try { const j = await api("GET", "/sandboxes/" + enc(name) + "/ports"); return j.data || []; } catch (_) { return []; }
}

// previewLinks lists the sandbox's preview links, each with a revoke
// button (DELETE .../previews/{id}).
async function previewLinks(name) {
  const body = $("#sb-previews tbody");
  let list = [];
  try { const j = await api("GET", "/sandboxes/" + enc(name) + "/previews"); list = j.data || []; } catch (e) { showError(e.body || e); }
  const now = Date.now();
  body.replaceChildren(...list.map((l) => {
    const state = l.revoked_at ? "revoked" : (Date.parse(l.expires_at) <= now ? "expired" : "valid");
    const act = el("td", {});
    if (state === "valid") act.append(el("button", { type: "button", class: "revoke", "data-id": l.id, "aria-label": "Revoke preview link " + l.id + " of port " + l.port, onclick: async () => {
      try { await api("DELETE", "/sandboxes/" + enc(name) + "/previews/" + enc(l.id)); showError(null); } catch (e) { showError(e.body || e); }
      previewLinks(name);
    } }, "Revoke"));
    return el("tr", { "data-id": l.id, "data-state": state }, el("td", {}, l.id), el("td", {}, String(l.port)),
      el("td", { title: l.expires_at }, new Date(l.expires_at).toLocaleTimeString()), el("td", {}, state), act);
  }));
}

function portLinks(name, ports, into) {
  for (const p of ports) {
    const li = el("li", {}, el("a", { href: p.url, class: "port-api", title: "the API's proxy of the port (needs the key)" }, String(p.port)), " ");
    const b = el("button", { type: "button", class: "preview", "data-port": p.port, "aria-label": "Preview link for port " + p.port, onclick: async () => {
      try {
        const v = await api("POST", "/sandboxes/" + enc(name) + "/preview", { port: p.port });
        li.querySelector(".preview-link")?.remove();
        li.append(el("a", { class: "preview-link", href: v.url, target: "_blank", rel: "noopener noreferrer" }, "open port " + p.port + " (link valid until " + new Date(v.expires_at).toLocaleTimeString() + ")"));
        showError(null);
        previewLinks(name);
      } catch (e) { showError(e.body || e); }
    } }, "Preview link");
    li.append(b);
    into.append(li);
  }
}

// ---- views

function showView(id) {
  for (const v of document.querySelectorAll("main > section")) v.hidden = v.id !== id;
}

function leave() {
  if (poll) { clearInterval(poll); poll = null; }
  for (const c of closers) { try { c(); } catch (_) {} }
  closers = [];
}

async function route() {
  leave();
  if (!session) {
    try { session = await call("GET", "/ui/session"); } catch (_) { session = null; }
  }
  $("#account").hidden = !session;
  if (!session) { showView("view-signin"); $("#key").focus(); return; }
  $("#who").textContent = "account " + session.account;
  const h = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  if (h[0] === "sb" && h[1] && h[2] === "session" && h[3]) return viewSession(h[1], h[3]);
  if (h[0] === "sb" && h[1]) return viewSandbox(h[1]);
  return viewList();
}

let listed = [];
function renderList() {
  const q = $("#filter").value.trim().toLowerCase();
  const tb = $("#sandboxes tbody");
  const rows = listed.filter((sb) => !q || [sb.name, sb.state, sb.provider, sb.image || "", labelsText(sb)].join(" ").toLowerCase().includes(q));
  tb.replaceChildren(...rows.map((sb) => {
    const act = el("td", { class: "actions" });
    const op = (label, fn) => act.append(el("button", { type: "button", "aria-label": label + " " + sb.name, onclick: fn }, label), " ");
    if (sb.state === "running") op("Suspend", () => lifecycle(sb.name, "suspend"));
    if (sb.state === "suspended" || sb.state === "parked") op("Resume", () => lifecycle(sb.name, "resume"));
    op("Delete", () => { if (confirm("Delete sandbox " + sb.name + "?")) lifecycle(sb.name, "delete"); });
    const ports = el("td", {}, el("ul", { class: "ports" }));
    const m = /\/ports\/(\d+)\//.exec(sb.url || "");
    if (m) ports.firstChild.append(el("li", {}, el("a", { href: "#/sb/" + enc(sb.name) }, m[1])));
    return el("tr", { "data-name": sb.name },
      el("td", {}, el("a", { href: "#/sb/" + enc(sb.name) }, sb.name)),
      el("td", {}, el("span", { class: "state state-" + sb.state }, sb.state)),
      el("td", {}, sb.provider),
      el("td", {}, rawField(sb, "mechanism") || "—"),
      el("td", {}, sb.image || "—"),
      el("td", {}, limitsText(sb.limits)),
      el("td", {}, labelsText(sb)),
      el("td", { title: sb.created_at }, age(sb.created_at)),
      ports, act);
  }));
  $("#count").textContent = rows.length + " of " + listed.length;
}

async function refreshList() {
  try { const j = await api("GET", "/sandboxes"); listed = j.data || []; renderList(); }
  catch (e) { if (e.status !== 401) showError(e.body || e); }
}

async function lifecycle(name, op) {
  try {
    if (op === "delete") await api("DELETE", "/sandboxes/" + enc(name));
    else await api("POST", "/sandboxes/" + enc(name) + "/" + op, {});
    showError(null);
  } catch (e) { showError(e.body || e); }
  refreshList();
}

let providersLoaded = false;
async function viewList() {
  showView("view-list");
  if (!providersLoaded) {
    try {
      const j = await api("GET", "/providers");
      const sel = $("#c-provider");
      for (const p of (j.data || j)) if (p.enabled) sel.append(el("option", { value: p.name }, p.name + (p.default ? " (default)" : "")));
      providersLoaded = true;
    } catch (_) {}
  }
  await refreshList();
  poll = setInterval(refreshList, 2000);
}

function numbers(s) { return s.split(/[\s,]+/).filter(Boolean).map(Number); }

async function createSandbox(ev) {
  ev.preventDefault();
  const f = ev.target;
  const v = (id) => $(id).value.trim();
  const req = { name: v("#c-name") };
  if (v("#c-provider")) req.provider = v("#c-provider");
  if (v("#c-image")) req.image = v("#c-image");
  if (v("#c-labels")) {
    req.labels = {};
    for (const kv of v("#c-labels").split(/\s*,\s*/).filter(Boolean)) {
      const i = kv.indexOf("=");
      if (i < 0) { showError({ error: { kind: "invalid", field: "labels", message: "labels: " + JSON.stringify(kv) + " is not key=value" } }); return; }
      req.labels[kv.slice(0, i).trim()] = kv.slice(i + 1).trim();
    }
  }
  const l = {};
  if (v("#c-mem")) l.memory_bytes = Number(v("#c-mem")) * 1048576;
  if (v("#c-cpu")) l.cpu_millis = Number(v("#c-cpu"));
  if (v("#c-pids")) l.pids = Number(v("#c-pids"));
  if (v("#c-disk")) l.disk_bytes = Number(v("#c-disk")) * 1048576;
  if (Object.keys(l).length) req.limits = l;
  if (v("#c-publish")) req.publish = numbers(v("#c-publish"));
  const btn = f.querySelector("button[type=submit]");
  btn.disabled = true;
  try {
    await api("POST", "/sandboxes", req);
    if (v("#c-allow")) await api("PUT", "/sandboxes/" + enc(req.name) + "/network-policy", { allow: v("#c-allow").split(/[\s,]+/).filter(Boolean) });
    showError(null);
    f.reset();
  } catch (e) { showError(e.body || e); }
  btn.disabled = false;
  refreshList();
}

async function viewSandbox(name) {
  showView("view-sandbox");
  $("#sb-h").textContent = "Sandbox " + name;
  $("#terminal").hidden = true;
  let sb;
  try { sb = await api("GET", "/sandboxes/" + enc(name)); showError(null); }
  catch (e) { showError(e.body || e); $("#sb-info").replaceChildren(); $("#sessions tbody").replaceChildren(); $("#sb-ports").replaceChildren(); $("#sb-previews tbody").replaceChildren(); return; }
  const info = [["State", sb.state + (sb.status ? " (provider: " + sb.status + ")" : "")], ["Provider", sb.provider], ["Mechanism", rawField(sb, "mechanism") || "—"],
    ["Image", sb.image || "—"], ["Limits", limitsText(sb.limits)], ["Labels", labelsText(sb)], ["Created", new Date(sb.created_at).toLocaleString() + " (" + age(sb.created_at) + " ago)"],
    ["Capabilities", (sb.capabilities || []).join(", ") || "—"]];
  $("#sb-info").replaceChildren(...info.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  const acts = $("#sb-actions");
  acts.replaceChildren();
  const op = (label, o) => acts.append(el("button", { type: "button", onclick: async () => { await lifecycle(name, o); if (o === "delete") location.hash = "#/"; else viewSandbox(name); } }, label));
  op("Suspend", "suspend"); op("Resume", "resume"); op("Delete", "delete");
  const ul = $("#sb-ports");
  ul.replaceChildren();
  const ports = await portsOf(name);
  if (!ports.length) ul.append(el("li", {}, "none"));
  portLinks(name, ports, ul);
  previewLinks(name);
  $("#term-form").onsubmit = (ev) => { ev.preventDefault(); openTerminal(name, $("#term-cmd").value.trim() || "/bin/sh"); };
  const refresh = async () => {
    try {
      const j = await api("GET", "/sandboxes/" + enc(name) + "/sessions");
      const list = j.data || j.sessions || j || [];
      $("#sessions tbody").replaceChildren(...list.map((s) => el("tr", { "data-session": s.id },
        el("td", {}, el("code", {}, s.id)), el("td", {}, s.command || ""), el("td", {}, s.state || "—"),
        el("td", {}, s.exit_code === undefined || s.exit_code === null ? "" : String(s.exit_code)),
        el("td", {}, s.created_at ? age(s.created_at) + " ago" : ""),
        el("td", {}, el("a", { href: "#/sb/" + enc(name) + "/session/" + enc(s.id) }, "Follow output")))));
    } catch (e) { if (e.status !== 401) showError(e.body || e); }
  };
  await refresh();
  poll = setInterval(refresh, 3000);
}

function wsURL(name) {
  return (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ui/v1/sandboxes/" + enc(name) + "/stream?csrf=" + enc(session.csrf);
}

const utf8 = new TextEncoder();
function b64(bytes) { let s = ""; for (const b of bytes) s += String.fromCharCode(b); return btoa(s); }

function newTerm(into, opts) {
  into.replaceChildren();
  const term = new Terminal(Object.assign({ convertEol: false, fontSize: 14, scrollback: 5000, screenReaderMode: false }, opts));
  const fit = new FitAddon.FitAddon();
  term.loadAddon(fit);
  term.open(into);
  try { fit.fit(); } catch (_) {}
  const onResize = () => { try { fit.fit(); } catch (_) {} };
  window.addEventListener("resize", onResize);
  closers.push(() => { window.removeEventListener("resize", onResize); term.dispose(); });
  return term;
}

// openTerminal spawns cmd with a pty through the stream API and wires it to xterm.js.
function openTerminal(name, cmd) {
  const box = $("#terminal");
  box.hidden = false;
  const term = newTerm(box, {});
  const ws = new WebSocket(wsURL(name));
  ws.binaryType = "arraybuffer";
  let id = 0;
  const send = (m) => { if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(m)); };
  closers.push(() => ws.close());
  ws.onopen = () => {
    const parts = cmd.split(/\s+/);
    ws.send(JSON.stringify({ op: "spawn", cmd: parts[0], args: parts.slice(1), tty: true, stdin: true, rows: term.rows, cols: term.cols, env: ["TERM=xterm-256color"] }));
  };
  ws.onmessage = (ev) => {
    if (typeof ev.data !== "string") { term.write(new Uint8Array(ev.data, 1)); return; }
    const m = JSON.parse(ev.data);
    if (m.type === "started") { box.dataset.session = m.session_id || ""; term.focus(); }
    else if (m.type === "exit") term.write("\r\n[exited with code " + m.code + "]\r\n");
    else if (m.type === "error") { term.write("\r\n[" + m.error.kind + ": " + m.error.message + "]\r\n"); showError({ error: m.error }); }
    else if (m.type === "ack" && m.error && m.error.reason !== "json") showError({ error: m.error });
  };
  ws.onclose = () => term.write("\r\n[disconnected]\r\n");
  term.onData((d) => send({ type: "stdin", id: ++id, data: b64(utf8.encode(d)) }));
  box.dataset.size = term.rows + " " + term.cols;
  term.onResize(({ rows, cols }) => { box.dataset.size = rows + " " + cols; send({ type: "resize", id: ++id, rows, cols }); });
}

// viewSession follows a session's output from its journal. On a
// reconnect the attach carries the offset (the bytes already shown): the
// server skips them as it replays the journal, so nothing is lost or
// shown twice; a server that does not say it skipped them is skipped here.
function viewSession(name, sid) {
  showView("view-session");
  $("#ss-h").textContent = "Session " + sid + " of " + name;
  const box = $("#ss-output");
  const term = newTerm(box, { disableStdin: true, convertEol: true });
  box.term = term; // for tests and the console: the terminal's buffer
  let offset = 0, done = false, stopped = false, ws = null, reconnects = 0;
  closers.push(() => { stopped = true; if (ws) ws.close(); });
  const status = (s) => { $("#ss-status").textContent = s; $("#ss-offset").textContent = "offset " + offset + " bytes"; box.dataset.offset = offset; box.dataset.reconnects = reconnects; };
  const connect = () => {
    let skip = 0; // bytes to drop here: a server that replays from 0
    const asked = offset;
    ws = new WebSocket(wsURL(name));
    box.socket = ws;
    ws.binaryType = "arraybuffer";
    ws.onopen = () => ws.send(JSON.stringify({ op: "attach", session_id: sid, offset: asked }));
    ws.onmessage = (ev) => {
      if (typeof ev.data !== "string") {
        let b = new Uint8Array(ev.data, 1);
        if (skip > 0) { const k = Math.min(skip, b.length); skip -= k; b = b.subarray(k); }
        if (!b.length) return;
        offset += b.length;
        term.write(b);
        status("following");
        return;
      }
      const m = JSON.parse(ev.data);
      if (m.type === "started") { skip = (m.offset || 0) === asked ? 0 : asked; status("following"); }
      else if (m.type === "exit") { done = true; status("exited with code " + m.code); box.dataset.exit = m.code; }
      else if (m.type === "error") { done = true; status(m.error.kind + ": " + m.error.message); showError({ error: m.error }); }
    };
    ws.onclose = () => {
      if (done || stopped) return;
      reconnects++;
      status("reconnecting from offset " + offset);
      setTimeout(() => { if (!stopped) connect(); }, 300);
    };
  };
  status("connecting");
  connect();
}

// ---- wiring

document.addEventListener("DOMContentLoaded", () => {
  $("#signin-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      session = await call("POST", "/ui/login", { key: $("#key").value });
      $("#key").value = "";
      showError(null);
      route();
    } catch (e) { showError(e.body || e); }
  });
  $("#signout").addEventListener("click", async () => {
    try { await call("POST", "/ui/logout"); } catch (_) {}
    session = null;
    location.hash = "#/";
    route();
  });
  $("#filter").addEventListener("input", renderList);
  $("#create-form").addEventListener("submit", createSandbox);
  window.addEventListener("hashchange", route);
  route();
});
