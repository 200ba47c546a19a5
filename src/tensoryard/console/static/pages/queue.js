import { get, session, stream } from "../api.js";
import { QUEUE_PAGE, queueState, queueUrl } from "../urls.js";
import { ago, announce, badge, errorBox, h, table, when, put } from "../dom.js";

const PAGE = QUEUE_PAGE;
const ACTIVE = new Set(["ADMITTED", "STARTING", "RUNNING", "RESTARTING"]);

export async function queuePage(ctx) {
  const state = queueState(ctx.params);
  const teams = Object.keys(session.user.teams);
  const allTeams = session.user.platform_admin ? get("/api/v1/teams") : null;
  const body = h("div", { id: "queue-body" });
  const shown = new Map(); // job id -> state, of the rows on the page
  const status = h("p", { class: "muted", id: "queue-status" });

  const tab = (which, label) => h("button", { type: "button", "aria-pressed": String(state.which === which),
    onclick: () => go({ which, offset: 0 }) }, label);
  const teamSel = h("select", { id: "f-team", onchange: () => go({ team: teamSel.value, offset: 0 }) },
    h("option", { value: "" }, "all teams"), teams.map((t) => h("option", { value: t, selected: t === state.team }, t)));
  const userIn = h("input", { id: "f-user", value: state.user, placeholder: "any user", size: 12 });
  const filters = h("form", { class: "row", onsubmit: (e) => { e.preventDefault(); go({ user: userIn.value.trim(), offset: 0 }); } },
    h("div", {}, h("label", { for: "f-team" }, "Team"), teamSel),
    h("div", {}, h("label", { for: "f-user" }, "User"), userIn),
    h("div", {}, h("button", { type: "submit", class: "secondary" }, "Filter")));

  function go(change) {
    Object.assign(state, change);
    const q = new URLSearchParams();
    for (const k of ["which", "team", "user", "offset"]) if (state[k]) q.set(k, state[k]);
    location.hash = `#/queue?${q}`;
  }

  async function load() {
    try {
      const data = await ctx.fetch(queueUrl(state));
      put(body, render(data));
      status.textContent = `${data.total} ${state.which} job${data.total === 1 ? "" : "s"} · updated ${new Date().toLocaleTimeString()}`;
    } catch (e) { put(body, errorBox(e)); }
  }

  function render(data) {
    const now = Date.now();
    shown.clear();
    for (const j of data.items) shown.set(j.id, j.state);
    const link = (j) => h("a", { href: `#/jobs/${j.id}` }, `${j.name} #${j.id}`);
    const rows = data.items.map((j) => state.which === "pending"
      ? [String(j.position), link(j), j.team, j.user, badge(j.state), String(j.gpus), String(j.priority),
         h("span", { class: "pending-reason" }, j.pending_reason || "—"),
         h("span", { class: "eta", title: when(j.pending_eta) }, j.pending_eta ? ago(j.pending_eta, now) : "unknown")]
      : [link(j), j.team, j.user, badge(j.state), String(j.gpus), j.nodes.join(", ") || "—",
         ago(j.started_at, now).replace(" ago", ""), String(j.restarts)]);
    const headers = state.which === "pending"
      ? ["#", "Job", "Team", "User", "State", "GPUs", "Priority", "Why pending", "Est. start"]
      : ["Job", "Team", "User", "State", "GPUs", "Nodes", "Elapsed", "Restarts"];
    const first = data.total ? data.offset + 1 : 0, last = data.offset + data.items.length;
    const pager = h("nav", { class: "pager", "aria-label": "Pages of the queue" },
      h("button", { type: "button", class: "secondary", disabled: data.offset === 0,
        onclick: () => go({ offset: Math.max(0, data.offset - PAGE) }) }, "Previous"),
      h("span", {}, `${first}–${last} of ${data.total}`),
      h("button", { type: "button", class: "secondary", disabled: last >= data.total,
        onclick: () => go({ offset: data.offset + PAGE }) }, "Next"));
    return h("div", {}, rows.length ? table(headers, rows, { caption: `${state.which} jobs`, numeric: state.which === "pending" ? [0, 5, 6] : [4, 7] })
      : h("p", { class: "muted" }, `No ${state.which} jobs.`), pager);
  }

  put(ctx.main, 
    h("h1", {}, "Queue"),
    h("p", { class: "muted" }, "Pending jobs in the order the scheduler expects to start them, with why each waits."),
    h("div", { class: "tabs", role: "group", "aria-label": "Which jobs" }, tab("pending", "Pending"), tab("running", "Running")),
    filters, status, body);
  await load();
  if (allTeams) {  // platform admins filter by any team; the list does not hold up the page
    allTeams.then((list) => {
      const names = list.map((t) => t.name).filter((t) => !teams.includes(t));
      teamSel.append(...names.map((t) => h("option", { value: t, selected: t === state.team }, t)));
    }).catch(() => {});
  }

  // A change to a job on this page, or a job joining this list, reloads at once; otherwise
  // (start estimates of other pages moving in a deep backlog) at most every 5 s.
  let timer = null, urgentTimer = false;
  const es = stream("/api/v1/stream", {
    jobs: (ev) => {
      const joins = (j) => (state.which === "pending" ? j.state === "PENDING" : ACTIVE.has(j.state));
      const complete = ev.count <= ev.items.length;
      const urgent = ev.items.some((j) => (shown.has(j.id) ? shown.get(j.id) !== j.state
        : joins(j) && (state.which === "running" || complete)));
      if (urgent) {
        announce(`${ev.count} job${ev.count === 1 ? "" : "s"} changed`);
        if (!urgentTimer) { clearTimeout(timer); urgentTimer = true; timer = setTimeout(() => { urgentTimer = false; timer = null; load(); }, 250); }
      } else if (!timer) {
        timer = setTimeout(() => { timer = null; load(); }, 5000);
      }
    },
  });
  ctx.onLeave(() => { es.close(); clearTimeout(timer); });
}
