import { get } from "../api.js";
import { errorBox, h, table, put } from "../dom.js";

export async function deploymentsPage(ctx) {
  let list;
  try { list = await get("/api/v1/deployments"); } catch (e) {
    put(ctx.main, h("h1", {}, "Deployments"), e.status === 404
      ? h("p", { class: "muted" }, "Serving is not enabled on this control plane (`tyard server --serving`).") : errorBox(e));
    return;
  }
  put(ctx.main, h("h1", {}, "Deployments"),
    list.length ? table(["Name", "Team", "Model", "Engine", "Ready / replicas", "Desired", "Autoscale reason"],
      list.map((d) => [d.name, d.team, d.model, d.engine, `${d.ready_replicas} / ${d.replicas}`, String(d.desired_replicas), d.autoscale_reason || "—"]),
      { caption: "deployments" })
      : h("p", { class: "muted" }, "No deployments (`tyard deployments create`)."),
    h("p", { class: "muted" }, "Request rate, TTFT and tokens/s of the gateway: see the Prometheus metrics (docs/serving.md); not shown here yet."));
}
