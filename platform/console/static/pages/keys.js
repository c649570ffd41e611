// API keys: list them (prefixes only: secrets are never stored), create one (shown once), revoke one, and
// rotate this tab's key (a new key replaces it here, then the old one is revoked).

import { ApiError, api, session } from "../api.js";
import { fill, h, table } from "../dom.js";

const enc = encodeURIComponent;

/** The public prefix of a key `lpx-<prefix>.<secret>` (what the keys route lists). */
function prefixOf(key) {
  const m = /^[^-]+-([^.]+)\./.exec(key || "");
  return m ? m[1] : null;
}

export async function render(root) {
  const base = `/v1/tenants/${enc(session.tenant)}/keys`;
  const status = h("p", { id: "keys-status", role: "status" });
  const fresh = h("div", { id: "new-key" });
  const list = h("div");
  const failure = (err) => {
    status.className = "error";
    status.textContent = err instanceof ApiError ? err.describe() : String(err);
  };
  const load = async () => {
    const mine = prefixOf(session.key);
    const out = await api("GET", base);
    const rows = out.data.map((k) =>
      h(
        "tr",
        { "data-prefix": k.prefix, "data-revoked": k.revoked_at ? "yes" : "no" },
        h("td", { class: "mono" }, k.prefix, k.prefix === mine ? h("strong", {}, " (this tab)") : ""),
        h("td", {}, new Date(k.created_at).toLocaleString()),
        h("td", {}, k.revoked_at ? `revoked ${new Date(k.revoked_at).toLocaleString()}` : "active"),
        h(
          "td",
          {},
          k.revoked_at || k.prefix === mine
            ? ""
            : h("button", { class: "danger", "data-action": "revoke", onclick: () => revoke(k.prefix) }, "Revoke"),
        ),
      ),
    );
    fill(list, table(["Prefix", "Created", "State", ""], rows, { id: "keys" }));
  };
  const revoke = async (prefix) => {
    try {
      await api("DELETE", `${base}/${enc(prefix)}`);
      await load();
      status.className = "ok";
      status.textContent = `Key ${prefix} revoked`;
    } catch (err) {
      failure(err);
    }
  };
  const create = async () => {
    try {
      const made = await api("POST", base);
      fill(fresh, h("p", {}, "New key (shown only now: copy it):"), h("pre", { id: "new-key-value" }, made.key));
      await load();
      status.className = "ok";
      status.textContent = `Key ${made.prefix} created`;
    } catch (err) {
      failure(err);
    }
  };
  const rotate = async () => {
    const old = prefixOf(session.key);
    try {
      const made = await api("POST", base);
      session.save(session.tenant, made.key); // this tab signs with the new key from now on
      if (old) await api("DELETE", `${base}/${enc(old)}`);
      await load();
      status.className = "ok";
      status.textContent = `This tab now uses key ${made.prefix}; ${old} is revoked`;
    } catch (err) {
      failure(err);
    }
  };
  fill(
    root,
    h("h1", {}, "API keys"),
    h(
      "p",
      { class: "row-actions" },
      h("button", { type: "button", id: "create-key", onclick: create }, "New key"),
      h("button", { type: "button", class: "secondary", id: "rotate-key", onclick: rotate }, "Rotate this tab's key"),
    ),
    status,
    fresh,
    list,
  );
  await load();
  return null;
}
