// Usage against limits: what the tenant holds now over all replicas, and the limits in force (0: unlimited).

import { api, session } from "../api.js";
import { fill, h, table } from "../dom.js";

const REFRESH_MS = 3000;
const ROWS = [
  ["Queued requests", "queued_requests", "max_queued_requests"],
  ["Sequences running", "sequences", "max_concurrent_sequences"],
  ["Tokens this minute", "tokens_this_minute", "tokens_per_minute"],
];

export async function render(root) {
  const body = h("div");
  const load = async () => {
    const u = await api("GET", `/v1/tenants/${encodeURIComponent(session.tenant)}/usage`);
    const rows = ROWS.map(([label, use, limit]) =>
      h(
        "tr",
        { "data-usage": use },
        h("td", {}, label),
        h("td", { class: "use" }, u[use]),
        h("td", { class: "limit" }, u[limit] ? u[limit] : "unlimited"),
        h("td", {}, u[limit] ? h("progress", { max: u[limit], value: Math.min(u[use], u[limit]) }) : ""),
      ),
    );
    fill(body, table(["", "Now", "Limit", ""], rows, { id: "usage" }));
  };
  fill(root, h("h1", {}, "Usage"), h("p", { class: "muted" }, "Refreshed every few seconds."), body);
  await load();
  const timer = setInterval(() => load().catch(() => {}), REFRESH_MS);
  return () => clearInterval(timer);
}
