// greenroom's steering console (docs/console.md): plain JS over the public HTTP API, no library.
"use strict";

const $ = (id) => document.getElementById(id);
const PALETTE = ["#1f6f4a", "#c0392b", "#2c5fa8", "#b7791f", "#7b3fa0", "#138d90", "#8a5a44", "#d6336c"];
const ui = {
  key: sessionStorage.getItem("greenroom.key") || "",
  models: [], // GET /api/models
  steering: {}, // model → its steering state (GET /api/steering)
  labels: {}, // sae_id → feature → label (clusters' members, readouts, dashboards)
  last: null, // the last chat: {body, tokens, activations}
  picked: null, // {sae, index, perStrength: the SAELens coefficient a strength of 1 is, null while unknown}
  since: 0, // monitoring: the next `since`
  records: [],
};

// --- the API ---------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, body) {
    const err = body && body.error;
    super((err && (err.message || err)) || `HTTP ${status}`);
    this.status = status;
    this.code = err && err.code;
  }
}

async function call(path, { method, body, signal } = {}) {
  const headers = {};
  if (ui.key) headers.Authorization = `Bearer ${ui.key}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method: method || (body === undefined ? "GET" : "POST"),
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
  });
  if (response.status === 401) askKey();
  if (!response.ok) throw new ApiError(response.status, await response.json().catch(() => null));
  return response;
}

const api = async (path, options) => (await call(path, options)).json();

function say(text, error = false) {
  const status = $("status");
  status.textContent = text;
  status.classList.toggle("error", error);
}

function guarded(fn) {
  return async (...args) => {
    try {
      await fn(...args);
    } catch (err) {
      say(err.message, true);
    }
  };
}

function askKey() {
  const dialog = $("key-dialog");
  if (!dialog.open) dialog.showModal();
}

// --- small DOM helpers -------------------------------------------------------------------

function h(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "on") for (const [event, fn] of Object.entries(v)) node.addEventListener(event, guarded(fn));
    else if (k === "data") Object.assign(node.dataset, v);
    else node[k] = v;
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

function table(id, columns, rows) {
  const head = h("tr", {}, ...columns.map((c) => h("th", {}, c)));
  const body = rows.map((cells) =>
    h("tr", {}, ...cells.map((c) => (c instanceof Node && c.tagName === "TD" ? c : h("td", {}, c ?? "")))),
  );
  $(id).replaceChildren(h("thead", {}, head), h("tbody", {}, ...body));
}

const fmt = (x) => String(Number(x.toPrecision(6)));
const at = (sae) => `/api/saes/${encodeURIComponent(sae)}`;
const ofModel = () => `?model=${encodeURIComponent(model())}`;
// An activation's shade, as the heatmap and a dashboard's contexts draw it.
const shade = (value, peak) => `rgba(31, 111, 74, ${(0.08 + (0.8 * Math.max(0, value)) / peak).toFixed(3)})`;
const num = (value) => h("td", { className: "num" }, value === null || value === undefined ? "-" : String(value));
const mb = (bytes) => (bytes ? Math.round(bytes / 2 ** 20) : null);
const model = () => $("model").value;

// --- models ------------------------------------------------------------------------------

async function refreshModels() {
  const [models, steering] = await Promise.all([api("/api/models"), api("/api/steering")]);
  ui.models = models.models;
  ui.steering = Object.fromEntries(steering.models.map((s) => [s.model, s]));
  const select = $("model");
  const chosen = select.value || localStorage.getItem("greenroom.model");
  const steerable = ui.models.find((m) => ui.steering[m.id] && m.state === "loaded") || ui.models[0];
  if ([...select.options].map((o) => o.value).join() !== ui.models.map((m) => m.id).join()) {
    select.replaceChildren(...ui.models.map((m) => h("option", { value: m.id }, m.id))); // an open list stays open
  }
  select.value = ui.models.some((m) => m.id === chosen) ? chosen : steerable ? steerable.id : "";
}

// --- tree ---------------------------------------------------------------------------------

async function refreshTree() {
  const [tree] = await Promise.all([api("/api/actors"), refreshModels()]);
  const s = tree.server;
  $("server-line").textContent =
    `greenroom ${s.version} (pid ${s.pid}) on ${s.listening.join(", ")}, up ${Math.round(s.uptime_s)} s`;
  table(
    "actors",
    ["name", "host", "pid", "state", "queue", "RSS MB", "memory free MB", "restarts", "models", "last error"],
    tree.actors.map((a) => {
      const memory = a.counters && a.counters.memory;
      return [
        a.name,
        a.host,
        num(a.pid),
        h("td", { className: `state-${a.state}` }, a.state),
        num(a.queue_depth),
        num(mb(a.rss_bytes)),
        num(memory ? `${mb(memory.free_bytes)} / ${mb(memory.total_bytes)}` : null),
        num(a.restarts),
        a.models.join(", ") || "-",
        a.last_error || "",
      ];
    }),
  );
  table(
    "models",
    ["model", "state", "engine", "size MB", "actor", ""],
    ui.models.map((m) => {
      const loaded = m.state === "loaded";
      const button = h(
        "button",
        { className: "small", type: "button", on: { click: () => loadOrUnload(m.id, loaded ? "unload" : "load") } },
        loaded ? "Unload" : "Load",
      );
      button.disabled = !["loaded", "unloaded"].includes(m.state);
      return [m.id, h("td", { className: `state-${m.state}` }, m.state), m.engine, num(mb(m.footprint_bytes)), m.actor, h("td", {}, button)];
    }),
  );
}

async function loadOrUnload(id, verb) {
  say(`${verb}ing ${id}…`);
  await api(`/api/models/${verb}`, { body: { model: id } });
  say(`${id} ${verb}ed`);
  await refreshTree();
}

// --- chat ---------------------------------------------------------------------------------

async function* events(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
        else if (line.startsWith("event:")) event = line.slice(6).trim();
      }
      if (data.length && data[0] !== "[DONE]") yield { event, data: JSON.parse(data.join("\n")) };
    }
  }
}

const SHOWN_HEADERS = /^x-(millm|greenroom|request-id)/i;

// Streams one chat completion into `into` (its X-* headers into `headersInto`); resolves to what came.
async function stream(body, into, headersInto) {
  into.textContent = "";
  const response = await call("/v1/chat/completions", { body: { ...body, stream: true } });
  const shown = [...response.headers].filter(([name]) => SHOWN_HEADERS.test(name));
  headersInto.replaceChildren(...shown.flatMap(([name, value]) => [h("dt", {}, name), h("dd", {}, value)]));
  const out = { text: "", tokens: [], activations: null, usage: null };
  for await (const { event, data } of events(response)) {
    if (event === "error" || data.error) throw new ApiError(500, data);
    if (data.millm && data.millm.sae_activations) out.activations = data.millm.sae_activations;
    if (data.usage) out.usage = data.usage;
    const choice = data.choices && data.choices[0];
    if (!choice) continue;
    if (choice.delta && choice.delta.content) {
      out.text += choice.delta.content;
      into.textContent = out.text;
    }
    if (choice.logprobs && choice.logprobs.content) out.tokens.push(...choice.logprobs.content.map((t) => t.token));
  }
  into.dataset.done = "true";
  return out;
}

function chatBody() {
  const body = {
    model: model(),
    messages: [{ role: "user", content: $("prompt").value }],
    max_tokens: Number($("max-tokens").value) || 32,
    temperature: Number($("temperature").value),
  };
  if ($("seed").value !== "") body.seed = Number($("seed").value);
  if ($("profile").value) body.profile = $("profile").value;
  const intensity = $("intensity").value.trim();
  if (intensity) body.steering_intensity = Number.isNaN(Number(intensity)) ? intensity : Number(intensity);
  return body;
}

// The answer with its tokens and activations (the heatmap's), and beside it the same request unsteered.
async function chat(body) {
  const steers = Boolean(ui.steering[body.model]);
  const read = steers ? { logprobs: true, return_sae_activations: { top_k: 8, positions: "completion" } } : {};
  $("send").disabled = true;
  $("answer").dataset.done = $("plain").dataset.done = "false";
  say("generating…");
  try {
    const plain = { ...body, steering_intensity: "off" };
    delete plain.profile;
    const compare = steers && $("compare").checked;
    $("plain-pane").hidden = !compare;
    const [steered] = await Promise.all([
      stream({ ...body, ...read }, $("answer"), $("answer-headers")),
      compare ? stream(plain, $("plain"), $("plain-headers")) : null,
    ]);
    ui.last = { body, ...steered };
    renderHeatmap();
    say(steered.usage ? `${steered.usage.completion_tokens} tokens` : "done");
    return steered;
  } finally {
    $("send").disabled = false;
  }
}

async function refreshProfiles() {
  const [profiles, clusters] = await Promise.all([api("/api/profiles"), api("/api/clusters")]);
  const mine = (list) => list.filter((p) => p.model === model());
  const select = $("profile");
  const kept = select.value;
  select.replaceChildren(
    h("option", { value: "" }, "(live steering)"),
    ...mine(profiles.profiles).map((p) => h("option", { value: p.name }, `profile ${p.name}`)),
    ...mine(clusters.clusters).map((c) => h("option", { value: c.name }, `cluster ${c.name}`)),
  );
  select.value = [...select.options].some((o) => o.value === kept) ? kept : "";
  for (const c of clusters.clusters) {
    for (const m of c.members) if (m.label) (ui.labels[c.sae_id] ||= {})[m.feature] = m.label;
  }
  return { profiles: profiles.profiles, clusters: clusters.clusters };
}

// --- features ------------------------------------------------------------------------------

function renderHeatmap() {
  const map = $("heatmap");
  const last = ui.last;
  if (!last || !last.activations) {
    map.textContent = "Chat with a model that has an SAE attached; its answer's tokens show here.";
    return;
  }
  const positions = last.activations.positions;
  const first = positions.length ? positions[0].position : 0;
  const peak = Math.max(1e-9, ...positions.flatMap((p) => p.features.map((f) => f.value)));
  const spans = last.tokens.map((token, i) => {
    const read = positions.find((p) => p.position === first + i);
    const top = read && read.features.length ? read.features[0].value : 0;
    const span = h("span", { title: read ? `position ${read.position}: top ${top.toFixed(2)}` : "not read (never fed back)" }, token);
    if (read) {
      span.style.background = shade(top, peak);
      span.addEventListener("click", () => pickToken(span, read, token));
    }
    return span;
  });
  map.replaceChildren(...spans);
}

function pickToken(span, read, token) {
  for (const other of $("heatmap").children) other.classList.remove("picked");
  span.classList.add("picked");
  $("token-name").textContent = `of ${JSON.stringify(token)} (position ${read.position})`;
  const sae = ui.last.activations.sae_id;
  for (const f of read.features) if (f.label) (ui.labels[sae] ||= {})[f.index] = f.label;
  table(
    "token-features",
    ["feature", "activation", "label", ""],
    read.features.map((f) => [
      num(f.index),
      num(f.value.toFixed(3)),
      (ui.labels[sae] || {})[f.index] || "",
      h("td", {}, h("button", { className: "small", type: "button", on: { click: () => pickFeature(sae, f.index) } }, "dial")),
    ]),
  );
}

async function pickFeature(sae, index) {
  ui.picked = { sae, index, perStrength: null };
  featureTitle();
  $("feature-panel").hidden = false;
  $("regenerated").textContent = "";
  await Promise.all([showDashboard(sae, index), showUnits(ui.picked)]);
}

function featureTitle() {
  const { sae, index } = ui.picked;
  const label = (ui.labels[sae] || {})[index];
  $("feature-title").textContent = `${sae} feature ${index}${label ? ` — ${label}` : ""}`;
}

// The feature's dashboard (GET /api/saes/{id}/features/{index}): its label, the tokens its decoder
// direction promotes and suppresses, its density and its top-activating contexts, each token shaded.
async function showDashboard(sae, index) {
  const d = await api(`${at(sae)}/features/${index}${ofModel()}`);
  if (d.label) (ui.labels[sae] ||= {})[index] = d.label;
  featureTitle();
  const chips = (list) => list.map((t) => h("code", { title: fmt(t.value) }, JSON.stringify(t.text)));
  const parts = [];
  if (d.logit_effects) {
    parts.push(
      h("p", { className: "logits" }, "promotes ", ...chips(d.logit_effects.promoted)),
      h("p", { className: "logits" }, "suppresses ", ...chips(d.logit_effects.suppressed)),
    );
  }
  if (d.density !== null) parts.push(h("p", { className: "hint" }, `active at ${fmt(100 * d.density)} % of ${d.tokens} corpus tokens`));
  if (d.contexts && d.contexts.length) {
    const peak = Math.max(1e-9, ...d.contexts.map((c) => c.max));
    parts.push(
      h("h4", {}, "Top contexts"),
      ...d.contexts.map((c) =>
        h("p", { className: "heatmap context" }, ...c.tokens.map((t, i) => {
          const span = h("span", { title: fmt(t.activation), className: i === c.max_position ? "picked" : "" }, t.text);
          span.style.background = shade(t.activation, peak);
          return span;
        })),
      ),
    );
  }
  $("dashboard").replaceChildren(
    ...(parts.length ? parts : [h("p", { className: "hint" }, `no dashboard computed for feature ${index} yet (POST ${at(sae)}/dashboards)`)]),
  );
}

// A strength in both units (docs/steering.md, "What a strength means"): the spec's (a % of the
// hook point's typical residual norm ρ_L, ±200) and the SAELens coefficient it equals for this
// feature, c = s × ρ_L / (100 × ‖W_dec[i]‖), from the server's residual_norm and decoder norm.
async function showUnits(picked) {
  const { sae, index } = picked;
  const info = await api(`${at(sae)}${ofModel()}`);
  if (ui.picked !== picked) return; // another feature was dialled meanwhile
  const norm = info.decoder_norms[index];
  const per = info.residual_norm === null || !norm ? null : info.residual_norm / (100 * norm);
  picked.perStrength = per;
  const coefficient = $("coefficient");
  coefficient.disabled = per === null;
  coefficient.min = per === null ? "" : -200 * per;
  coefficient.max = per === null ? "" : 200 * per;
  $("strength-units").textContent =
    per === null
      ? `strength: % of the layer's typical residual norm (±200); no SAELens coefficient: ${
          info.residual_norm === null
            ? "this SAE's residual norm is not measured yet (it is once the model loads with it)"
            : "this feature's decoder row is zero"
        }`
      : `strength: % of the layer's typical residual norm ρ = ${fmt(info.residual_norm)} (±200); ` +
        `coefficient: × W_dec[${index}], ‖W_dec[${index}]‖ = ${fmt(norm)}, so ${fmt(per)} per 1 %`;
  showStrength(liveStrength());
}

