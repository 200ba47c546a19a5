// Building DOM nodes without innerHTML (so no data is ever parsed as markup).
export function h(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k === "style") {  // through the CSSOM: the page's CSP refuses style attributes
      for (const decl of String(v).split(";")) {
        const i = decl.indexOf(":");
        if (i > 0) e.style.setProperty(decl.slice(0, i).trim(), decl.slice(i + 1).trim());
      }
    }
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

export function table(headers, rows, { caption, numeric = [] } = {}) {
  return h("div", { class: "scroll" }, h("table", {},
    caption ? h("caption", { class: "sr-only" }, caption) : null,
    h("thead", {}, h("tr", {}, headers.map((x, i) =>
      h("th", { scope: "col", class: numeric.includes(i) ? "num" : null }, x)))),
    h("tbody", {}, rows.map((r) => h("tr", {}, r.map((c, i) =>
      h("td", { class: numeric.includes(i) ? "num" : null }, c)))))));
}

export function badge(state) {
  return h("span", { class: `badge s-${state}` }, state);
}

export function when(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return d.toISOString().slice(0, 16).replace("T", " ") + "Z";
}

export function ago(iso, now = Date.now()) {
  if (!iso) return "—";
  let s = Math.round((now - new Date(iso).getTime()) / 1000);
  const future = s < 0; s = Math.abs(s);
  const text = s < 90 ? `${s}s` : s < 5400 ? `${Math.round(s / 60)}m` : s < 172800 ? `${(s / 3600).toFixed(1)}h` : `${Math.round(s / 86400)}d`;
  return future ? `in ${text}` : `${text} ago`;
}

export function errorBox(err) {
  const items = (err.detail || []).map((d) => h("li", {}, `${d.path || d.field || ""}: ${d.message || ""}${d.fix ? ` (fix: ${d.fix})` : ""}`));
  return h("div", { class: "error", role: "alert" }, String(err.message || err), items.length ? h("ul", {}, items) : null);
}

export function announce(text) {
  const el = document.getElementById("announce");
  if (el) el.textContent = text;
}

// replaceChildren, leaving out null/false/undefined (which replaceChildren would print).
export function put(el, ...children) {
  el.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false)
    .map((c) => (c instanceof Node ? c : document.createTextNode(String(c)))));
}
