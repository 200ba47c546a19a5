import { get } from "../api.js";
import { errorBox, h, table, put } from "../dom.js";

const EVERY_MS = 5000; // the gateway's numbers are re-read this often while the page is open

const sec = (v) => (v == null ? "—" : v < 1 ? `${(v * 1000).toFixed(0)} ms` : `${v.toFixed(2)} s`);
const num = (v, digits = 2) => (v == null ? "—" : v.toFixed(digits));

function gatewayCells(d, g) {
  if (!g) return ["—", "—", "—", "—"];
  const w = g.window;
  const recent = w && w.requests > 0;
  const cell = (cls, text, title) => h("span", { class: cls, "data-deployment": d.name, title }, text);
  return [
    cell("rps", w ? num(w.requests_per_s) : "…", w ? `over the last ${w.seconds.toFixed(0)} s` : "rates after the next reading"),
    cell("ttft", recent ? `${sec(w.ttft_p50_s)} / ${sec(w.ttft_p90_s)}` : `${sec(g.ttft_p50_s)} / ${sec(g.ttft_p90_s)}`,
      recent ? "p50 / p90 over the last minute" : "p50 / p90 since the control plane started"),
    cell("tps", w ? num(w.completion_tokens_per_s, 1) : "…"),
    cell("total", `${g.requests.toFixed(0)} (${g.errors.toFixed(0)} failed)`),
  ];
}

export async function deploymentsPage(ctx) {
  let list;
  try { list = await get("/api/v1/deployments"); } catch (e) {
    put(ctx.main, h("h1", {}, "Deployments"), e.status === 404
      ? h("p", { class: "muted" }, "Serving is not enabled on this control plane (`tyard server --serving`).") : errorBox(e));
    return;
  }
  const box = h("div", { id: "deployments" });
  put(ctx.main, h("h1", {}, "Deployments"), box,
    h("p", { class: "muted" }, "Requests/s, TTFT and completion tokens/s are the gateway's own measurements in this control plane, ",
      "over the last minute (TTFT since it started until requests arrive in that minute); re-read every 5 s."));

  async function draw() {
    const stats = await Promise.all(list.map((d) =>
      get(`/api/v1/deployments/${encodeURIComponent(d.name)}/gateway`).catch(() => null)));
    put(box, list.length
      ? table(["Name", "Team", "Model", "Engine", "Ready / replicas", "Desired", "Requests/s", "TTFT p50 / p90", "Tokens/s", "Requests (failed)", "Autoscale reason"],
        list.map((d, i) => [d.name, d.team, d.model, d.engine, `${d.ready_replicas} / ${d.replicas}`, String(d.desired_replicas),
          ...gatewayCells(d, stats[i]), d.autoscale_reason || "—"]),
        { caption: "deployments", numeric: [5, 6, 7, 8, 9] })
      : h("p", { class: "muted" }, "No deployments (`tyard deployments create`)."));
  }

  await draw();
  const timer = setInterval(draw, EVERY_MS);
  ctx.onLeave(() => clearInterval(timer));
}
