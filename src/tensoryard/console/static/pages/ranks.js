// Per-rank plots of one attempt on the job page: step time, throughput and data-loader wait per
// rank over steps (GET /jobs/{id}/ranks), the runtime's stragglers marked in text and drawn
// thick and dashed.
import { get } from "../api.js";
import { errorBox, h, put, table } from "../dom.js";
import { lineChart } from "../plot.js";

const EVERY_MS = 5000; // re-read at most this often while steps arrive

export function rankPanel(base, attempts) {
  const attemptSel = h("select", { id: "ranks-attempt" });
  const status = h("div", { id: "stragglers", "aria-live": "polite" });
  const stepBox = h("div", { class: "plot", id: "plot-rank-step" });
  const rateBox = h("div", { class: "plot", id: "plot-rank-rate" });
  const waitBox = h("div", { class: "plot", id: "plot-rank-wait" });
  const gpuBox = h("div", { id: "rank-gpus" });
  let shown = 0, last = 0, timer = null;

  function fillAttempts(n) {
    const keep = attemptSel.value;
    put(attemptSel, ...[...Array(n).keys()].map((i) => h("option", { value: i + 1 }, `attempt ${i + 1}`)).reverse());
    attemptSel.value = keep && Number(keep) < n ? keep : String(n);
  }

  function draw(out) {
    const named = new Set(out.stragglers);
    const pick = (f) => out.ranks.map((r) => ({
      name: `rank ${r.rank}${named.has(r.rank) ? " (straggler)" : ""}`, mark: named.has(r.rank),
      points: r.points.map(([step, s, w]) => [step, f(s, w)]),
    }));
    put(status,
      out.note ? h("p", { class: "muted" }, out.note) : null,
      out.stragglers.length
        ? h("ul", { class: "notice" }, out.ranks.filter((r) => r.straggler).map((r) =>
          h("li", {}, h("span", { class: "straggler" }, `Straggler: rank ${r.rank}`), ` (${r.straggler_message})`)))
        : out.ranks.length ? h("p", { class: "muted" }, `No straggler flagged in attempt ${out.attempt} by the runtime's detector.`) : null);
    lineChart(stepBox, { title: "Step time per rank (s)", series: pick((s) => s) });
    lineChart(rateBox, { title: "Throughput per rank (steps/s)", series: pick((s) => (s > 0 ? 1 / s : NaN)) });
    lineChart(waitBox, { title: "Data-loader wait per rank (s)", series: pick((s, w) => w) });
    put(gpuBox, out.gpus.length
      ? table(["Rank", "Node", "GPU", "Utilisation now"], out.gpus.map((g) => [g.rank === "" ? "?" : g.rank, g.node, String(g.gpu),
        g.util_pct == null ? "—" : `${g.util_pct.toFixed(0)} %`]), { caption: "GPU utilisation per rank, as the node agents last reported it", numeric: [2, 3] })
      : h("p", { class: "muted" }, "GPU utilisation: none reported for this attempt (only a running attempt's GPUs, as the node agents report them with their heartbeats; CPU jobs have none)."));
  }

  async function load() {
    last = Date.now();
    shown = Number(attemptSel.value);
    if (!shown) { put(status, h("p", { class: "muted" }, "No attempt yet.")); return; }
    const asked = shown;
    try {
      const out = await get(`${base}/ranks?attempt=${asked}`);
      if (asked === shown) draw(out); // an answer for an attempt no longer chosen is dropped
    } catch (e) { put(status, errorBox(e)); }
  }

  function stepsArrived() { // throttled: one read per EVERY_MS however fast steps come
    if (timer || Number(attemptSel.value) !== shown) return;
    timer = setTimeout(() => { timer = null; load(); }, Math.max(0, last + EVERY_MS - Date.now()));
  }

  fillAttempts(attempts);
  attemptSel.addEventListener("change", load);
  const node = h("div", { id: "ranks" },
    h("div", { class: "row" }, h("label", { for: "ranks-attempt" }, "Attempt"), attemptSel),
    status, h("div", { class: "grid2" }, stepBox, rateBox, waitBox), gpuBox);
  load();
  return {
    node,
    stepsArrived,
    attemptsChanged: (n) => { const latest = Number(attemptSel.value) === n - 1; fillAttempts(n); if (latest) { attemptSel.value = String(n); load(); } },
    close: () => clearTimeout(timer),
  };
}