const liveStrength = () => ((ui.steering[model()] || {}).strengths || {})[ui.picked.sae]?.[ui.picked.index] || 0;

// The slider and the spec's value at `strength`, the coefficient beside them.
function showStrength(strength, slider = true) {
  if (slider) $("strength").value = strength;
  $("strength-value").value = fmt(strength);
  const per = ui.picked.perStrength;
  $("coefficient").value = per === null ? "" : fmt(strength * per);
}

// Writes the feature's live strength — the slider's number, or {coefficient} typed, which the
// server converts — with the model's other strengths kept (PUT /api/steering), shows what is
// stored, and regenerates the last prompt under the live steering.
async function setStrength(value) {
  const { sae, index } = ui.picked;
  $("regenerated").dataset.done = "false";
  const strengths = structuredClone(ui.steering[model()].strengths || {});
  (strengths[sae] ||= {})[index] = value;
  if (value === 0) delete strengths[sae][index];
  try {
    ui.steering[model()] = await api("/api/steering", { method: "PUT", body: { model: model(), strengths } });
  } finally {
    showStrength(liveStrength()); // what is stored, a refused value undone
  }
  const stored = liveStrength();
  const shown = `feature ${index} at ${fmt(stored)}${value.coefficient !== undefined ? ` (coefficient ${value.coefficient})` : ""}`;
  say(`${shown}…`);
  const body = { ...ui.last.body };
  delete body.profile;
  delete body.steering_intensity;
  const again = await stream(body, $("regenerated"), h("dl"));
  say(`regenerated with ${shown}: ${again.text.length} characters`);
}

