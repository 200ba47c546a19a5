// A pipeline run's DAG: steps in columns by depth (a step sits right of every step it needs),
// each a card with its state, cache hit and job; arrows drawn in SVG over the cards (hidden from
// screen readers, which read each card's "needs" line instead).
import { badge, h, put } from "./dom.js";

const NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs = {}) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  return e;
}

// {name: [needed step names]} from the spec; ${{ steps.x... }} references count like needs.
export function edges(spec) {
  const out = {};
  for (const s of spec.steps || []) {
    const needs = new Set(s.needs || []);
    for (const m of JSON.stringify(s).matchAll(/steps\.([A-Za-z0-9_-]+)\./g)) needs.add(m[1]);
    needs.delete(s.name);
    out[s.name] = [...needs];
  }
  return out;
}

// Depth of each step: 0 without needs, else one more than its deepest need.
export function layers(names, needs) {
  const depth = {};
  const visit = (n, seen = new Set()) => {
    if (n in depth) return depth[n];
    if (seen.has(n)) return 0; // a cycle cannot be stored; be safe anyway
    seen.add(n);
    const ds = (needs[n] || []).filter((m) => names.includes(m)).map((m) => visit(m, seen));
    depth[n] = ds.length ? Math.max(...ds) + 1 : 0;
    return depth[n];
  };
  names.forEach((n) => visit(n));
  const cols = [];
  for (const n of names) (cols[depth[n]] ||= []).push(n);
  return cols;
}

function card(step, needs) {
  const from = step.cached_from || "";
  const cached = step.state === "CACHED" || from;
  return h("li", { class: "dag-step", id: `step-${step.name}`, "data-state": step.state },
    h("strong", {}, step.name), " ", badge(step.state),
    cached ? h("div", { class: "cache-hit" }, `cache hit: outputs of pipeline ${from.replace("/", " step ")}`) : null,
    step.job_id ? h("div", {}, h("a", { href: `#/jobs/${step.job_id}` }, `job #${step.job_id}`),
      step.tries > 1 ? ` · ${step.tries} tries` : "") : null,
    needs.length ? h("div", { class: "muted" }, `needs ${needs.join(", ")}`) : null,
    step.reason ? h("div", { class: "muted small" }, step.reason) : null);
}

function arrows(box, needs) {
  const old = box.querySelector("svg.dag-edges");
  if (old) old.remove();
  const r = box.getBoundingClientRect();
  const g = svg("svg", { class: "dag-edges", "aria-hidden": "true", width: r.width, height: r.height });
  const marker = svg("marker", { id: "dag-arrow", viewBox: "0 0 8 8", refX: 8, refY: 4,
    markerWidth: 8, markerHeight: 8, orient: "auto" });
  marker.append(svg("path", { d: "M0,0 L8,4 L0,8 z" }));
  const defs = svg("defs");
  defs.append(marker);
  g.append(defs);
  for (const [to, froms] of Object.entries(needs)) {
    const b = box.querySelector(`#step-${CSS.escape(to)}`);
    for (const from of froms) {
      const a = box.querySelector(`#step-${CSS.escape(from)}`);
      if (!a || !b) continue;
      const ra = a.getBoundingClientRect(), rb = b.getBoundingClientRect();
      const side = rb.left >= ra.right; // columns side by side; wrapped columns: top to bottom
      const [x1, y1] = side ? [ra.right - r.left, ra.top + ra.height / 2 - r.top] : [ra.left + ra.width / 2 - r.left, ra.bottom - r.top];
      const [x2, y2] = side ? [rb.left - r.left, rb.top + rb.height / 2 - r.top] : [rb.left + rb.width / 2 - r.left, rb.top - r.top];
      g.append(svg("line", { x1, y1, x2, y2, "marker-end": "url(#dag-arrow)" }));
    }
  }
  box.prepend(g);
}

// Draw `run` (GET /api/v1/pipelines/{id}) into `box`; returns a function that redraws arrows.
export function drawDag(box, run) {
  const needs = edges(run.spec);
  const byName = Object.fromEntries(run.steps.map((s) => [s.name, s]));
  const cols = layers(run.steps.map((s) => s.name), needs);
  const hits = run.steps.filter((s) => s.state === "CACHED").length;
  put(box,
    h("p", { id: "dag-summary" }, `${run.steps.length} steps · `,
      ["SUCCEEDED", "CACHED", "RUNNING", "WAITING", "SKIPPED", "FAILED", "CANCELLED"]
        .map((st) => [st, run.steps.filter((s) => s.state === st).length]).filter(([, n]) => n)
        .map(([st, n]) => `${n} ${st.toLowerCase()}`).join(", "),
      hits ? ` (${hits} cache hit${hits > 1 ? "s" : ""})` : ""),
    h("div", { class: "dag", role: "group", "aria-label": `Steps of pipeline ${run.name} #${run.id}, in order` },
      cols.map((names, i) => h("ol", { class: "dag-col", "aria-label": `stage ${i + 1}` },
        names.map((n) => card(byName[n], needs[n] || []))))));
  const graph = box.querySelector(".dag");
  const redraw = () => arrows(graph, needs);
  requestAnimationFrame(redraw);
  return redraw;
}
