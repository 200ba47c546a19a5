import { canAct, get, post, stream } from "../api.js";
import { ago, announce, badge, errorBox, h, table, when, put } from "../dom.js";
import { lineChart } from "../plot.js";
import { rankPanel } from "./ranks.js";

const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);
const MAX_LINES = 5000;

export async function jobPage(ctx, id) {
  const base = `/api/v1/jobs/${id}`;
  let job;
  try { job = await get(base); } catch (e) { put(ctx.main, h("h1", {}, `Job ${id}`), errorBox(e)); return; }
  const [attempts, checkpoints, metrics, events] = await Promise.all([
    get(`${base}/attempts`), get(`${base}/checkpoints`), get(`${base}/metrics`), get(`${base}/events?limit=10000`),
  ]);
  const summary = await get(`${base}/summary`).catch(() => null);

  const head = h("div");
  const actions = h("div", { class: "row" });
  const message = h("div", { "aria-live": "polite" });
  const lossBox = h("div", { class: "plot", id: "plot-loss" });
  const stepBox = h("div", { class: "plot", id: "plot-step" });
  const extraBox = h("div", { class: "plot", id: "plot-extra" });
  const attemptsBox = h("div");
  const eventsBox = h("div");
  const ckptBox = h("div");
  const goodBox = h("div");
  const series = new Map(); // attempt -> rows
  let lastEvent = 0;
  const evs = [];

  function renderHead() {
    put(head, 
      h("h1", {}, `${job.name} `, h("span", { class: "muted" }, `#${job.id}`), " ", badge(job.state)),
      h("p", {}, `team ${job.team} · user ${job.user} · priority ${job.priority} · ${job.attempts} attempt(s), ${job.restarts} restart(s) · submitted ${when(job.created_at)}`),
      job.state === "PENDING" ? h("div", { class: "notice", id: "pending-box" },
        h("strong", {}, "Why pending: "), h("span", { class: "pending-reason" }, job.pending_reason || "not scheduled yet"), h("br"),
        h("strong", {}, "Estimated start: "), h("span", { class: "eta" }, job.pending_eta ? `${when(job.pending_eta)} (${ago(job.pending_eta)})` : "unknown")) : null,
      job.reason ? h("p", { class: "muted" }, `State reason: ${job.reason}`) : null);
    const allowed = canAct(job.team);
    put(actions, 
      !TERMINAL.has(job.state) ? h("button", { type: "button", class: "danger", id: "cancel", disabled: job.cancel_requested,
        title: allowed ? null : "You are not a member of this job's team",
        onclick: () => act("cancel", `${base}/cancel`) }, job.cancel_requested ? "Cancelling…" : "Cancel job") : null,
      h("button", { type: "button", class: "secondary", id: "resubmit", onclick: () => act("resubmit", `${base}/resubmit`) }, "Resubmit"),
      allowed ? null : h("span", { class: "muted" }, "You may look at this job; actions need the member role in its team."));
  }

  async function act(what, path) {
    if (what === "cancel" && !confirm(`Cancel job ${job.id} (${job.name})?`)) return;
    put(message, );
    try {
      const out = await post(path);
      if (what === "resubmit") { location.hash = `#/jobs/${out.id}`; return; }
      job = out; renderHead(); announce(`job ${job.id} cancel requested`);
      put(message, h("p", { class: "notice" }, "Cancel requested: the job gets SIGTERM to checkpoint, then SIGKILL after its grace period."));
    } catch (e) { put(message, errorBox(e)); }
  }

  function addMetrics(rows) {
    for (const m of rows) {
      if (!series.has(m.attempt)) series.set(m.attempt, []);
      series.get(m.attempt).push(m);
    }
    const pick = (f) => [...series.entries()].map(([a, rs]) => ({ name: `attempt ${a}`, points: rs.map((m) => [m.step, f(m)]) }));
    lineChart(lossBox, { title: "Loss", series: pick((m) => m.values.loss) });
    lineChart(stepBox, { title: "Step time (s)", series: pick((m) => m.step_time_s ?? NaN) });
    const key = ["tokens_per_s", "tokens/s", "throughput", "lr"].find((k) => rows.length && k in rows[0].values)
      || [...series.values()].flat().map((m) => Object.keys(m.values).find((k) => k !== "loss")).find(Boolean);
    if (key) lineChart(extraBox, { title: key, series: pick((m) => m.values[key]) });
  }

  function renderAttempts(list) {
    put(attemptsBox, list.length ? h("ol", { class: "timeline" }, list.map((a) => h("li", {},
      h("strong", {}, `Attempt ${a.number} `), badge(a.state),
      ` ${when(a.started_at)} → ${a.finished_at ? when(a.finished_at) : "now"}`,
      a.nodes && a.nodes.length ? ` on ${a.nodes.join(", ")}` : "",
      a.resumed_from_step != null ? ` · resumed from step ${a.resumed_from_step}` : "",
      a.exit_code != null ? ` · exit ${a.exit_code}` : "",
      a.reason ? h("div", { class: "muted" }, a.reason) : null)))
      : h("p", { class: "muted" }, "No attempt yet."));
  }

  function addEvents(rows) {
    for (const e of rows) { evs.push(e); lastEvent = Math.max(lastEvent, e.id); }
    const shown = evs.slice(-200).reverse();
    put(eventsBox, table(["Time", "Attempt", "Kind", "Message"],
      shown.map((e) => [when(e.ts), e.attempt ?? "", e.kind, e.message]), { caption: "events, newest first" }));
  }

  // Restart from a chosen checkpoint: a new job whose first attempt resumes there (for those
  // who may resubmit; the control plane checks again and names a bad step with its fix).
  const restartOut = h("div", { "aria-live": "polite", id: "restart-result" });
  function restartForm(list) {
    if (!list.length || !canAct(job.team)) return null;
    const before = document.getElementById("restart-step");
    const chosen = before ? before.value : String(list[list.length - 1].step);
    const select = h("select", { id: "restart-step", "aria-describedby": "restart-help" },
      list.map((c) => h("option", { value: String(c.step), selected: String(c.step) === chosen }, `step ${c.step}`)));
    return h("form", { class: "row", id: "restart-form", onsubmit: async (e) => {
      e.preventDefault();
      put(restartOut);
      try {
        const out = await post(`${base}/resubmit`, { checkpoint_step: Number(select.value) });
        location.hash = `#/jobs/${out.id}`;
      } catch (err) { put(restartOut, errorBox(err)); }
    } },
    h("label", { for: "restart-step" }, "Restart from checkpoint"), select,
    h("button", { type: "submit", class: "secondary", id: "restart" }, "Restart as a new job"),
    h("span", { class: "muted", id: "restart-help" }, "A new job with this spec; its first attempt resumes from the chosen step."));
  }

  function renderCheckpoints(list) {
    put(ckptBox, restartForm(list), restartOut, list.length ? table(["Step", "Attempt", "Written", "Size", "Format", "Loss"],
      list.map((c) => [String(c.step), String(c.attempt), when(new Date(c.ts * 1000).toISOString()),
        c.size_bytes != null ? `${(c.size_bytes / 1e6).toFixed(1)} MB` : "—", c.format || "—",
        c.metrics.loss != null ? c.metrics.loss.toFixed(3) : "—"]), { numeric: [0, 1] })
      : h("p", { class: "muted" }, "No checkpoint yet."));
  }

  function renderGoodput(s) {
    if (!s) { put(goodBox, h("p", { class: "muted" }, "No summary yet.")); return; }
    const b = s.breakdown;
    put(goodBox, h("div", { class: "tiles" },
      h("div", { class: "tile" }, "Goodput", h("b", {}, s.goodput != null ? `${(s.goodput * 100).toFixed(0)}%` : "—")),
      h("div", { class: "tile" }, "Steps", h("b", {}, String(s.steps))),
      h("div", { class: "tile" }, "Loss", h("b", {}, s.final_loss != null ? s.final_loss.toFixed(3) : "—")),
      h("div", { class: "tile" }, "Steps lost", h("b", {}, String(s.steps_lost)))),
      b ? table(["Allocated s", "Productive s", "Startup s", "Ckpt save s", "Ckpt restore s", "Lost s", "Hang s", "Queueing s"],
        [[b.allocated_s, b.productive_s, b.startup_s, b.checkpoint_save_s, b.checkpoint_restore_s, b.lost_s, b.hang_s, b.queueing_s].map((v) => v.toFixed(1))],
        { numeric: [0, 1, 2, 3, 4, 5, 6, 7] }) : null);
  }

  const logs = logPanel(job, base, ctx);
  const ranks = rankPanel(base, job.attempts);
  renderHead();
  renderAttempts(attempts);
  addEvents(events);
  renderCheckpoints(checkpoints);
  renderGoodput(summary);
  put(ctx.main, head, actions, message,
    h("h2", {}, "Training"), h("div", { class: "grid2" }, lossBox, stepBox, extraBox),
    h("h2", {}, "Per rank"), ranks.node,
    h("h2", {}, "Goodput"), goodBox,
    h("h2", {}, "Attempts"), attemptsBox,
    h("h2", {}, "Logs"), logs.node,
    h("h2", {}, "Checkpoints"), ckptBox,
    h("h2", {}, "Events"), eventsBox,
    h("h2", {}, "Spec"), h("p", { class: "muted" }, "Environment values are never shown (***)."),
    h("pre", { class: "spec", tabindex: "0", "aria-label": "job spec" }, JSON.stringify(job.spec, null, 2)));
  addMetrics(metrics);

  const lastRow = metrics.at(-1);
  const q = new URLSearchParams({ after_event: lastEvent, attempt: lastRow ? lastRow.attempt : 0, after_step: lastRow ? lastRow.step : -1 });
  const es = stream(`${base}/stream?${q}`, {
    job: async (brief) => {
      const before = job.attempts;
      job = await get(base); renderHead();
      if (brief.attempts !== before || TERMINAL.has(job.state)) {
        renderAttempts(await get(`${base}/attempts`));
        renderCheckpoints(await get(`${base}/checkpoints`));
        renderGoodput(await get(`${base}/summary`).catch(() => null));
        logs.attemptsChanged(job.attempts);
        ranks.attemptsChanged(job.attempts);
      }
    },
    metrics: (rows) => { addMetrics(rows); ranks.stepsArrived(); },
    events: (rows) => { addEvents(rows); if (rows.some((e) => e.kind === "checkpoint")) get(`${base}/checkpoints`).then(renderCheckpoints); },
  });
  ctx.onLeave(() => { es.close(); logs.close(); ranks.close(); });
}