// --- profiles, clusters, circuits -----------------------------------------------------------

function activeName(kind) {
  const active = (ui.steering[model()] || {}).active;
  return active && active.kind === kind ? active.name : null;
}

async function activate(kind, name) {
  ui.steering[model()] = await api(`/api/${kind}s/${encodeURIComponent(name)}/activate`, { method: "POST" });
  say(`${kind} ${name} active`);
  await refreshSteering();
}

async function dial(kind, name, intensity) {
  const answer = await api(`/api/${kind}s/${encodeURIComponent(name)}/intensity`, { method: "PUT", body: { intensity } });
  say(`${kind} ${name} dialled to ${intensity}`);
  if (answer.state) ui.steering[model()] = answer.state;
  await refreshSteering();
}

function dialCell(kind, item, cap) {
  const slider = h("input", { type: "range", min: 0, max: cap, step: 0.05, value: item.intensity });
  const shown = h("output", {}, item.intensity.toFixed(2));
  slider.addEventListener("input", () => (shown.value = Number(slider.value).toFixed(2)));
  slider.addEventListener("change", guarded(() => dial(kind, item.name, Number(slider.value))));
  return h("td", {}, slider, " ", shown);
}

// Activate, or for the active one its badge and Off (its strengths cleared: nothing active then).
function activeCell(kind, name) {
  const button = (text, fn) => h("button", { className: "small", type: "button", on: { click: fn } }, text);
  if (activeName(kind) !== name) return h("td", {}, button("Activate", () => activate(kind, name)));
  return h("td", {}, h("span", { className: "badge" }, "active"), " ", button("Off", () => setLive({ strengths: {} })));
}

