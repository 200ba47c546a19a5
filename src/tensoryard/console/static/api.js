// The REST API, with the session cookie (sent by the browser) and the CSRF token on actions.
let csrf = "";
export const session = { user: null };

export class ApiError extends Error {
  constructor(status, body) {
    super(body && body.message ? body.message : `HTTP ${status}`);
    this.status = status;
    this.detail = body && Array.isArray(body.detail) ? body.detail : [];
  }
}

async function request(method, path, { body, headers = {}, text = false } = {}) {
  const h = { ...headers };
  if (method !== "GET" && method !== "HEAD") h["X-CSRF-Token"] = csrf;
  if (body !== undefined) h["Content-Type"] = "application/json";
  const r = await fetch(path, {
    method, headers: h, credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!r.ok) {
    let payload = null;
    try { payload = await r.json(); } catch { payload = { message: await r.text().catch(() => "") }; }
    throw new ApiError(r.status, payload);
  }
  if (text) return r.text();
  return r.status === 204 ? null : r.json();
}

export const get = (path) => request("GET", path);
export const post = (path, body, headers) => request("POST", path, { body, headers });
export const del = (path) => request("DELETE", path);

export async function signIn(token) {
  const r = await fetch("/api/v1/console/session", {
    method: "POST", credentials: "same-origin", headers: { Authorization: `Bearer ${token}` },
  });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new ApiError(r.status, body);
  csrf = body.csrf; session.user = body;
  return body;
}

export async function resume() {
  try {
    const body = await get("/api/v1/console/session");
    csrf = body.csrf; session.user = body;
    return body;
  } catch (e) {
    if (e.status === 401) return null;
    throw e;
  }
}

export async function signOut() {
  try { await del("/api/v1/console/session"); } finally { session.user = null; csrf = ""; }
}

// One EventSource per page; handlers by event name. Closed when the page changes.
export function stream(path, handlers, onError) {
  const es = new EventSource(path, { withCredentials: true });
  for (const [name, fn] of Object.entries(handlers)) {
    es.addEventListener(name, (ev) => fn(JSON.parse(ev.data)));
  }
  if (onError) es.onerror = onError;
  return es;
}

export function canAct(team) {
  const u = session.user;
  if (!u || !u.scopes.includes("write")) return false;
  if (u.platform_admin) return true;
  const role = u.teams[team];
  return role === "member" || role === "team-admin";
}
