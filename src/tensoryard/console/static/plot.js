// A small SVG line chart: no library, downsampled to the chart's width, described for screen readers.
import { put } from "./dom.js";

const NS = "http://www.w3.org/2000/svg";
const W = 640, H = 220, L = 56, R = 12, T = 12, B = 30;

function el(tag, attrs = {}, text) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function fmt(v) {
  const a = Math.abs(v);
  if (a !== 0 && (a < 0.01 || a >= 1e5)) return v.toExponential(2);
  return (Math.round(v * 1000) / 1000).toString();
}

function thin(points, max) {
  if (points.length <= max) return points;
  const out = [], step = points.length / max;
  for (let i = 0; i < max; i++) out.push(points[Math.floor(i * step)]);
  out.push(points[points.length - 1]);
  return out;
}

// series: [{name, points: [[x, y], ...], mark}]: a marked series is drawn thick and dashed.
export function lineChart(container, { title, series, xLabel = "step" }) {
  const all = series.flatMap((s) => s.points).filter((p) => Number.isFinite(p[1]));
  put(container, );
  const heading = document.createElement("h3");
  heading.textContent = title;
  heading.style.margin = "0 0 .3em";
  heading.style.fontSize = "1em";
  container.append(heading);
  if (!all.length) {
    const p = document.createElement("p");
    p.className = "muted"; p.textContent = "No data yet.";
    container.append(p);
    return;
  }
  const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
  let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y1 += Math.abs(y1) * 0.05 + 1e-9; y0 -= Math.abs(y0) * 0.05 + 1e-9; }
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
  const last = series.at(-1).points.at(-1);
  const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, role: "img",
    "aria-label": `${title}: ${all.length} points, steps ${x0} to ${x1}, latest ${fmt(last[1])} at step ${last[0]}` });
  svg.append(el("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
  svg.append(el("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  for (const f of [0, 0.5, 1]) {
    const y = y0 + f * (y1 - y0);
    svg.append(el("text", { x: L - 6, y: sy(y) + 4, "text-anchor": "end" }, fmt(y)));
    const x = x0 + f * (x1 - x0);
    svg.append(el("text", { x: sx(x), y: H - B + 16, "text-anchor": "middle" }, String(Math.round(x))));
  }
  svg.append(el("text", { x: W - R, y: H - 2, "text-anchor": "end" }, xLabel));
  series.forEach((s, i) => {
    const pts = thin(s.points.filter((p) => Number.isFinite(p[1])), W);
    if (!pts.length) return;
    const d = pts.map((p, j) => `${j ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join("");
    svg.append(el("path", { class: `line a${(i % 4) + 1}${s.mark ? " marked" : ""}`, d,
      "data-points": String(s.points.length), "data-series": s.name }));
    if (pts.length === 1) { // a path of one point draws nothing: a dot instead
      svg.append(el("circle", { class: `dot a${(i % 4) + 1}`, cx: sx(pts[0][0]).toFixed(1), cy: sy(pts[0][1]).toFixed(1), r: 3 }));
    }
  });
  container.append(svg);
  if (series.length > 1) {
    const legend = document.createElement("p");
    legend.className = "muted";
    legend.textContent = series.map((s, i) => `line ${i + 1}: ${s.name}`).join(" · ");
    container.append(legend);
  }
}