const strengthsText = (strengths) =>
  Object.entries(strengths || {})
    .map(([sae, fs]) => `${sae}: ${Object.entries(fs).map(([f, s]) => `${f}→${s}`).join(" ")}`)
    .join("; ");

async function refreshSteering() {
  const [{ profiles, clusters }, circuits, active] = await Promise.all([
    refreshProfiles(),
    api("/api/circuits"),
    api(`/api/circuits/active?model=${encodeURIComponent(model())}`),
    refreshModels(),
  ]);
  const state = ui.steering[model()];
  $("steering-enabled").checked = Boolean(state && state.enabled);
  $("steering-enabled").disabled = $("steering-clear").disabled = !state;
  $("live").textContent = state
    ? `version ${state.version}${state.live ? " (live)" : " (not yet live)"}; active: ${state.active ? `${state.active.kind} ${state.active.name}` : "none"}; strengths: ${strengthsText(state.strengths) || "none"}`
    : `${model()} does not steer`;
  const mine = (list) => list.filter((p) => p.model === model());
  table(
    "profiles",
    ["name", "description", "strengths", ""],
    mine(profiles)
      .filter((p) => !p.cluster) // a cluster is a profile too: listed below, with its dial
      .map((p) => [p.name, p.description, strengthsText(p.strengths), activeCell("profile", p.name)]),
  );
  table(
    "clusters",
    ["name", "members", "range", "dial (persistent)", ""],
    mine(clusters).map((c) => [
      c.name,
      c.members.map((m) => `${m.feature}→${m.strength}${m.label ? ` (${m.label})` : ""}`).join(", "),
      c.intensity_range ? c.intensity_range.join("–") : "-",
      dialCell("cluster", c, c.intensity_range ? Math.min(2, c.intensity_range[1]) : 2),
      activeCell("cluster", c.name),
    ]),
  );
  const serving = active.models[0] || {};
  table(
    "circuits",
    ["name", "rung", "layers", "range", "intensity", "serving", ""],
    mine(circuits.circuits).map((c) => [
      c.name,
      `${c.rung}: ${c.language}`,
      c.layers.map((l) => `L${l.layer}: ${l.members.map((m) => `${m.feature}→${m.strength}`).join(" ")}`).join("; "),
      c.intensity_range ? c.intensity_range.join("–") : "-",
      dialCell("circuit", c, 2),
      serving.circuit && serving.circuit.name === c.name ? `${serving.serving_mode}${serving.reason ? ` (${serving.reason})` : ""}` : "-",
      activeCell("circuit", c.name),
    ]),
  );
}

