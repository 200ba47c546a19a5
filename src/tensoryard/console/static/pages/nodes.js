import { get, post, session, stream } from "../api.js";
import { badge, errorBox, h, table, when, put } from "../dom.js";

export async function nodesPage(ctx) {
  const body = h("div");
  const detail = h("div", { "aria-live": "polite" });
  put(ctx.main, h("h1", {}, "Nodes"), body, detail);
  const admin = session.user.platform_admin;

  async function load() {
    try {
      const [nodes, cluster] = await Promise.all([get("/api/v1/nodes"), get("/api/v1/cluster")]);
      const gpus = Object.fromEntries(cluster.nodes.map((n) => [n.name, n]));
      put(body, table(["Node", "State", "Why", "GPUs (allocated / all)", "Switch", "Since", ""],
        nodes.map((n) => {
          const g = gpus[n.name] || { gpus: [], switch: "" };
          return [n.name, badge(n.state), n.reason || "—",
            `${g.gpus.filter((x) => x.status === "allocated").length} / ${g.gpus.length}`, g.switch || "—", when(n.changed_at),
            h("button", { type: "button", class: "secondary", onclick: () => show(n) }, "History")];
        }), { caption: "nodes" }));
    } catch (e) { put(body, errorBox(e)); }
  }

  async function show(n) {
    const hist = await get(`/api/v1/nodes/${encodeURIComponent(n.name)}/history`);
    const reason = h("input", { id: "node-reason", size: 30, placeholder: "why (required)" });
    const out = h("div");
    const act = async (what, drain) => {
      put(out, );
      try {
        const path = `/api/v1/nodes/${encodeURIComponent(n.name)}/${what}`;
        await post(path, what === "cordon" ? { reason: reason.value, drain } : { reason: reason.value || "uncordoned from the console" });
        await load(); await show(await get("/api/v1/nodes").then((l) => l.find((x) => x.name === n.name)));
      } catch (e) { put(out, errorBox(e)); }
    };
    put(detail, h("h2", {}, `Node ${n.name}`),
      admin ? h("div", { class: "row" }, h("div", {}, h("label", { for: "node-reason" }, "Reason"), reason),
        h("div", {}, h("button", { type: "button", onclick: () => act("cordon", false) }, "Cordon")),
        h("div", {}, h("button", { type: "button", class: "danger", onclick: () => act("cordon", true) }, "Drain")),
        h("div", {}, h("button", { type: "button", class: "secondary", onclick: () => act("uncordon") }, "Uncordon"))) : null,
      out,
      table(["Time", "Kind", "By", "Message"], hist.map((e) => [when(e.ts), e.kind, e.actor, e.message]), { caption: "node history" }));
  }

  await load();
  const es = stream("/api/v1/stream", { nodes: load });
  ctx.onLeave(() => es.close());
}
