// The console's only way to the server: the public /v1 API with the tenant's key from this tab's sessionStorage.

const KEY = "loraplex.key";
const TENANT = "loraplex.tenant";

export const session = {
  get key() { return sessionStorage.getItem(KEY); },
  get tenant() { return sessionStorage.getItem(TENANT); },
  save(tenant, key) { sessionStorage.setItem(TENANT, tenant); sessionStorage.setItem(KEY, key); },
  clear() { sessionStorage.removeItem(KEY); sessionStorage.removeItem(TENANT); },
};

/** An API error: the server's OpenAI-style body ({message, type, param, code}) and the HTTP status. */
export class ApiError extends Error {
  constructor(status, body) {
    const err = (body && body.error) || {};
    super(err.message || `HTTP ${status}`);
    this.status = status;
    this.code = err.code || null;
    this.param = err.param || null;
  }

  /** One line for the page: the message, then the code and the parameter it names. */
  describe() {
    const extra = [this.code && `code ${this.code}`, this.param && `param ${this.param}`].filter(Boolean);
    return extra.length ? `${this.message} (${extra.join(", ")})` : this.message;
  }
}

function headers(extra = {}, key = session.key) {
  return { Authorization: `Bearer ${key}`, ...extra };
}

async function parse(response) {
  const text = await response.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch { body = null; }
  if (!response.ok) throw new ApiError(response.status, body || { error: { message: text || response.statusText } });
  return { body, headers: response.headers };
}

/** A JSON call: api("GET", "/v1/adapters") -> the parsed body (throws ApiError). */
export async function api(method, path, body, key) {
  const init = { method, headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }, key) };
  if (body !== undefined) init.body = JSON.stringify(body);
  return (await parse(await fetch(path, init))).body;
}

/** Like api() but also returns the response headers: {body, headers}. */
export async function apiWithHeaders(method, path, body) {
  const init = { method, headers: headers({ "Content-Type": "application/json" }), body: JSON.stringify(body) };
  return parse(await fetch(path, init));
}

/** A multipart upload through XMLHttpRequest, for its upload progress events: onProgress(loaded, total). */
export function upload(path, form, onProgress) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", path);
    xhr.setRequestHeader("Authorization", `Bearer ${session.key}`);
    xhr.upload.addEventListener("progress", (e) => onProgress(e.loaded, e.lengthComputable ? e.total : 0));
    xhr.addEventListener("load", () => {
      let body = null;
      try { body = JSON.parse(xhr.responseText); } catch { body = null; }
      if (xhr.status >= 200 && xhr.status < 300) resolve(body);
      else reject(new ApiError(xhr.status, body || { error: { message: xhr.responseText || xhr.statusText } }));
    });
    xhr.addEventListener("error", () => reject(new ApiError(0, { error: { message: "the upload failed (network)" } })));
    xhr.send(form);
  });
}

/** Fetch a file's bytes with the key and hand them to the browser as a download named `filename`. */
export async function download(path, filename) {
  const response = await fetch(path, { headers: headers() });
  if (!response.ok) await parse(response);
  const url = URL.createObjectURL(await response.blob());
  const link = document.createElement("a");
  link.href = url;
  link.download = filename;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}
