// The console: a hash router over pages; each page renders from the API and follows changes
// through server-sent events (never by polling).
import { get, resume, session, signOut } from "./api.js";
import { h, put } from "./dom.js";
import { signInPage } from "./pages/signin.js";
import { queueData, queuePage } from "./pages/queue.js";
import { jobPage } from "./pages/job.js";
import { submitPage } from "./pages/submit.js";
import { clusterData, clusterPage } from "./pages/cluster.js";
import { nodesPage } from "./pages/nodes.js";
import { usagePage } from "./pages/usage.js";
import { modelsPage } from "./pages/models.js";
import { deploymentsPage } from "./pages/deployments.js";

const PAGES = [
  ["queue", "Queue", queuePage],
  ["submit", "Submit", submitPage],
  ["cluster", "Cluster", clusterPage],
  ["nodes", "Nodes", nodesPage],
  ["usage", "Usage", usagePage],
  ["models", "Models", modelsPage],
  ["deployments", "Deployments", deploymentsPage],
];

let cleanup = [];
// Pages whose first data does not depend on who is signed in: fetched beside the session check
// when the console opens, saving one round trip before the first render.
const FIRST_DATA = { queue: queueData, cluster: clusterData };

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, query = ""] = raw.split("?");
  const parts = path.split("/").filter(Boolean);
  return { parts, params: new URLSearchParams(query) };
}

function renderNav(current) {
  const nav = document.getElementById("nav");
  put(nav, h("ul", {}, PAGES.map(([key, label]) =>
    h("li", {}, h("a", { href: `#/${key}`, "aria-current": key === current ? "page" : null }, label)))));
  const who = document.getElementById("who");
  const u = session.user;
  put(who, 
    h("span", {}, `${u.user}${u.platform_admin ? " (admin)" : ""}`),
    h("button", { type: "button", onclick: async () => { await signOut(); location.hash = "#/signin"; } }, "Sign out"),
  );
  document.getElementById("top").hidden = false;
}

async function route() {
  for (const fn of cleanup) { try { fn(); } catch { /* already closed */ } }
  cleanup = [];
  const main = document.getElementById("main");
  const { parts, params } = parseHash();
  let early = null;
  if (!session.user && parts[0] !== "signin") {
    const url = FIRST_DATA[parts[0] || "queue"]?.(params);
    if (url) early = { url, data: get(url).catch(() => null) };
    const me = await resume();
    if (!me) { location.hash = "#/signin"; return; }
  }
  if (parts[0] === "signin" || !session.user) {
    document.getElementById("top").hidden = true;
    document.title = "Sign in · tensoryard";
    await signInPage(main, () => { location.hash = "#/queue"; });
    return;
  }
  const key = parts[0] || "queue";
  const fetchData = async (url) => {
    if (early && early.url === url) {
      const got = await early.data;
      early = null;
      if (got) return got;
    }
    return get(url);
  };
  const ctx = { main, params, parts, onLeave: (fn) => cleanup.push(fn), fetch: fetchData };
  if (key === "jobs" && parts[1]) {
    renderNav("queue");
    document.title = `Job ${parts[1]} · tensoryard`;
    await jobPage(ctx, Number(parts[1]));
  } else {
    const page = PAGES.find(([k]) => k === key) || PAGES[0];
    renderNav(page[0]);
    document.title = `${page[1]} · tensoryard`;
    await page[2](ctx);
  }
  main.setAttribute("data-ready", "1");
  window.tyardReadyAt = performance.now(); // read by benchmarks/web.py: data drawn
}

window.addEventListener("hashchange", () => { document.getElementById("main").removeAttribute("data-ready"); route(); });
route();
