import { get } from "../api.js";
import { errorBox, h, table, put } from "../dom.js";

export async function usagePage(ctx) {
  const since = h("select", { id: "u-since" }, ["7d", "30d", "90d"].map((v) => h("option", { value: v, selected: v === "30d" }, `last ${v}`)));
  const by = h("select", { id: "u-by" }, ["team,day", "team,user", "user,day", "team"].map((v) => h("option", { value: v }, v.replace(",", " × "))));
  const body = h("div");
  const tokens = h("div");
  put(ctx.main, h("h1", {}, "Usage"),
    h("p", { class: "muted" }, "GPU-hours of training jobs, accounted from their attempts: useful (running, not cut short), lost to restarts (attempts that failed), lost to preemption, and idle-allocated (allocated, not yet running). Same numbers: `tyard usage --gpu-hours`, GET /api/v1/usage/gpu-hours."),
    h("div", { class: "row" }, h("div", {}, h("label", { for: "u-since" }, "Window"), since), h("div", {}, h("label", { for: "u-by" }, "Group by"), by)),
    body, h("h2", {}, "Serving tokens per team"), tokens);

  async function load() {
    try {
      const data = await get(`/api/v1/usage/gpu-hours?since=${since.value}&by=${by.value}`);
      const max = Math.max(1e-9, ...data.rows.map((r) => r.total));
      const f = (v) => v.toFixed(2);
      put(body, data.rows.length ? table([...data.by, "Useful", "Restarts", "Preemption", "Idle", "Total", ""],
        [...data.rows.map((r) => [...data.by.map((g) => r[g]), f(r.useful), f(r.restarts), f(r.preemption), f(r.idle), f(r.total),
          h("span", { class: "bar", style: `width:${Math.round((r.total / max) * 120)}px`, "aria-hidden": "true" })]),
         [h("strong", {}, "total"), ...data.by.slice(1).map(() => ""), ...["useful", "restarts", "preemption", "idle", "total"].map((k) => h("strong", {}, f(data.total[k]))), ""]],
        { caption: "GPU-hours", numeric: [1, 2, 3, 4, 5].map((i) => i + data.by.length - 1) })
        : h("p", { class: "muted" }, "No GPU-hours in this window (CPU-only jobs hold no GPUs)."));
    } catch (e) { put(body, errorBox(e)); }
    try {
      const u = await get(`/api/v1/usage?by=team&since=${since.value}`);
      put(tokens, u.rows.length ? table(["Team", "Requests", "Prompt tokens", "Completion tokens"],
        u.rows.map((r) => [r.team, String(r.requests), String(r.prompt_tokens), String(r.completion_tokens)]), { numeric: [1, 2, 3] })
        : h("p", { class: "muted" }, "No serving usage in this window."));
    } catch (e) { put(tokens, h("p", { class: "muted" }, e.status === 404 ? "Serving is not enabled on this control plane." : String(e.message))); }
  }
  since.addEventListener("change", load);
  by.addEventListener("change", load);
  await load();
}
