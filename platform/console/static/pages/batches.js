// Batch jobs: upload a JSONL file and start a batch, watch its progress, download its output and errors.

import { ApiError, api, download, upload } from "../api.js";
import { fill, h, table, when } from "../dom.js";

const REFRESH_MS = 2000;
const EXAMPLE = JSON.stringify({ custom_id: "line-1", method: "POST", url: "/v1/chat/completions", body: { model: "ENDPOINT", messages: [{ role: "user", content: "Hello" }], max_tokens: 16 } });

function failure(el, err) {
  el.className = "error";
  el.textContent = err instanceof ApiError ? err.describe() : String(err);
}

function submitForm(refresh) {
  const lines = h("textarea", { id: "batch-lines", rows: 6, spellcheck: "false", placeholder: EXAMPLE });
  const file = h("input", { id: "batch-file", type: "file", accept: ".jsonl,.json,.txt" });
  const endpoint = h("select", { id: "batch-endpoint" }, h("option", { value: "/v1/chat/completions" }, "/v1/chat/completions"), h("option", { value: "/v1/completions" }, "/v1/completions"));
  const metadata = h("input", { id: "batch-metadata", spellcheck: "false", placeholder: "description (optional)" });
  const bar = h("progress", { id: "batch-upload-progress", max: 1, value: 0 });
  const status = h("span", { id: "batch-status", role: "status" });
  const form = h(
    "form",
    {
      id: "batch-form",
      class: "stack",
      onsubmit: async (e) => {
        e.preventDefault();
        const data = new FormData();
        data.append("purpose", "batch");
        const blob = file.files.length ? file.files[0] : new Blob([lines.value.trim() + "\n"], { type: "application/jsonl" });
        data.append("file", blob, file.files.length ? file.files[0].name : "console.jsonl");
        try {
          status.className = "muted";
          status.textContent = "Uploading the input…";
          const input = await upload("/v1/files", data, (loaded, total) => { bar.max = total || 1; bar.value = loaded; });
          const body = { input_file_id: input.id, endpoint: endpoint.value, completion_window: "24h" };
          if (metadata.value.trim()) body.metadata = { description: metadata.value.trim() };
          const batch = await api("POST", "/v1/batches", body);
          form.reset();
          await refresh();
          status.className = "ok";
          status.textContent = `Batch ${batch.id} submitted`;
        } catch (err) {
          failure(status, err);
        }
      },
    },
    h("label", {}, "Requests, one JSON object a line", lines),
    h("label", {}, "…or a JSONL file", file),
    h("span", { class: "meter" }, h("label", {}, "Route", endpoint), h("label", {}, "Description", metadata)),
    h("span", { class: "meter" }, h("button", { type: "submit", id: "batch-submit" }, "Submit batch"), bar, status),
  );
  return form;
}

function progress(b) {
  const c = b.request_counts;
  const done = c.completed + c.failed;
  return h("span", { class: "meter" }, h("progress", { max: c.total || 1, value: done }), `${done}/${c.total}`, c.failed ? h("span", { class: "error" }, ` (${c.failed} failed)`) : "");
}

export async function render(root) {
  const status = h("p", { id: "download-status", role: "status" });
  const list = h("div");
  const get = (fileId, name) => async () => {
    try {
      await download(`/v1/files/${encodeURIComponent(fileId)}/content`, name);
      status.className = "ok";
      status.textContent = `Downloaded ${name}`;
    } catch (err) {
      failure(status, err);
    }
  };
  const cancel = async (id) => {
    try {
      await api("POST", `/v1/batches/${encodeURIComponent(id)}/cancel`);
      await refresh();
      status.className = "ok";
      status.textContent = `Batch ${id} cancelled: lines not finished stop`;
    } catch (err) {
      failure(status, err);
    }
  };
  const refresh = async () => {
    const out = await api("GET", "/v1/batches?limit=50");
    const rows = out.data.map((b) =>
      h(
        "tr",
        { "data-batch": b.id, "data-status": b.status },
        h("td", { class: "mono" }, b.id),
        h("td", { class: "batch-state" }, b.status),
        h("td", {}, progress(b)),
        h("td", { class: "metadata" }, b.metadata ? Object.entries(b.metadata).map(([k, v]) => `${k}: ${v}`).join("; ") : ""),
        h("td", {}, when(b.created_at)),
        h(
          "td",
          { class: "row-actions" },
          b.output_file_id ? h("button", { class: "secondary", "data-action": "download-output", onclick: get(b.output_file_id, `${b.id}-output.jsonl`) }, "Output") : "",
          b.error_file_id ? h("button", { class: "secondary", "data-action": "download-errors", onclick: get(b.error_file_id, `${b.id}-errors.jsonl`) }, "Errors") : "",
          ["validating", "in_progress", "finalizing"].includes(b.status) ? h("button", { class: "danger", "data-action": "cancel", onclick: () => cancel(b.id) }, "Cancel") : "",
        ),
      ),
    );
    fill(list, rows.length ? table(["Batch", "Status", "Progress", "Metadata", "Created", ""], rows, { id: "batches" }) : h("p", { class: "muted" }, "No batches yet."));
  };
  fill(root, h("h1", {}, "Batch jobs"), submitForm(refresh), status, list);
  await refresh();
  const timer = setInterval(() => refresh().catch(() => {}), REFRESH_MS);
  return () => clearInterval(timer);
}
