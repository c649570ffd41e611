// Endpoints: list and create; one endpoint's defaults, its canary and shadow split (sliders), promote and roll
// back, and per-version plots of calls, latency and errors from GET /v1/endpoints/{name}/metrics.

import { ApiError, api } from "../api.js";
import { fill, h, table } from "../dom.js";
import { plot } from "../plot.js";

const enc = encodeURIComponent;
const REFRESH_MS = 5000;

function failure(el, err) {
  el.className = "error";
  el.textContent = err instanceof ApiError ? err.describe() : String(err);
}

function split(e) {
  const parts = [];
  if (e.canary) parts.push(`canary v${e.canary.version} ${Math.round(e.canary.weight * 100)}%`);
  if (e.shadow) parts.push(`shadow v${e.shadow.version} ${Math.round(e.shadow.fraction * 100)}%`);
  return parts.join(", ") || "—";
}

function createForm(refresh) {
  const field = (id, label, props = {}) => h("label", {}, label, h("input", { id, name: id, spellcheck: "false", ...props }));
  const status = h("span", { id: "create-status", role: "status" });
  const form = h(
    "form",
    {
      id: "create-endpoint",
      onsubmit: async (e) => {
        e.preventDefault();
        const v = (id) => form.querySelector(`#${id}`).value.trim();
        const body = { name: v("ep-name"), adapter: v("ep-adapter") || null, defaults: {} };
        if (v("ep-description")) body.description = v("ep-description");
        if (v("ep-system")) body.defaults.system_prompt = v("ep-system");
        if (v("ep-max-tokens")) body.defaults.max_tokens = Number(v("ep-max-tokens"));
        if (v("ep-canary-version")) body.canary = { version: Number(v("ep-canary-version")), weight: Number(v("ep-canary-weight")) / 100 };
        try {
          await api("POST", "/v1/endpoints", body);
          form.reset();
          await refresh();
          status.className = "ok";
          status.textContent = `Endpoint ${body.name} created`;
        } catch (err) {
          failure(status, err);
        }
      },
    },
    field("ep-name", "Name", { required: true }),
    field("ep-adapter", "Adapter (name@N; empty: base model)"),
    field("ep-description", "Description", { maxlength: 1000 }),
    field("ep-system", "System prompt"),
    field("ep-max-tokens", "Max tokens", { type: "number", min: 1 }),
    field("ep-canary-version", "Canary version", { type: "number", min: 1 }),
    field("ep-canary-weight", "Canary %", { type: "number", min: 1, max: 99, value: 10 }),
    h("button", { type: "submit", id: "create-button" }, "Create"),
    status,
  );
  return form;
}

async function list(root) {
  const body = h("div");
  const refresh = async () => {
    const out = await api("GET", "/v1/endpoints");
    const rows = out.data.map((e) =>
      h(
        "tr",
        { "data-endpoint": e.name },
        h("td", {}, h("a", { href: `#/endpoints/${enc(e.name)}` }, e.name)),
        h("td", {}, e.adapter || "base model"),
        h("td", {}, split(e)),
        h("td", { class: "description" }, e.description || ""),
        h("td", { class: "system-prompt" }, e.defaults.system_prompt || ""),
        h("td", {}, `r${e.revision}`),
      ),
    );
    fill(body, rows.length ? table(["Name", "Serves", "Split", "Description", "System prompt", "Revision"], rows, { id: "endpoints" }) : h("p", { class: "muted" }, "No endpoints yet."));
  };
  fill(root, h("h1", {}, "Endpoints"), h("h2", {}, "New endpoint"), createForm(refresh), body);
  await refresh();
  return null;
}

/** A 0-100% range input: {label, input, set(percent)}; onchange(percent) when the user lets go of it. */
function slider(id, label, percent, onchange) {
  const out = h("output", { id: `${id}-value` }, `${percent}%`);
  const input = h("input", { id, type: "range", min: 0, max: 100, step: 1, value: percent });
  input.addEventListener("input", () => { out.textContent = `${input.value}%`; });
  input.addEventListener("change", () => onchange(Number(input.value)));
  const set = (pct) => { input.value = pct; out.textContent = `${pct}%`; };
  return { label: h("label", {}, label, h("span", { class: "meter" }, input, out)), input, set };
}

function versionPicker(id) {
  return h("input", { id, type: "number", min: 1, placeholder: "version" });
}

/** The plots: one line per adapter version, a point per minute (a minute without calls is 0). */
function plots(metrics) {
  const start = Date.parse(metrics.start);
  const minutes = Array.from({ length: metrics.minutes }, (_, i) => start + i * 60000);
  const pick = (fn) =>
    metrics.series.map((se) => {
      const at = new Map(se.points.map((p) => [Date.parse(p.minute), p]));
      return {
        key: String(se.adapter_version),
        name: se.adapter_version ? `v${se.adapter_version}` : "base",
        points: minutes.map((t) => [t, at.has(t) ? fn(at.get(t)) : 0]),
      };
    });
  const t1 = minutes[minutes.length - 1];
  const totals = metrics.series.map((se) => {
    const sum = (f) => se.points.reduce((a, p) => a + p[f], 0);
    return h("tr", { "data-version": se.adapter_version }, h("td", {}, se.adapter_version ? `v${se.adapter_version}` : "base"), h("td", { class: "requests" }, sum("requests")), h("td", { class: "errors" }, sum("errors")), h("td", {}, sum("completion_tokens")));
  });
  return h(
    "div",
    {},
    h(
      "div",
      { class: "plots" },
      plot({ id: "requests", title: "Calls per minute", t0: start, t1, series: pick((p) => p.requests) }),
      plot({ id: "latency", title: "Mean latency", unit: "ms", t0: start, t1, series: pick((p) => p.latency_ms_avg) }),
      plot({ id: "errors", title: "Errors per minute", t0: start, t1, series: pick((p) => p.errors) }),
    ),
    table(["Version", "Calls", "Errors", "Generated tokens"], totals, { id: "version-totals" }),
  );
}

