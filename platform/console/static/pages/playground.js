// Playground: one chat request to an endpoint or model with a JSON schema; shows the JSON, whether the schema
// was enforced exactly or narrowed (x-loraplex-schema), the grounded spans and each field's logprobs.

import { ApiError, api, apiWithHeaders } from "../api.js";
import { fill, h, table } from "../dom.js";

const SCHEMA = {
  type: "object",
  properties: { name: { type: "string", "x-loraplex-grounded": true }, urgent: { type: "boolean" } },
  required: ["name", "urgent"],
  additionalProperties: false,
};

/** The user message with each grounded span marked (text nodes and <mark> elements only). */
function marked(text, spans) {
  const sorted = [...spans].sort((a, b) => a.start - b.start);
  const parts = [];
  let at = 0;
  for (const sp of sorted) {
    if (sp.start < at) continue;
    parts.push(text.slice(at, sp.start), h("mark", { class: "grounded", "data-pointer": sp.pointer }, text.slice(sp.start, sp.end)));
    at = sp.end;
  }
  parts.push(text.slice(at));
  return h("p", { id: "grounded-source" }, parts);
}

export async function render(root) {
  const models = await api("GET", "/v1/models");
  const model = h("select", { id: "pg-model" }, models.data.map((m) => h("option", { value: m.id }, m.id)));
  const system = h("input", { id: "pg-system", spellcheck: "false", placeholder: "system prompt (optional)" });
  const user = h("textarea", { id: "pg-user", rows: 3 }, "Ticket from Maria Okafor: the printer is on fire, please come now.");
  const schema = h("textarea", { id: "pg-schema", rows: 10, spellcheck: "false" }, JSON.stringify(SCHEMA, null, 2));
  const maxTokens = h("input", { id: "pg-max-tokens", type: "number", min: 1, value: 64 });
  const temperature = h("input", { id: "pg-temperature", type: "number", min: 0, max: 2, step: 0.1, value: 0 });
  const narrowing = h("input", { id: "pg-narrowing", type: "checkbox", checked: true });
  const logprobs = h("input", { id: "pg-field-logprobs", type: "checkbox", checked: true });
  // off: no response_format is sent, so an endpoint's own schema (its defaults) applies
  const sendSchema = h("input", { id: "pg-send-schema", type: "checkbox", checked: true });
  const status = h("p", { id: "pg-status", role: "status" });
  const result = h("div", { id: "pg-result" });
  const send = async (e) => {
    e.preventDefault();
    fill(result);
    let parsedSchema = null;
    if (sendSchema.checked) {
      try {
        parsedSchema = JSON.parse(schema.value);
      } catch (err) {
        status.className = "error";
        status.textContent = `The schema is not JSON: ${err.message}`;
        return;
      }
    }
    const messages = [];
    if (system.value.trim()) messages.push({ role: "system", content: system.value.trim() });
    messages.push({ role: "user", content: user.value });
    const body = {
      model: model.value,
      messages,
      schema_narrowing: narrowing.checked ? "allow" : "refuse",
      field_logprobs: logprobs.checked,
    };
    // (left empty: not sent, so an endpoint's own default applies; setting what it fixes is refused by name)
    if (maxTokens.value.trim()) body.max_tokens = Number(maxTokens.value);
    if (temperature.value.trim()) body.temperature = Number(temperature.value);
    if (parsedSchema !== null) body.response_format = { type: "json_schema", json_schema: { name: "playground", schema: parsedSchema } };
    status.className = "muted";
    status.textContent = "Generating…";
    let out;
    try {
      out = await apiWithHeaders("POST", "/v1/chat/completions", body);
    } catch (err) {
      status.className = "error";
      status.textContent = err instanceof ApiError ? err.describe() : String(err);
      return;
    }
    status.className = "ok";
    status.textContent = `Answered by ${out.headers.get("x-loraplex-served-by") || model.value}`;
    const choice = out.body.choices[0];
    const content = choice.message.content || "";
    let pretty = content;
    try { pretty = JSON.stringify(JSON.parse(content), null, 2); } catch { /* shown as sent */ }
    const narrowed = out.headers.get("x-loraplex-schema-narrowing");
    const fields = Object.entries(choice.field_logprobs || {}).map(([ptr, f]) =>
      h("tr", { "data-pointer": ptr }, h("td", { class: "mono" }, ptr || "(root)"), h("td", {}, f.logprob.toFixed(3)), h("td", {}, f.min_logprob.toFixed(3)), h("td", {}, f.tokens), h("td", {}, `${(100 * Math.exp(f.logprob)).toFixed(1)}%`)),
    );
    // spans copy user messages only, and this request has one (an endpoint's system prompt may shift its index)
    const grounded = choice.grounded_values || [];
    fill(
      result,
      h("h2", {}, "JSON"),
      h("pre", { id: "pg-json" }, pretty),
      h("p", {}, "Schema: ", h("strong", { id: "pg-schema-header" }, out.headers.get("x-loraplex-schema") || "—"), ` · finish: ${choice.finish_reason}`),
      narrowed ? h("ul", { id: "pg-narrowing-list" }, JSON.parse(narrowed).map((n) => h("li", {}, n))) : "",
      h("h2", {}, "Field confidence"),
      fields.length ? table(["Field", "Sum logprob", "Lowest", "Tokens", "P(all tokens)"], fields, { id: "pg-field-logprobs-table" }) : h("p", { class: "muted" }, "No field logprobs."),
      h("h2", {}, "Grounded spans"),
      grounded.length
        ? [marked(user.value, grounded), table(["Field", "Message", "Span"], grounded.map((g) => h("tr", {}, h("td", { class: "mono" }, g.pointer), h("td", {}, g.message), h("td", {}, `${g.start}–${g.end}`))), { id: "pg-grounded" })]
        : h("p", { class: "muted" }, "No grounded values."),
    );
  };
  fill(
    root,
    h("h1", {}, "Playground"),
    h(
      "form",
      { id: "pg-form", class: "stack", onsubmit: send },
      h("span", { class: "meter" }, h("label", {}, "Endpoint or model", model), h("label", {}, "Max tokens", maxTokens), h("label", {}, "Temperature", temperature)),
      h("label", {}, "System", system),
      h("label", {}, "User message", user),
      h("label", {}, "JSON schema (x-loraplex-grounded: a verbatim span of the message; unticked below: the endpoint's own)", schema),
      h("span", { class: "meter" }, h("label", {}, "Send this schema", sendSchema), h("label", {}, "Allow narrowing", narrowing), h("label", {}, "Field logprobs", logprobs), h("button", { type: "submit", id: "pg-send" }, "Send")),
    ),
    status,
    result,
  );
  return null;
}