async function setLive(body) {
  ui.steering[model()] = await api("/api/steering", { method: "PUT", body: { model: model(), ...body } });
  await refreshSteering();
}

// --- monitoring --------------------------------------------------------------------------------

// Writes run one after another, each reading the controls as they are when it runs; while one is
// pending a refresh leaves the controls alone, so a poll's older answer never undoes a click.
let monitoringWrites = Promise.resolve();
let monitoringPending = 0;

async function refreshMonitoring() {
  const config = (await api("/api/monitoring")).models.find((m) => m.model === model());
  if (!monitoringPending) {
    $("mon-enabled").checked = Boolean(config && config.enabled);
    $("mon-enabled").disabled = $("mon-topk").disabled = !config;
    if (config && document.activeElement !== $("mon-topk")) $("mon-topk").value = config.top_k;
  }
  const page = await api(`/api/monitoring/records?model=${encodeURIComponent(model())}&since=${ui.since}&limit=500`);
  if (page.next > ui.since) { // a poll and a write's refresh may both ask for the same page: kept once
    ui.records = [...ui.records, ...page.records.filter((r) => r.id > ui.since)].slice(-1000);
    ui.since = page.next;
  }
  plot();
}

function setMonitoring() {
  monitoringPending++;
  const write = async () => {
    try {
      const [enabled, top_k] = [$("mon-enabled").checked, Number($("mon-topk").value)];
      await api("/api/monitoring", { method: "PUT", body: { model: model(), enabled, top_k } });
      say(`monitoring ${enabled ? "on" : "off"}, top ${top_k}`);
    } finally {
      monitoringPending--;
    }
    await refreshMonitoring();
  };
  monitoringWrites = monitoringWrites.then(write, write);
  return monitoringWrites;
}

