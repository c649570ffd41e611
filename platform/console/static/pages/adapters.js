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

/** Import by reference (s3://, https:// with its sha256, hf://): the server fetches it in the background; the
 * form follows the import's status resource until it is ready (a new version) or failed (its error shown). */
function importForm(refresh) {
  const name = h("input", { id: "import-name", required: true, spellcheck: "false" });
  const source = h("input", { id: "import-source", required: true, spellcheck: "false", placeholder: "https://…/adapter.zip, s3://bucket/prefix, hf://org/repo" });
  const sha = h("input", { id: "import-sha256", spellcheck: "false", placeholder: "sha256 of the archive (https)" });
  const bar = h("progress", { id: "import-progress", max: 1, value: 0 });
  const status = h("span", { id: "import-status", role: "status" });
  const form = h(
    "form",
    {
      id: "import-form",
      onsubmit: async (e) => {
        e.preventDefault();
        const body = { name: name.value.trim(), source: source.value.trim() };
        if (sha.value.trim()) body.sha256 = sha.value.trim();
        try {
          let job = await api("POST", "/v1/adapters", body);
          while (job.status !== "ready" && job.status !== "failed") {
            status.className = "muted";
            status.textContent = `Import ${job.status}…`;
            bar.max = job.bytes_total || 1;
            bar.value = job.bytes_total ? job.bytes_done : 0;
            await new Promise((ok) => setTimeout(ok, 500));
            job = await api("GET", `/v1/adapters/${enc(job.name)}/imports/${enc(job.id)}`);
          }
          if (job.status === "failed") {
            status.className = "error";
            status.textContent = `Import failed: ${job.error ? `${job.error.message} (code ${job.error.code})` : "no reason given"}`;
            return;
          }
          bar.max = 1;
          bar.value = 1;
          form.reset();
          await refresh();
          status.className = "ok";
          status.textContent = `Imported ${job.name} version ${job.version}`;
        } catch (err) {
          failure(status, err);
        }
      },
    },
    h("label", {}, "Name", name),
    h("label", {}, "Source", source),
    h("label", {}, "SHA-256", sha),
    h("button", { type: "submit", id: "import-button" }, "Import"),
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
      await load();
      status.className = "ok";
      status.textContent = done;
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
  fill(root, h("h1", {}, "Adapters"), h("h2", {}, "Upload"), uploadForm(root, refresh), h("h2", {}, "Import by reference"), importForm(refresh), h("h2", {}, "Your adapters"), list);
  await refresh();
  return null;
}
