import { signIn } from "../api.js";
import { errorBox, h, put } from "../dom.js";

export async function signInPage(main, done) {
  const token = h("input", { id: "token", name: "token", type: "password", autocomplete: "off", required: true,
    "aria-describedby": "token-help" });
  const out = h("div");
  const form = h("form", { class: "signin", onsubmit: async (ev) => {
    ev.preventDefault();
    put(out, );
    try { await signIn(token.value.trim()); done(); } catch (e) { put(out, errorBox(e)); }
  } },
  h("h1", {}, "Sign in to tensoryard"),
  h("p", {}, h("label", { for: "token" }, "API token")),
  h("p", {}, token),
  h("p", { id: "token-help", class: "muted" },
    "The same token the CLI uses (`tyard tokens create`, or $TYARD_HOME/admin.token on a local control plane). ",
    "It is exchanged for a 12-hour session cookie; the page never stores it."),
  h("p", {}, h("button", { type: "submit" }, "Sign in")), out);
  put(main, form);
  token.focus();
}