async function detail(root, name) {
  const status = h("p", { id: "endpoint-status", role: "status" });
  const charts = h("div", { id: "charts" });
  const minutes = h("select", { id: "minutes" }, [15, 60, 360, 1440].map((m) => h("option", { value: m, selected: m === 60 }, m < 60 ? `${m} min` : `${m / 60} h`)));
  const serves = h("strong", { id: "serves" });
  const revision = h("span", { id: "revision" });
  const splitText = h("span", { id: "split" });
  const description = h("span", { class: "description", id: "description" });
  const system = h("span", { class: "description", id: "system-prompt" });
  const defaults = h("pre", { id: "defaults" });
  const overridable = h("p", { class: "muted" });
  const canaryVersion = versionPicker("canary-version");
  const shadowVersion = versionPicker("shadow-version");
  let queue = Promise.resolve(); // changes go out one after another, in the order they were made
  let canarySlider;
  let shadowSlider;
  const promote = h("button", { type: "button", id: "promote", onclick: () => change("POST", `/v1/endpoints/${enc(name)}/promote`, undefined, "canary promoted") }, "Promote");
  const rollback = h("button", { type: "button", class: "secondary", id: "rollback", onclick: () => change("POST", `/v1/endpoints/${enc(name)}/rollback`, undefined, "canary rolled back") }, "Roll back");
  /** Show an endpoint (the controls keep their elements: a slider being moved is never replaced). */
  const show = (e) => {
    serves.textContent = e.adapter || "the base model";
    revision.textContent = `revision ${e.revision}`;
    splitText.textContent = split(e);
    description.textContent = e.description || "—";
    system.textContent = e.defaults.system_prompt || "—";
    defaults.textContent = JSON.stringify(e.defaults, null, 2);
    overridable.textContent = `Callers may override: ${e.overridable.join(", ") || "nothing"}`;
    promote.disabled = !e.canary;
    rollback.disabled = !e.canary;
    if (document.activeElement !== canarySlider.input) canarySlider.set(Math.round((e.canary?.weight || 0) * 100));
    if (document.activeElement !== shadowSlider.input) shadowSlider.set(Math.round((e.shadow?.fraction || 0) * 100));
    if (document.activeElement !== canaryVersion) canaryVersion.value = e.canary ? e.canary.version : "";
    if (document.activeElement !== shadowVersion) shadowVersion.value = e.shadow ? e.shadow.version : "";
  };
  const change = (method, path, body, done) => {
    queue = queue.then(async () => {
      try {
        show(await api(method, path, body));
        status.className = "ok";
        status.textContent = done;
      } catch (err) {
        failure(status, err);
      }
    });
    return queue;
  };
  const patch = (body, done) => change("PATCH", `/v1/endpoints/${enc(name)}`, body, done);
  canarySlider = slider("canary-weight", "Share of callers", 0, (pct) =>
    patch({ canary: pct > 0 && pct < 100 && canaryVersion.value ? { version: Number(canaryVersion.value), weight: pct / 100 } : null }, pct > 0 && pct < 100 ? `canary at ${pct}%` : "canary removed"),
  );
  shadowSlider = slider("shadow-fraction", "Share of calls copied", 0, (pct) =>
    patch({ shadow: pct > 0 && shadowVersion.value ? { version: Number(shadowVersion.value), fraction: pct / 100 } : null }, pct > 0 ? `shadow at ${pct}%` : "shadow removed"),
  );
  const loadMetrics = async () => {
    const m = await api("GET", `/v1/endpoints/${enc(name)}/metrics?minutes=${minutes.value}`);
    fill(charts, plots(m));
  };
  minutes.addEventListener("change", loadMetrics);
  fill(
    root,
    h("p", {}, h("a", { href: "#/endpoints" }, "← All endpoints")),
    h("h1", {}, "Endpoint ", h("span", { id: "endpoint-name" }, name)),
    status,
    h(
      "div",
      { class: "card" },
      h("p", {}, "Serves ", serves, " · ", revision, " · ", splitText),
      h("p", {}, description),
      h("p", {}, "System prompt: ", system),
      h("h2", {}, "Defaults"),
      defaults,
      overridable,
      h("h2", {}, "Canary"),
      h("form", { onsubmit: (ev) => ev.preventDefault() }, h("label", {}, "Version", canaryVersion), canarySlider.label, promote, rollback),
      h("h2", {}, "Shadow"),
      h("form", { onsubmit: (ev) => ev.preventDefault() }, h("label", {}, "Version", shadowVersion), shadowSlider.label),
    ),
    h("h2", {}, "Traffic by version ", minutes, " ", h("button", { type: "button", class: "secondary", id: "refresh", onclick: loadMetrics }, "Refresh")),
    charts,
    h("button", { type: "button", class: "danger", id: "delete-endpoint", onclick: async () => { try { await api("DELETE", `/v1/endpoints/${enc(name)}`); location.hash = "#/endpoints"; } catch (err) { failure(status, err); } } }, "Delete endpoint"),
  );
  show(await api("GET", `/v1/endpoints/${enc(name)}`));
  await loadMetrics();
  const timer = setInterval(() => loadMetrics().catch(() => {}), REFRESH_MS);
  return () => clearInterval(timer);
}

export async function render(root, [name]) {
  return name ? detail(root, name) : list(root);
}
