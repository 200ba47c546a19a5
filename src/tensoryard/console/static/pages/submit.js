import { post, session } from "../api.js";
import { errorBox, h, put } from "../dom.js";

function template() {
  const team = Object.keys(session.user.teams)[0] || "default";
  return JSON.stringify({
    name: "my-run", team, launcher: "torchrun", command: ["train.py", "--steps", "100"],
    workdir: "/path/on/the/control/plane/examples/tiny_gpt",
    env: { OMP_NUM_THREADS: "1" },
    resources: { nodes: 1, gpus_per_node: 0, processes_per_node: 2, cpu: 2, memory: "4Gi" },
    checkpoint: { interval: 50, keep: 3 }, restart: { max_restarts: 3, backoff: "10s" },
  }, null, 2);
}

export async function submitPage(ctx) {
  const area = h("textarea", { id: "spec", rows: 22, cols: 80, spellcheck: "false", style: "width:100%;font-family:monospace",
    "aria-describedby": "spec-help" }, template());
  const out = h("div", { "aria-live": "polite" });
  const form = h("form", { onsubmit: async (e) => {
    e.preventDefault();
    put(out, );
    let spec;
    try { spec = JSON.parse(area.value); } catch (err) {
      put(out, errorBox({ message: `spec: not valid JSON (${err.message}); fix the text and submit again` })); return;
    }
    try {
      const job = await post("/api/v1/jobs", { spec }, { "Idempotency-Key": crypto.randomUUID() });
      location.hash = `#/jobs/${job.id}`;
    } catch (err) { put(out, errorBox(err)); }
  } },
  h("h1", {}, "Submit a job"),
  h("p", {}, h("label", { for: "spec" }, "Job spec (JSON)")),
  h("p", { id: "spec-help", class: "muted" },
    "The same JobSpec as `tyard submit` takes (docs: README, examples/tiny_gpt/job.yaml), written as JSON. ",
    "workdir is a path on the control plane's machine. Bad fields are named with their fix."),
  area, h("p", {}, h("button", { type: "submit", id: "submit" }, "Submit")), out);
  put(ctx.main, form);
}
