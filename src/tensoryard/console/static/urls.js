// Data URLs of pages, shared by the router (which fetches a page's first data beside the
// session check) and the pages themselves.
export const QUEUE_PAGE = 50;

export function queueState(p) {
  return { which: p.get("which") || "pending", team: p.get("team") || "", user: p.get("user") || "",
    offset: Number(p.get("offset") || 0) };
}

export function queueUrl(state) {
  const q = new URLSearchParams({ which: state.which, offset: state.offset, limit: QUEUE_PAGE });
  if (state.team) q.set("team", state.team);
  if (state.user) q.set("user", state.user);
  return `/api/v1/queue?${q}`;
}

export const CLUSTER_URL = "/api/v1/cluster";

// The first data of the pages that have one that does not depend on who is signed in.
export const FIRST_DATA = {
  queue: (params) => queueUrl(queueState(params)),
  cluster: () => CLUSTER_URL,
};
