import { post, session } from "../api.js";
import { errorBox, h, put } from "../dom.js";

// The tiny GPT's job.yaml, as `tyard submit` reads it (workdir given: there is no file here).
function template() {
  const team = Object.keys(session.user.teams)[0] || "default";
  return [
    "name: my-run",
    `team: ${team}`,
    "launcher: torchrun",
    'command: ["train.py", "--steps", "100"]',
    "workdir: /path/on/the/control/plane/examples/tiny_gpt",
    "resources:",
    "  nodes: 1",
    "  gpus_per_node: 0",
    "  processes_per_node: 2",
    "  cpu: 2",
    "  memory: 4Gi",
    "env:",
    '  OMP_NUM_THREADS: "1"',
    "checkpoint:",
    "  interval: 50",
    "  keep: 3",
    "restart:",
    "  max_restarts: 3",
    "  backoff: 10s",
    "",
  ].join("\n");
}

// JSON is sent as the spec itself; anything else as YAML text, which the control plane parses
// with the CLI's safe loader and limits (so a syntax error comes back as a named field too).
function body(text) {
  try {
    const spec = JSON.parse(text);
    if (spec && typeof spec === "object" && !Array.isArray(spec)) return { spec };
  } catch { /* not JSON: YAML */ }
  return { spec_yaml: text };
}

export async function submitPage(ctx) {
  const area = h("textarea", { id: "spec", rows: 22, cols: 80, spellcheck: "false", style: "width:100%;font-family:monospace",
    "aria-describedby": "spec-help" }, template());
  const out = h("div", { "aria-live": "polite", id: "submit-result" });
  const form = h("form", { onsubmit: async (e) => {
    e.preventDefault();
    put(out);
    try {
      const job = await post("/api/v1/jobs", body(area.value), { "Idempotency-Key": crypto.randomUUID() });
      location.hash = `#/jobs/${job.id}`;
    } catch (err) {
      put(out, errorBox(err));
      area.setAttribute("aria-invalid", "true");
    }
  } },
  h("h1", {}, "Submit a job"),
  h("p", {}, h("label", { for: "spec" }, "Job spec (YAML or JSON)")),
  h("p", { id: "spec-help", class: "muted" },
    "Paste the job.yaml you give `tyard submit` (examples/tiny_gpt/job.yaml), or the same fields as JSON. ",
    "workdir is a path on the control plane's machine and must be given. ",
    "Nothing is stored while a field is wrong: each bad field is named below with its fix."),
  area, h("p", {}, h("button", { type: "submit", id: "submit" }, "Submit")), out);
  put(ctx.main, form);
}
