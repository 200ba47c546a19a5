import { get, post, session, stream } from "../api.js";
import { badge, errorBox, h, table, when, put } from "../dom.js";

const TELEMETRY_MS = 10000; // the agents send theirs with every heartbeat (5 s by default)
const HOT_C = 85; // a GPU at or above this is shown as hot

function gpuSummary(t) {
  if (!t || !t.gpus.length) return ["—", "—"];
  const temps = t.gpus.map((g) => g.temp_c).filter((v) => v != null);
  const max = temps.length ? Math.max(...temps) : null;
  const xids = t.gpus.flatMap((g) => Object.entries(g.xids || {}).map(([x, n]) => `GPU ${g.gpu}: XID ${x} ×${n}`));
  return [
    max == null ? "—" : h("span", { class: max >= HOT_C ? "straggler" : null }, `${max.toFixed(0)} °C${max >= HOT_C ? " (hot)" : ""}`),
    xids.length ? h("span", { class: "straggler" }, xids.join(", ")) : "none",
  ];
}

function ibSummary(t) {
  if (!t || !t.ib_ports.length) return "—";
  const up = t.ib_ports.filter((p) => p.state === "ACTIVE").length;
  const errs = t.ib_ports.reduce((sum, p) => sum + Object.values(p.errors || {}).reduce((a, b) => a + b, 0), 0);
  const down = t.ib_ports.filter((p) => p.state !== "ACTIVE").map((p) => `${p.device}/${p.port} ${p.state || "?"}`);
  return h("span", { class: down.length || errs ? "straggler" : null },
    `${up} / ${t.ib_ports.length} active${down.length ? ` (${down.join(", ")})` : ""}${errs ? `, ${errs} errors` : ""}`);
}

function telemetryDetail(t) {
  if (!t) return h("p", { class: "muted" }, "No telemetry: this node's agent has not reported to this control plane.");
  return h("div", { id: "node-telemetry" },
    h("p", { class: "muted" }, `Reported by its agent ${when(t.received_at)}.`),
    h("h3", {}, "GPUs"),
    table(["GPU", "Temperature", "Memory temperature", "XIDs since the agent started"], t.gpus.map((g) => [
      String(g.gpu), g.temp_c != null ? `${g.temp_c.toFixed(0)} °C` : "—", g.memory_temp_c != null ? `${g.memory_temp_c.toFixed(0)} °C` : "—",
      Object.entries(g.xids || {}).map(([x, n]) => `XID ${x} ×${n}`).join(", ") || "none"]), { caption: "GPU telemetry", numeric: [1, 2] }),
    h("h3", {}, "InfiniBand ports"),
    table(["Port", "State", "Physical", "Rate", "Error counters (non-zero)"], t.ib_ports.map((p) => [
      `${p.device}/${p.port}`, p.state || "—", p.physical_state || "—", p.rate_gbps != null ? `${p.rate_gbps} Gb/s` : "—",
      Object.entries(p.errors || {}).filter(([, n]) => n > 0).map(([k, n]) => `${k} ${n}`).join(", ") || "none"]), { caption: "InfiniBand ports" }));
}

export async function nodesPage(ctx) {
  const body = h("div");
  const detail = h("div", { "aria-live": "polite" });
  put(ctx.main, h("h1", {}, "Nodes"), body, detail);
  const admin = session.user.platform_admin;
  const teleBox = h("div");
  let shown = null;

  async function load() {
    try {
      const [nodes, cluster, telemetry] = await Promise.all([get("/api/v1/nodes"), get("/api/v1/cluster"), get("/api/v1/nodes/telemetry")]);
      const gpus = Object.fromEntries(cluster.nodes.map((n) => [n.name, n]));
      const tele = Object.fromEntries(telemetry.map((t) => [t.node, t]));
      put(body, table(["Node", "State", "Why", "GPUs (allocated / all)", "Hottest GPU", "XIDs", "InfiniBand", "Switch", "Since", ""],
        nodes.map((n) => {
          const g = gpus[n.name] || { gpus: [], switch: "" };
          return [n.name, badge(n.state), n.reason || "—",
            `${g.gpus.filter((x) => x.status === "allocated").length} / ${g.gpus.length}`,
            ...gpuSummary(tele[n.name]), ibSummary(tele[n.name]), g.switch || "—", when(n.changed_at),
            h("button", { type: "button", class: "secondary", onclick: () => show(n, tele[n.name]) }, `Details of ${n.name}`)];
        }), { caption: "nodes" }));
      if (shown) put(teleBox, telemetryDetail(tele[shown])); // only this part: a reason being typed stays
    } catch (e) { put(body, errorBox(e)); }
  }

  async function show(n, tele) {
    shown = n.name;
    const hist = await get(`/api/v1/nodes/${encodeURIComponent(n.name)}/history`);
    const reason = h("input", { id: "node-reason", size: 30, placeholder: "why (required)" });
    const out = h("div");
    const act = async (what, drain) => {
      put(out, );
      try {
        const path = `/api/v1/nodes/${encodeURIComponent(n.name)}/${what}`;
        await post(path, what === "cordon" ? { reason: reason.value, drain } : { reason: reason.value || "uncordoned from the console" });
        await load();
        await show((await get("/api/v1/nodes")).find((x) => x.name === n.name), tele);
      } catch (e) { put(out, errorBox(e)); }
    };
    put(teleBox, telemetryDetail(tele));
    put(detail, h("h2", {}, `Node ${n.name}`),
      admin ? h("div", { class: "row" }, h("div", {}, h("label", { for: "node-reason" }, "Reason"), reason),
        h("div", {}, h("button", { type: "button", onclick: () => act("cordon", false) }, "Cordon")),
        h("div", {}, h("button", { type: "button", class: "danger", onclick: () => act("cordon", true) }, "Drain")),
        h("div", {}, h("button", { type: "button", class: "secondary", onclick: () => act("uncordon") }, "Uncordon"))) : null,
      out,
      teleBox,
      h("h3", {}, "History"),
      table(["Time", "Kind", "By", "Message"], hist.map((e) => [when(e.ts), e.kind, e.actor, e.message]), { caption: "node history" }));
  }

  await load();
  const es = stream("/api/v1/stream", { nodes: load });
  const timer = setInterval(load, TELEMETRY_MS);
  ctx.onLeave(() => { es.close(); clearInterval(timer); });
}
