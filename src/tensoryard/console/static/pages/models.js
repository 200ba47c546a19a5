import { get } from "../api.js";
import { errorBox, h, table, when, put } from "../dom.js";

export async function modelsPage(ctx) {
  const detail = h("div", { "aria-live": "polite" });
  let models = [];
  try { models = await get("/api/v1/models"); } catch (e) { put(ctx.main, h("h1", {}, "Models"), errorBox(e)); return; }

  async function show(m) {
    const d = await get(`/api/v1/models/${m.team}/${m.name}`);
    const lineage = async (v) => {
      const l = await get(`/api/v1/models/${m.team}/${m.name}/versions/${v.version}/lineage`);
      const chain = [...l.ancestors].reverse().concat([l.version]);
      const step = (x) => h("li", {}, `${x.model}:${x.version}`, x.job_id ? ` ← job #${x.job_id}${x.checkpoint_step != null ? ` step ${x.checkpoint_step}` : ""}` : "",
        x.data_manifest ? ` ← data ${x.data_manifest.slice(0, 16)}` : "");
      put(lin, h("h3", {}, `Lineage of version ${v.version}`), h("ol", {}, chain.map(step)),
        l.children.length ? h("p", {}, `Children: ${l.children.map((c) => `${c.model}:${c.version}`).join(", ")}`) : null);
    };
    const lin = h("div");
    put(detail, h("h2", {}, `${m.team}/${m.name}`),
      table(["Version", "Aliases", "Job", "Step", "Format", "Size", "Created", ""], d.versions.map((v) => [String(v.version), v.aliases.join(", "),
        v.job_id ? h("a", { href: `#/jobs/${v.job_id}` }, `#${v.job_id}`) : "—", v.checkpoint_step ?? "—", v.format,
        `${(v.size_bytes / 1e6).toFixed(1)} MB`, when(v.created_at), h("button", { type: "button", class: "secondary", onclick: () => lineage(v) }, "Lineage")])), lin);
  }
  put(ctx.main, h("h1", {}, "Models"),
    models.length ? table(["Model", "Team", "Latest", "Aliases", "Created by", ""], models.map((m) => [m.name, m.team, m.latest_version ?? "—",
      Object.entries(m.aliases).map(([a, v]) => `${a}→${v}`).join(", ") || "—", m.created_by,
      h("button", { type: "button", class: "secondary", onclick: () => show(m) }, "Versions")]), { caption: "models" })
      : h("p", { class: "muted" }, "No models registered yet (`tyard models register`)."), detail);
}
