// The console: a hash router over pages; each page renders from the API and follows changes
// through server-sent events (never by polling).
import { get, resume, session, signOut } from "./api.js";
import { h, put } from "./dom.js";
import { FIRST_DATA } from "./urls.js";

// Each page's module is loaded when it is first shown (the queue's is preloaded with the page).
const PAGES = [
  ["queue", "Queue", async () => (await import("./pages/queue.js")).queuePage],
  ["submit", "Submit", async () => (await import("./pages/submit.js")).submitPage],
  ["cluster", "Cluster", async () => (await import("./pages/cluster.js")).clusterPage],
  ["nodes", "Nodes", async () => (await import("./pages/nodes.js")).nodesPage],
  ["usage", "Usage", async () => (await import("./pages/usage.js")).usagePage],
  ["models", "Models", async () => (await import("./pages/models.js")).modelsPage],
  ["deployments", "Deployments", async () => (await import("./pages/deployments.js")).deploymentsPage],
];
const JOB_PAGE = async () => (await import("./pages/job.js")).jobPage;
const SIGNIN_PAGE = async () => (await import("./pages/signin.js")).signInPage;

let cleanup = [];

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
  // On opening, the page's module and first data load beside the session check.
  const key = parts[0] || "queue";
  const page = key === "jobs" && parts[1] ? null : PAGES.find(([k]) => k === key) || PAGES[0];
  const module = parts[0] === "signin" ? null : (page ? page[2] : JOB_PAGE)();
  let early = null;
  if (!session.user && parts[0] !== "signin") {
    const url = FIRST_DATA[key]?.(params);
    if (url) early = { url, data: get(url).catch(() => null) };
    const me = await resume();
    if (!me) { location.hash = "#/signin"; return; }
  }
  if (parts[0] === "signin" || !session.user) {
    document.getElementById("top").hidden = true;
    document.title = "Sign in · tensoryard";
    await (await SIGNIN_PAGE())(main, () => { location.hash = "#/queue"; });
    return;
  }
  const fetchData = async (url) => {
    if (early && early.url === url) {
      const got = await early.data;
      early = null;
      if (got) return got;
    }
    return get(url);
  };
  const ctx = { main, params, parts, onLeave: (fn) => cleanup.push(fn), fetch: fetchData };
  if (!page) {
    renderNav("queue");
    document.title = `Job ${parts[1]} · tensoryard`;
    await (await module)(ctx, Number(parts[1]));
  } else {
    renderNav(page[0]);
    document.title = `${page[1]} · tensoryard`;
    await (await module)(ctx);
  }
  main.setAttribute("data-ready", "1");
  window.tyardReadyAt = performance.now(); // read by benchmarks/web.py: data drawn
}

window.addEventListener("hashchange", () => { document.getElementById("main").removeAttribute("data-ready"); route(); });
route();
