// The console's shell: sign-in, the hash router (#/adapters, #/endpoints/NAME, ...) and the pages.

import { ApiError, api, session } from "./api.js";
import { fill, h } from "./dom.js";
import * as adapters from "./pages/adapters.js";
import * as batches from "./pages/batches.js";
import * as endpoints from "./pages/endpoints.js";
import * as keys from "./pages/keys.js";
import * as playground from "./pages/playground.js";
import * as usage from "./pages/usage.js";

const PAGES = { adapters, endpoints, batches, usage, keys, playground };
const $ = (id) => document.getElementById(id);
let cleanup = null;

/** A key is good when the tenant's own usage route answers with it (a wrong key: 401; another tenant: 404). */
async function signIn(event) {
  event.preventDefault();
  const tenant = $("tenant").value.trim();
  const key = $("api-key").value.trim();
  $("sign-in-error").textContent = "";
  try {
    await api("GET", `/v1/tenants/${encodeURIComponent(tenant)}/usage`, undefined, key);
  } catch (err) {
    $("sign-in-error").textContent = err instanceof ApiError ? `Not signed in: ${err.describe()}` : String(err);
    return;
  }
  session.save(tenant, key);
  $("api-key").value = "";
  if (!location.hash || location.hash === "#/") location.hash = "#/adapters";
  route();
}

function signOut() {
  session.clear();
  location.hash = "";
  route();
}

async function route() {
  if (cleanup) { cleanup(); cleanup = null; }
  const signedIn = Boolean(session.key);
  $("sign-in").hidden = signedIn;
  $("page").hidden = !signedIn;
  $("nav").hidden = !signedIn;
  $("sign-out").hidden = !signedIn;
  $("who").textContent = signedIn ? `tenant ${session.tenant}` : "";
  if (!signedIn) { fill($("page")); return; }
  const [name, ...rest] = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const page = PAGES[name] ? name : "adapters";
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === page);
  const root = fill($("page"), h("p", { class: "muted" }, "Loading…"));
  root.dataset.page = page;
  try {
    cleanup = (await PAGES[page].render(root, rest.filter(Boolean))) || null;
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) { signOut(); $("sign-in-error").textContent = "Your key is no longer valid: sign in again."; return; }
    fill(root, h("p", { class: "error", role: "alert" }, err instanceof ApiError ? err.describe() : String(err)));
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("sign-in-form").addEventListener("submit", signIn);
  $("sign-out").addEventListener("click", signOut);
  window.addEventListener("hashchange", route);
  route();
});
