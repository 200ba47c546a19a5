import { stream } from "../api.js";
import { CLUSTER_URL } from "../urls.js";
import { announce, badge, errorBox, h, table, put } from "../dom.js";

export async function clusterPage(ctx) {
  const body = h("div", { id: "cluster-body" });
  const status = h("p", { class: "muted", id: "cluster-status" });
  put(ctx.main, h("h1", {}, "Cluster"), status, body);

  async function load() {
    try {
      const c = await ctx.fetch(CLUSTER_URL);
      put(body, render(c));
      status.textContent = `live · updated ${new Date().toLocaleTimeString()}`;
    } catch (e) { put(body, errorBox(e)); }
  }

  function gpuCell(node, g) {
    const label = g.status === "allocated" ? `${g.team}${g.job ? ` #${g.job}` : ""}` : g.status;
    return h("span", { class: `gpu ${g.status}`, title: `${node.name} GPU ${g.index}: ${label}` }, `${g.index}: ${label}`);
  }

  function render(c) {
    const t = c.totals;
    const teams = table(["Team", "Nominal GPUs", "Used", "Borrowed", "Lent", "Running jobs", "Pending jobs"],
      c.teams.map((x) => [x.name, x.nominal == null ? "no limit" : String(x.nominal), String(x.used), String(x.borrowed),
        String(x.lent), String(x.running), String(x.pending)]), { caption: "team quotas", numeric: [1, 2, 3, 4, 5, 6] });
    const bySwitch = Object.entries(c.switches).map(([sw, names]) => h("section", {},
      h("h3", { style: "font-size:1em" }, `Switch ${sw}`),
      h("div", { class: "nodes" }, names.map((n) => c.nodes.find((x) => x.name === n)).map((n) => h("div", { class: "node" },
        h("div", {}, h("strong", {}, n.name), " ", badge(n.state)),
        h("div", { class: "muted" }, `${n.gpus.length} GPU${n.gpus.length === 1 ? "" : "s"}${n.gpu_model ? ` ${n.gpu_model}` : ""}${n.cpu_slots != null ? ` · ${n.cpu_slots} CPU slots` : ""}`),
        n.reason ? h("div", { class: "muted" }, n.reason) : null,
        n.gpus.length ? h("div", { class: "gpus" }, n.gpus.map((g) => gpuCell(n, g))) : null,
        n.cpu_jobs.length ? h("div", { class: "muted" }, `CPU jobs: ${n.cpu_jobs.map((j) => `${j.team}${j.job ? ` #${j.job}` : ""}`).join(", ")}`) : null)))));
    return h("div", {},
      h("div", { class: "tiles" },
        h("div", { class: "tile" }, "GPUs", h("b", {}, String(t.gpus))),
        h("div", { class: "tile" }, "Allocated", h("b", {}, String(t.allocated))),
        h("div", { class: "tile" }, "Free", h("b", {}, String(t.free))),
        h("div", { class: "tile" }, "Cordoned / unavailable", h("b", {}, String(t.unavailable))),
        h("div", { class: "tile" }, "Nodes", h("b", {}, String(t.nodes)))),
      h("h2", {}, "Teams and quotas"),
      h("p", { class: "muted" }, "Borrowed: GPUs used over the team's nominal quota. Lent: the team's idle nominal GPUs that borrowers use now (shared in proportion)."),
      teams, h("h2", {}, "GPUs by node"), ...bySwitch);
  }

  await load();
  // Allocation changes (a job started, ended, was cancelled) redraw at once; pending jobs'
  // moving estimates only change queue lengths: at most every 5 s.
  let timer = null, soon = false;
  const again = (urgent) => {
    if (urgent && !soon) { clearTimeout(timer); soon = true; timer = setTimeout(() => { soon = false; timer = null; load(); }, 300); }
    else if (!timer) timer = setTimeout(() => { timer = null; load(); }, 5000);
  };
  const es = stream("/api/v1/stream", {
    jobs: (ev) => again(ev.items.some((j) => j.state !== "PENDING")),
    nodes: (n) => { announce(`${n.length} node(s) changed`); again(true); },
  });
  ctx.onLeave(() => { es.close(); clearTimeout(timer); });
}