// Each monitored feature's max (or mean) per request over time: the features seen most often in the
// window, one line each.
function plot() {
  const svg = $("mon-plot");
  const measure = $("mon-value").value;
  const span = Number($("mon-window").value); // seconds shown; 0: every record kept
  const now = Date.now() / 1000;
  const records = ui.records.filter((r) => r.model === model() && (!span || r.time >= now - span));
  const W = 640, H = 260, L = 44, R = 10, T = 10, B = 28;
  const shapes = [];
  const line = (x1, y1, x2, y2, stroke) => svgNode("line", { x1, y1, x2, y2, stroke });
  shapes.push(line(L, H - B, W - R, H - B, "#999"), line(L, T, L, H - B, "#999"));
  $("mon-note").textContent = records.length
    ? `${records.length} records; each point a request's ${measure} activation of the feature (over every position fed)`
    : "no records in this window: turn monitoring on and chat";
  const counts = new Map();
  for (const r of records) for (const f of r.features) counts.set(f.index, (counts.get(f.index) || 0) + 1);
  const top = [...counts.entries()].sort((a, b) => b[1] - a[1]).slice(0, PALETTE.length).map(([index]) => index);
  const t0 = span ? now - span : records.length ? Math.min(...records.map((r) => r.time)) : now - 60;
  const t1 = Math.max(t0 + 1, now);
  const ymax = Math.max(1e-9, ...records.flatMap((r) => r.features.map((f) => f[measure])));
  const x = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R);
  const y = (v) => H - B - (v / ymax) * (H - T - B);
  for (const v of [0, ymax / 2, ymax]) {
    shapes.push(svgNode("text", { x: 4, y: y(v) + 4 }, v.toFixed(1)));
  }
  shapes.push(svgNode("text", { x: L, y: H - 8 }, new Date(t0 * 1000).toLocaleTimeString()));
  shapes.push(svgNode("text", { x: W - R - 60, y: H - 8 }, new Date(t1 * 1000).toLocaleTimeString()));
  top.forEach((index, i) => {
    const points = records
      .map((r) => [r.time, (r.features.find((f) => f.index === index) || {})[measure]])
      .filter(([, v]) => v !== undefined);
    const color = PALETTE[i];
    shapes.push(svgNode("polyline", { points: points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" "), fill: "none", stroke: color, "stroke-width": 1.5 }));
    for (const [t, v] of points) shapes.push(svgNode("circle", { cx: x(t).toFixed(1), cy: y(v).toFixed(1), r: 3, fill: color, "data-feature": index }));
  });
  svg.replaceChildren(...shapes);
  $("mon-legend").replaceChildren(
    ...top.map((index, i) => {
      const swatch = h("i");
      swatch.style.background = PALETTE[i];
      const label = (ui.labels[(records[0] || {}).sae_id] || {})[index];
      return h("span", {}, swatch, `feature ${index}${label ? ` (${label})` : ""}`);
    }),
  );
}

