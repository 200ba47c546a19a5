import { get, stream } from "../api.js";
import { drawDag } from "../dag.js";
import { badge, errorBox, h, table, when, put } from "../dom.js";

const DONE = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);

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
  const pipes = await pipelinesSection(ctx);
  put(ctx.main, h("h1", {}, "Models and pipelines"), h("h2", {}, "Models"),
    models.length ? table(["Model", "Team", "Latest", "Aliases", "Created by", ""], models.map((m) => [m.name, m.team, m.latest_version ?? "—",
      Object.entries(m.aliases).map(([a, v]) => `${a}→${v}`).join(", ") || "—", m.created_by,
      h("button", { type: "button", class: "secondary", onclick: () => show(m) }, "Versions")]), { caption: "models" })
      : h("p", { class: "muted" }, "No models registered yet (`tyard models register`)."), detail, pipes);
}

// Pipeline runs of the teams you see, and one run's DAG, redrawn when its steps' jobs change
// (the page's one event stream; no polling).
async function pipelinesSection(ctx) {
  const box = h("section", { "aria-labelledby": "pipelines-h" });
  const dagBox = h("div", { id: "dag", "aria-live": "polite" });
  let runs = [];
  try { runs = await get("/api/v1/pipelines?limit=50"); } catch (e) { put(box, h("h2", { id: "pipelines-h" }, "Pipelines"), errorBox(e)); return box; }
  let shown = Number(ctx.params.get("pipeline")) || null;
  let redraw = null;
  let pending = null;
  async function show(id) {
    shown = id;
    const run = await get(`/api/v1/pipelines/${id}`);
    put(dagBox, h("h3", {}, `DAG of ${run.name} #${run.id} `, badge(run.state)), h("div"));
    redraw = drawDag(dagBox.lastChild, run);
  }
  const ro = new ResizeObserver(() => redraw && redraw());
  ro.observe(dagBox);
  const es = stream("/api/v1/stream", {
    jobs: () => { // a step's job changed: re-read the shown run, at most once a second
      if (!shown || pending) return;
      pending = setTimeout(() => { pending = null; show(shown).catch(() => {}); }, 1000);
    },
  });
  ctx.onLeave(() => { es.close(); ro.disconnect(); if (pending) clearTimeout(pending); });
  put(box, h("h2", { id: "pipelines-h" }, "Pipelines"),
    runs.length ? table(["Pipeline", "Team", "State", "Steps done", "Created", ""], runs.map((r) => [
      `${r.name} #${r.id}`, r.team, badge(r.state),
      `${r.steps.filter((s) => DONE.has(s.state) || s.state === "CACHED" || s.state === "SKIPPED").length} / ${r.steps.length}`,
      when(r.created_at),
      h("button", { type: "button", class: "secondary", id: `dag-${r.id}`, "aria-controls": "dag",
        onclick: () => show(r.id) }, "DAG")]), { caption: "pipeline runs, newest first" })
      : h("p", { class: "muted" }, "No pipeline runs yet (`tyard pipeline run`)."),
    dagBox);
  if (!shown && runs.length) shown = runs[0].id;
  if (shown) await show(shown).catch((e) => put(dagBox, errorBox(e)));
  return box;
}