function logPanel(job, base, ctx) {
  const res = job.spec.resources || {};
  const ranks = Math.max(1, (res.nodes || 1) * (res.processes_per_node || 1));
  const rankSel = h("select", { id: "log-rank" }, [...Array(ranks).keys()].map((r) => h("option", { value: r }, `rank ${r}`)));
  const attemptSel = h("select", { id: "log-attempt" });
  const follow = h("input", { type: "checkbox", id: "log-follow", checked: true });
  const search = h("input", { type: "search", id: "log-search", placeholder: "filter lines", size: 16 });
  const download = h("a", { class: "button secondary", id: "log-download", download: "" }, "Download");
  const status = h("span", { class: "muted", id: "log-status" });
  const pre = h("pre", { class: "log", id: "log", tabindex: "0", "aria-label": "log lines" });
  let lines = [], es = null, attempts = job.attempts;

  function fillAttempts(n) {
    const keep = attemptSel.value;
    put(attemptSel, ...[...Array(n).keys()].map((i) => h("option", { value: i + 1 }, `attempt ${i + 1}`)).reverse());
    attemptSel.value = keep && Number(keep) <= n ? keep : String(n);
  }

  function paint() {
    const term = search.value.trim().toLowerCase();
    const shown = term ? lines.filter((l) => l.toLowerCase().includes(term)) : lines;
    put(pre, ...shown.slice(-MAX_LINES).map((l) => {
      if (!term) return document.createTextNode(l + "\n");
      const i = l.toLowerCase().indexOf(term);
      return h("span", {}, l.slice(0, i), h("mark", {}, l.slice(i, i + term.length)), l.slice(i + term.length) + "\n");
    }));
    status.textContent = term ? `${shown.length} of ${lines.length} lines match` : `${lines.length} lines`;
    if (follow.checked) pre.scrollTop = pre.scrollHeight;
  }

  function open() {
    if (es) es.close();
    lines = []; paint();
    if (attempts < 1) { status.textContent = "no attempt yet"; return; }
    const q = new URLSearchParams({ rank: rankSel.value, attempt: attemptSel.value });
    download.href = `${base}/logs?${q}`;
    download.setAttribute("download", `job${job.id}-a${attemptSel.value}-rank${rankSel.value}.log`);
    es = stream(`${base}/logs/stream?${q}`, {
      log: (text) => { lines.push(...text.replace(/\n$/, "").split("\n")); if (lines.length > 4 * MAX_LINES) lines = lines.slice(-MAX_LINES); paint(); },
      end: (e) => { status.textContent += ` · attempt ${e.attempt} ended (${e.state})`; es.close(); },
    }, () => { if (es && es.readyState === 2) status.textContent += " · stream closed"; });
  }

  fillAttempts(job.attempts);
  rankSel.addEventListener("change", open);
  attemptSel.addEventListener("change", open);
  search.addEventListener("input", paint);
  follow.addEventListener("change", paint);
  const node = h("div", {},
    h("div", { class: "row" },
      h("div", {}, h("label", { for: "log-rank" }, "Rank"), rankSel),
      h("div", {}, h("label", { for: "log-attempt" }, "Attempt"), attemptSel),
      h("div", {}, h("label", { for: "log-search" }, "Search"), search),
      h("div", {}, h("span", {}, follow, " ", h("label", { for: "log-follow" }, "Follow"))),
      h("div", {}, download), status),
    pre);
  open();
  return {
    node,
    close: () => { if (es) es.close(); },
    attemptsChanged: (n) => { attempts = n; const wasLatest = Number(attemptSel.value) === n - 1 || !attemptSel.value; fillAttempts(n); if (wasLatest) { attemptSel.value = String(n); open(); } },
  };
}