function svgNode(tag, attrs, text) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

// --- tabs and start ----------------------------------------------------------------------------

const VIEWS = {
  tree: refreshTree,
  chat: refreshProfiles,
  features: async () => renderHeatmap(),
  steering: refreshSteering,
  monitoring: refreshMonitoring,
};
const POLLED = { tree: () => $("tree-auto").checked, monitoring: () => true };

function tab() {
  const name = location.hash.slice(1) in VIEWS ? location.hash.slice(1) : "tree";
  for (const section of document.querySelectorAll("main > section")) section.hidden = section.id !== name;
  for (const link of document.querySelectorAll("#tabs a")) link.classList.toggle("on", link.hash === `#${name}`);
  return name;
}

async function show() {
  await VIEWS[tab()]();
}

async function start() {
  const index = await (await fetch("/")).json();
  if (index.api_key_required && !ui.key) {
    askKey();
    return;
  }
  await refreshModels();
  await show();
  say(`greenroom ${index.version}`);
}

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  ui.key = $("key").value.trim();
  sessionStorage.setItem("greenroom.key", ui.key);
  $("key-dialog").close();
  guarded(start)();
});
window.addEventListener("hashchange", guarded(show));
$("model").addEventListener("change", guarded(async () => {
  localStorage.setItem("greenroom.model", model());
  ui.records = [];
  ui.since = 0;
  await show();
}));
$("chat-form").addEventListener("submit", (event) => {
  event.preventDefault();
  guarded(() => chat(chatBody()))();
});
$("strength").addEventListener("input", () => showStrength(Number($("strength").value), false));
$("strength").addEventListener("change", guarded(() => setStrength(Number($("strength").value))));
$("coefficient").addEventListener("change", guarded(async () => {
  if ($("coefficient").value !== "") await setStrength({ coefficient: Number($("coefficient").value) });
}));
$("steering-enabled").addEventListener("change", guarded(() => setLive({ enabled: $("steering-enabled").checked })));
$("steering-clear").addEventListener("click", guarded(() => setLive({ strengths: {} })));
$("mon-enabled").addEventListener("change", guarded(setMonitoring));
$("mon-topk").addEventListener("change", guarded(setMonitoring));
$("mon-window").addEventListener("change", plot);
$("mon-value").addEventListener("change", plot);
setInterval(() => {
  const name = tab();
  if (ui.models.length && POLLED[name] && POLLED[name]() && !document.hidden) guarded(VIEWS[name])();
}, 2000);
guarded(start)();
