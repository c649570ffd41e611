// Adapters and their versions: upload (with progress), make a version current (roll back), delete.

import { ApiError, api, upload } from "../api.js";
import { bytes, fill, h, table } from "../dom.js";

const enc = encodeURIComponent;

function failure(el, err) {
  el.className = "error";
  el.textContent = err instanceof ApiError ? err.describe() : String(err);
}

function uploadForm(root, refresh) {
  const name = h("input", { id: "upload-name", name: "name", required: true, spellcheck: "false" });
  const file = h("input", { id: "upload-file", name: "file", type: "file", accept: ".zip,.tar.gz,.tgz", required: true });
  const bar = h("progress", { id: "upload-progress", max: 1, value: 0 });
  const status = h("span", { id: "upload-status", role: "status" });
  const form = h(
    "form",
    {
      id: "upload-form",
      onsubmit: async (e) => {
        e.preventDefault();
        if (!file.files.length) return;
        const data = new FormData();
        data.append("name", name.value.trim());
        data.append("file", file.files[0]);
        status.className = "muted";
        status.textContent = "Uploading…";
        try {
          const out = await upload("/v1/adapters", data, (loaded, total) => {
            bar.max = total || 1;
            bar.value = loaded;
            status.textContent = total ? `Uploading… ${Math.round((100 * loaded) / total)}%` : "Uploading…";
          });
          form.reset();
          await refresh();
          status.className = "ok";
          status.textContent = `Uploaded ${out.model} version ${out.version}`;
        } catch (err) {
          failure(status, err);
        }
      },
    },
    h("label", {}, "Name", name),
    h("label", {}, "PEFT adapter archive (.zip or .tar.gz)", file),
    h("button", { type: "submit", id: "upload-button" }, "Upload"),
    h("span", { class: "meter" }, bar, status),
  );
  return form;
}

async function versions(root, name) {
  const status = h("p", { id: "versions-status", role: "status" });
  const body = h("div");
  const load = async () => {
    const out = await api("GET", `/v1/adapters/${enc(name)}/versions`);
    const rows = out.data.map((v) =>
      h(
        "tr",
        { "data-version": v.version },
        h("td", {}, `v${v.version}`, v.version === out.current ? h("strong", { class: "current" }, " (current)") : ""),
        h("td", { class: "mono" }, v.sha256.slice(0, 12)),
        h("td", {}, `r=${v.rank}`),
        h("td", {}, bytes(v.size_bytes)),
        h("td", {}, new Date(v.created_at).toLocaleString()),
        h("td", {}, v.status === "broken" ? h("span", { class: "error" }, `broken: ${v.broken_reason}`) : "ready"),
        h(
          "td",
          { class: "row-actions" },
          v.version === out.current
            ? ""
            : h("button", { class: "secondary", "data-action": "make-current", onclick: () => act("PUT", `/v1/adapters/${enc(name)}/current`, { version: v.version }, `v${v.version} is now current`) }, "Make current"),
          h("button", { class: "danger", "data-action": "delete-version", onclick: () => act("DELETE", `/v1/adapters/${enc(`${name}@${v.version}`)}`, undefined, `v${v.version} deleted`) }, "Delete"),
        ),
      ),
    );
    fill(body, table(["Version", "Content", "Rank", "Size", "Created", "Status", ""], rows, { id: "versions" }));
  };
  const act = async (method, path, data, done) => {
    try {
      await api(method, path, data);
      status.className = "ok";
      status.textContent = done;
      await load();
    } catch (err) {
      failure(status, err);
    }
  };
  fill(
    root,
    h("p", {}, h("a", { href: "#/adapters" }, "← All adapters")),
    h("h1", {}, "Adapter ", h("span", { id: "adapter-name" }, name)),
    status,
    body,
    h("button", { class: "danger", id: "delete-all", onclick: () => act("DELETE", `/v1/adapters/${enc(name)}`, undefined, `${name} deleted (every version)`) }, "Delete every version"),
  );
  await load();
}

export async function render(root, [name]) {
  if (name) return versions(root, name);
  const list = h("div");
  const refresh = async () => {
    const out = await api("GET", "/v1/adapters");
    const rows = out.data.map((a) =>
      h(
        "tr",
        { "data-adapter": a.name },
        h("td", {}, h("a", { href: `#/adapters/${enc(a.name)}` }, a.name)),
        h("td", { class: "mono" }, a.model),
        h("td", {}, `v${a.version}`),
        h("td", {}, `r=${a.rank}, alpha=${a.alpha}`),
        h("td", {}, bytes(a.size_bytes)),
        h("td", {}, a.status),
      ),
    );
    fill(list, rows.length ? table(["Name", "Model id", "Current", "LoRA", "Size", "Status"], rows, { id: "adapters" }) : h("p", { class: "muted" }, "No adapters yet."));
  };
  fill(root, h("h1", {}, "Adapters"), uploadForm(root, refresh), list);
  await refresh();
  return null;
}
