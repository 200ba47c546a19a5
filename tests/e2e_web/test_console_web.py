"""The console end to end in Chromium against a real control plane: sign in, submit the tiny
GPT from the page and watch its loss plot grow, follow a rank's log, see it restart after a
killed rank, read a pending reason and start estimate, cancel a job and see it change live,
see a member of another team refused; axe-core on every page, and a narrow window.

The tests share one control plane and run in order (each builds on the jobs of the one before).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tensoryard.agent.fake_nvml import FakeNvml
from tensoryard.agent.service import AgentConfig, NodeAgent
from tensoryard.client import Client
from tensoryard.runtime.stragglers import StragglerDetector
from tensoryard.store import Store
from tests.e2e.conftest import REPO, ServerProcess

pytestmark = pytest.mark.timeout(900)

TINY = {
    "name": "tiny-gpt-web",
    "team": "default",
    "launcher": "torchrun",
    "command": [
        "train.py",
        "--steps",
        "40",
        "--fail-at-step",
        "18",
        "--fail-rank",
        "1",
        "--seq-len",
        "64",
        "--d-model",
        "64",
    ],
    "workdir": str(REPO / "examples" / "tiny_gpt"),
    # per-rank numbers every 50 ms (default 1 s): the whole run takes about a second
    "env": {"OMP_NUM_THREADS": "1", "TYARD_RANK_STATS_EVERY_MS": "50"},
    "resources": {"nodes": 1, "gpus_per_node": 0, "processes_per_node": 2, "cpu": 2},
    "checkpoint": {"interval": 5, "keep": 2},
    "restart": {"max_restarts": 2, "backoff": "1s"},
    "max_runtime": "15m",
}
SLEEPER = {
    "team": "default",
    "launcher": "python",
    "command": ["-c", "import time; time.sleep(600)"],
    "workdir": str(REPO),
    "max_runtime": "10m",
}
SERIOUS = {"serious", "critical"}


class State:
    """What the ordered tests hand on to each other."""

    tiny: int = 0
    blocker: int = 0
    other: int = 0
    waiter: int = 0


@pytest.fixture(scope="module")
def admin(server: ServerProcess) -> Client:
    return server.client()


@pytest.fixture(scope="module")
def page(browser: Any, server: ServerProcess) -> Any:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda e: errors.append(str(e)))
    tab.errors = errors
    yield tab
    context.close()
    assert not errors, f"script errors in the console: {errors}"


def sign_in(tab: Any, url: str, token: str) -> None:
    tab.goto(f"{url}/")
    tab.wait_for_selector("#token")
    tab.fill("#token", token)
    tab.click("button[type=submit]")
    tab.wait_for_selector("#queue-status:has-text('updated')")


def go(tab: Any, url: str, where: str) -> None:
    tab.goto(f"{url}/#/{where}")
    tab.wait_for_selector("main[data-ready]")


def points(tab: Any, box: str) -> int:
    got = tab.eval_on_selector_all(
        f"{box} path.line", "ps => ps.map(p => Number(p.dataset.points))"
    )
    return int(sum(got))


def wait_until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def test_sign_in_submit_the_tiny_gpt_and_watch_the_loss_plot_grow(
    page: Any, server: ServerProcess, shots: Path
) -> None:
    page.goto(f"{server.url}/")
    page.wait_for_selector("#token")
    page.screenshot(path=shots / "signin.png")
    sign_in(page, server.url, (server.home / "admin.token").read_text().strip())
    go(page, server.url, "submit")
    # The job.yaml a researcher gives `tyard submit`, pasted as it is.
    page.fill("#spec", yaml.safe_dump(TINY, sort_keys=False))
    page.click("#submit")
    page.wait_for_url("**/#/jobs/*")
    State.tiny = int(page.url.rsplit("/", 1)[1])
    page.wait_for_selector("#plot-loss path.line", timeout=240_000)
    first = points(page, "#plot-loss")
    # No reload: new steps arrive over the job's event stream and the plot redraws.
    grown = wait_until(lambda: points(page, "#plot-loss") > first, 120, "more loss points")
    assert grown
    assert page.get_attribute("#plot-loss svg", "aria-label").startswith("Loss: ")


def test_bad_yaml_on_the_submit_page_is_named_by_field_and_nothing_is_stored(
    page: Any, server: ServerProcess, admin: Client, shots: Path
) -> None:
    go(page, server.url, "submit")
    before = admin.jobs()["total"]
    where = "/srv/tensoryard/examples/tiny_gpt"  # never read: the spec is refused first
    bad = yaml.safe_dump({**TINY, "name": "bad-yaml", "workdir": where}, sort_keys=False)
    # A field of the wrong type and a syntax error, each named like the API's 422 detail.
    page.fill("#spec", bad.replace("cpu: 2", "cpu: lots"))
    page.keyboard.press("Tab")  # to the Submit button, by keyboard
    page.keyboard.press("Enter")
    alert = page.locator("#submit-result [role=alert]")
    alert.wait_for()
    assert "resources.cpu:" in alert.inner_text()
    assert page.get_attribute("#spec", "aria-invalid") == "true"
    page.screenshot(path=shots / "submit-yaml-error.png", full_page=True)
    page.fill("#spec", bad.replace("command:", "command: [oops\n", 1))
    page.click("#submit")
    page.locator(
        "#submit-result [role=alert]", has_text="spec_yaml: malformed YAML at line"
    ).wait_for()
    assert admin.jobs()["total"] == before
    go(page, server.url, f"jobs/{State.tiny}")


def test_follow_a_ranks_log_search_it_and_download_it(page: Any, server: ServerProcess) -> None:
    page.select_option("#log-rank", "1")  # the tiny GPT's rank 1 writes no log lines
    assert "rank=1" in page.get_attribute("#log-download", "href")
    page.select_option("#log-rank", "0")
    assert "rank=0" in page.get_attribute("#log-download", "href")
    wait_until(lambda: "checkpoint" in page.inner_text("#log"), 120, "rank 0's log lines")
    page.fill("#log-search", "checkpoint")
    page.wait_for_selector("#log mark")
    assert "match" in page.inner_text("#log-status")
    page.fill("#log-search", "")


def test_see_it_restart_after_a_killed_rank(
    page: Any, server: ServerProcess, admin: Client, shots: Path
) -> None:
    page.wait_for_selector("text=Attempt 2", timeout=240_000)
    wait_until(lambda: admin.job(State.tiny)["state"] == "SUCCEEDED", 300, "the tiny GPT to end")
    page.wait_for_selector(".badge.s-SUCCEEDED", timeout=20_000)
    assert "attempt 2" in page.inner_text("#plot-loss")  # one line per attempt, in the legend
    go(page, server.url, f"jobs/{State.tiny}")
    page.wait_for_selector("#log:has-text('step')", timeout=30_000)
    page.screenshot(path=shots / "job.png", full_page=True)


def series(tab: Any, box: str) -> list[str]:
    return list(tab.eval_on_selector_all(f"{box} path.line", "ps => ps.map(p => p.dataset.series)"))


def point_counts(tab: Any, box: str) -> list[int]:
    return list(
        tab.eval_on_selector_all(f"{box} path.line", "ps => ps.map(p => Number(p.dataset.points))")
    )


def marked(tab: Any, box: str) -> list[str]:
    """The series a plot draws marked (thick, dashed: a straggler)."""
    return list(
        tab.eval_on_selector_all(f"{box} path.line.marked", "ps => ps.map(p => p.dataset.series)")
    )


def plotted_steps(tab: Any, box: str) -> tuple[int, int]:
    """The first and last step a plot shows, from its description for screen readers."""
    label = tab.get_attribute(f"{box} svg", "aria-label")
    found = re.search(r"steps (\d+) to (\d+)", label)
    assert found, label
    return int(found.group(1)), int(found.group(2))


def test_per_rank_plots_show_each_ranks_steps_and_mark_the_runtimes_straggler(
    page: Any, server: ServerProcess, shots: Path
) -> None:
    go(page, server.url, f"jobs/{State.tiny}")
    boxes = ("#plot-rank-step", "#plot-rank-rate", "#plot-rank-wait")
    page.wait_for_selector("#plot-rank-step svg", timeout=30_000)
    # The latest attempt (2, resumed from a checkpoint after rank 1 was killed): both ranks,
    # each with its steps sampled at most once a second (a short attempt may have one). On a
    # busy 2-core machine the runtime's detector may really name one of them: then it is
    # listed and drawn marked, else the page says none was flagged.
    for box in boxes:
        names = series(page, box)
        assert [n.removesuffix(" (straggler)") for n in names] == ["rank 0", "rank 1"]
        assert points(page, box) >= 2
        assert marked(page, box) == [n for n in names if n.endswith("(straggler)")]
    flagged = marked(page, "#plot-rank-step")
    text = page.inner_text("#stragglers")
    for name in flagged:
        assert f"Straggler: {name.removesuffix(' (straggler)')} (straggler:" in text
    assert flagged or "No straggler flagged in attempt 2" in text
    assert plotted_steps(page, "#plot-rank-step")[1] <= 40
    # Attempt 1 ran until rank 1 was killed at step 18.
    page.select_option("#ranks-attempt", "1")
    wait_until(lambda: plotted_steps(page, "#plot-rank-step")[1] <= 18, 20, "attempt 1's own steps")
    first, last = plotted_steps(page, "#plot-rank-step")
    assert first < last  # over steps: sampled every 50 ms, more than one point a rank
    assert all(n > 1 for n in point_counts(page, "#plot-rank-step"))
    # A straggler as the runtime names one: rank 0's report of its detector's message (a rank
    # slowed for real is tests/integration/runtime/test_runtime_stragglers_torchrun.py).
    [named] = StragglerDetector(windows=1).observe([0.016, 0.010])
    store = Store.open(f"sqlite:///{server.home / 'tensoryard.db'}", migrate=False)
    try:
        store.add_event(State.tiny, "warning", named.message, attempt=1)
    finally:
        store.close()
    page.select_option("#ranks-attempt", "2")
    page.select_option("#ranks-attempt", "1")  # read attempt 1 again
    page.wait_for_selector("#stragglers :text('Straggler: rank 0')", timeout=30_000)
    assert named.message in page.inner_text("#stragglers")
    for box in boxes:
        assert "rank 0 (straggler)" in marked(page, box)
    page.locator("#ranks").screenshot(path=shots / "ranks.png")


def test_restart_from_a_chosen_checkpoint_resumes_there_in_a_new_job(
    page: Any, server: ServerProcess, admin: Client, shots: Path
) -> None:
    from tests.e2e.conftest import tyard

    kept = sorted(c["step"] for c in admin.checkpoints(State.tiny))
    removed = sorted(r["step"] for r in admin.checkpoint_removals(State.tiny))
    assert kept and removed, (kept, removed)
    chosen = kept[0]  # an older one than the last: the new job has steps left to train
    assert chosen < 40
    # Bad input through the CLI twin and the API: named, with the fix, nothing stored.
    before = admin.jobs()["total"]
    token = (server.home / "admin.token").read_text().strip()
    common = ["--server", server.url, "--token", token]
    gone = tyard("resubmit", str(State.tiny), "--from-step", str(removed[0]), *common)
    assert gone.returncode == 2 and "checkpoint_step:" in gone.stderr, gone.stderr
    assert "removed by its retention policy" in gone.stderr and "Traceback" not in gone.stderr
    unknown = tyard("resubmit", str(State.tiny), "--from-step", "41", *common)
    assert unknown.returncode == 2 and "has no checkpoint at step 41" in unknown.stderr
    assert f"choose one of its checkpoints' steps: {', '.join(map(str, kept))}" in unknown.stderr
    assert admin.jobs()["total"] == before
    # In the console: pick the step, restart, land on the new job's page.
    go(page, server.url, f"jobs/{State.tiny}")
    page.get_by_label("Restart from checkpoint").select_option(str(chosen))
    page.click("#restart")
    page.wait_for_url(lambda url: url.rstrip("/").rsplit("/", 1)[1] != str(State.tiny))
    new = int(page.url.rsplit("/", 1)[1])
    wait_until(lambda: admin.job(new)["state"] == "SUCCEEDED", 300, "the restarted job to end")
    [first, *_] = admin.attempts(new)
    assert first["resumed_from_step"] == chosen
    steps = sorted({m["step"] for m in admin.metrics(new)})
    assert steps[0] == chosen + 1 and steps[-1] == 40, steps
    events = [e["message"] for e in admin.events(new)]
    assert f"restarted from job {State.tiny}'s checkpoint of step {chosen} by admin" in events
    [line] = [a for a in admin.audit(action="job.submit") if a["object"] == f"job/{new}"]
    assert line["actor"] == "admin" and line["outcome"] == "ok"
    page.wait_for_selector(f"text=resumed from step {chosen}", timeout=30_000)
    page.wait_for_selector(".badge.s-SUCCEEDED", timeout=30_000)
    # The top of the page down to the attempts (the logs below name this machine's paths).
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=shots / "restart.png", clip={"x": 0, "y": 0, "width": 1280, "height": 760})


def test_a_pending_job_shows_its_reason_and_start_estimate(
    page: Any, server: ServerProcess, admin: Client, shots: Path
) -> None:
    # Two nodes of 2 CPU slots each: two sleepers fill them, the third waits.
    State.blocker = admin.submit({**SLEEPER, "name": "blocker", "resources": {"cpu": 2}})["id"]
    State.other = admin.submit({**SLEEPER, "name": "other", "resources": {"cpu": 2}})["id"]
    for job in (State.blocker, State.other):
        wait_until(lambda j=job: admin.job(j)["state"] == "RUNNING", 90, "the sleepers to run")
    State.waiter = admin.submit({**SLEEPER, "name": "waiter", "resources": {"cpu": 2}})["id"]
    wait_until(lambda: admin.job(State.waiter)["pending_eta"], 60, "a start estimate")
    go(page, server.url, "queue")
    row = page.locator("tr", has_text=f"waiter #{State.waiter}")
    row.wait_for()
    reason = admin.job(State.waiter)["pending_reason"]
    assert reason and reason in row.locator(".pending-reason").inner_text()
    assert row.locator(".eta").inner_text().startswith("in ")
    page.screenshot(path=shots / "queue.png", full_page=True)
    go(page, server.url, f"jobs/{State.waiter}")
    box = page.locator("#pending-box")
    assert reason in box.inner_text() and "Estimated start" in box.inner_text()


def test_cancel_a_job_from_its_page_and_see_the_queue_change_live(
    page: Any, browser: Any, server: ServerProcess, admin: Client
) -> None:
    page.once("dialog", lambda d: d.accept())
    page.click("#cancel")
    page.wait_for_selector(".badge.s-CANCELLED", timeout=30_000)
    assert admin.job(State.waiter)["state"] == "CANCELLED"
    [line] = [a for a in admin.audit(action="job.cancel") if a["object"] == f"job/{State.waiter}"]
    assert line["actor"] == "admin" and line["outcome"] == "ok"
    go(page, server.url, "queue?which=running")
    page.locator("tr", has_text=f"blocker #{State.blocker}").wait_for()
    started = time.monotonic()
    admin.cancel(State.blocker)
    page.locator("tr", has_text=f"blocker #{State.blocker}").locator(".badge.s-RUNNING").wait_for(
        state="detached", timeout=30_000
    )
    seen_s = time.monotonic() - started
    print(f"live update: cancel -> queue page changed in {seen_s:.2f} s")
    assert seen_s < 10


def test_a_member_of_another_team_is_refused_an_action(
    browser: Any, server: ServerProcess, admin: Client, shots: Path
) -> None:
    admin.create_team("vision")
    token = admin.create_user("vic")["token"]
    admin.set_member("vision", "vic", "member")
    admin.set_member("default", "vic", "viewer")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    try:
        sign_in(tab, server.url, token)
        go(tab, server.url, f"jobs/{State.tiny}")
        tab.click("#resubmit")
        alert = tab.locator("[role=alert]")
        alert.wait_for()
        assert "vic is viewer in team 'default'" in alert.inner_text()
        tab.screenshot(path=shots / "refused.png")
    finally:
        context.close()
    denied = [a for a in admin.audit(actor="vic") if a["outcome"] == "denied"]
    assert denied and denied[-1]["action"] == "job.submit"


def test_an_admin_cordons_a_node_from_the_nodes_page(
    page: Any, server: ServerProcess, admin: Client, shots: Path
) -> None:
    admin.cancel(State.other)
    wait_until(lambda: admin.job(State.other)["state"] == "CANCELLED", 60, "the sleeper to end")
    go(page, server.url, "nodes")
    page.get_by_role("button", name="Details of n2").click()
    page.fill("#node-reason", "XID 79 on GPU 3 (fell off the bus)")
    page.get_by_role("button", name="Cordon", exact=True).click()
    row = page.locator("tr", has_text="n2")
    row.locator(".badge.s-cordoned").wait_for(timeout=20_000)
    assert "XID 79" in row.inner_text()
    page.locator("td", has_text="cordon").first.wait_for()  # the history line
    assert [n["state"] for n in admin.nodes() if n["name"] == "n2"] == ["cordoned"]
    assert any(a["object"] == "node/n2" for a in admin.audit(actor="admin"))
    page.screenshot(path=shots / "nodes.png", full_page=True)


@contextlib.contextmanager
def own_tab(browser: Any, server: ServerProcess) -> Iterator[Any]:
    """A tab of its own, signed in as admin, so a test runs alone too; no script errors."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    try:
        tab = context.new_page()
        tab.on("pageerror", lambda e: errors.append(str(e)))
        sign_in(tab, server.url, (server.home / "admin.token").read_text().strip())
        yield tab
    finally:
        context.close()
    assert not errors, f"script errors in the console: {errors}"


def test_the_nodes_page_shows_gpu_temperatures_xids_and_infiniband_ports_from_the_agent(
    browser: Any, server: ServerProcess, admin: Client, shots: Path
) -> None:
    # n1's node agent: the fake NVML fed with recorded H100 values (GPU 6 at 88 C) and an XID
    # 79 on GPU 2, and a recorded sysfs of 8 InfiniBand ports (mlx5_3 down, with errors).
    fixtures = REPO / "tests" / "unit" / "observability" / "fixtures"
    nvml = FakeNvml.from_records(json.loads((fixtures / "nvml_h100x8.json").read_text())["gpus"])
    nvml.gpus[2].xid_events.append(79)
    agent = NodeAgent(
        AgentConfig(node="n1", port=0, proc_root=fixtures / "proc", sys_root=fixtures / "sys"),
        control_plane=admin,
        nvml=nvml,
    )
    try:
        assert agent.heartbeat()  # what it posts every health interval
    finally:
        agent.stop()
    with own_tab(browser, server) as page:
        _telemetry_on_the_nodes_page(page, server, admin, shots)


def _telemetry_on_the_nodes_page(
    page: Any, server: ServerProcess, admin: Client, shots: Path
) -> None:
    go(page, server.url, "nodes")
    row = page.locator("tr", has=page.get_by_role("button", name="Details of n1"))
    wait_until(lambda: "88 °C (hot)" in row.inner_text(), 20, "n1's telemetry")
    text = row.inner_text()
    assert "GPU 2: XID 79 ×1" in text and "7 / 8 active (mlx5_3/1 DOWN)" in text, text
    other = page.locator("tr", has=page.get_by_role("button", name="Details of n2"))
    assert "active" not in other.inner_text()  # no agent reported for n2
    page.get_by_role("button", name="Details of n1").click()
    detail = page.locator("#node-telemetry")
    detail.wait_for()
    assert "XID 79 ×1" in detail.inner_text()
    port = detail.locator("tr", has_text="mlx5_3/1").inner_text()
    assert "DOWN" in port and "link_downed 2" in port and "symbol_error 117" in port, port
    [n1] = [t for t in admin.node_telemetry() if t["node"] == "n1"]
    assert max(g["temp_c"] for g in n1["gpus"]) == 88
    page.screenshot(path=shots / "nodes-telemetry.png", full_page=True)
    # GPU utilisation per rank on a running job's page: what an agent on a GPU node sends
    # (its labelling of GPUs by job and rank is tests/unit/agent's; jobs here hold no GPU)
    job = admin.submit({**SLEEPER, "name": "gpu-holder"})["id"]
    try:
        wait_until(lambda: admin.job(job)["state"] == "RUNNING", 60, "the job to run")
        held = [
            {"gpu": g, "util_pct": u, "job": str(job), "rank": str(r)}
            for r, (g, u) in enumerate([(4, 97), (5, 31)])
        ]
        admin.node_heartbeat("n2", {"gpus": held})
        go(page, server.url, f"jobs/{job}")
        rows = page.locator("#rank-gpus tbody tr")
        rows.first.wait_for(timeout=20_000)
        assert [rows.nth(i).inner_text().split() for i in range(rows.count())] == [
            ["0", "n2", "4", "97", "%"],
            ["1", "n2", "5", "31", "%"],
        ]
    finally:
        admin.cancel(job)


def _quick_step(name: str, **extra: Any) -> dict[str, Any]:
    job = {"launcher": "python", "command": ["-c", f"print('{name} done')"], "workdir": str(REPO)}
    return {"name": name, "job": job, **extra}


PIPELINE: dict[str, Any] = {
    "name": "web-chain",
    "team": "default",
    "steps": [
        _quick_step("prepare"),
        _quick_step("train", needs=["prepare"]),
        _quick_step("evaluate", needs=["train"]),
        _quick_step("report", needs=["prepare", "evaluate"]),
    ],
}


def test_a_pipeline_dag_shows_its_steps_states_and_cache_hits(
    page: Any, server: ServerProcess, admin: Client, shots: Path
) -> None:
    # After the pending-job test: these one-second python jobs would teach the runtime
    # estimator that the sleepers there end at once (their start estimate would be now).
    first = admin.run_pipeline(PIPELINE)["id"]
    done = wait_until(
        lambda: (p := admin.pipeline(first))["state"] in ("SUCCEEDED", "FAILED") and p, 180, "run 1"
    )
    assert done["state"] == "SUCCEEDED", done
    second = admin.run_pipeline(PIPELINE)["id"]  # the same inputs: every step a cache hit
    again = wait_until(
        lambda: (p := admin.pipeline(second))["state"] in ("SUCCEEDED", "FAILED") and p, 60, "run 2"
    )
    assert [s["state"] for s in again["steps"]] == ["CACHED"] * 4, again
    assert {s["cached_from"] for s in again["steps"]} == {
        f"{first}/{s['name']}" for s in PIPELINE["steps"]
    }
    go(page, server.url, "models")
    page.click(f"#dag-{first}")
    page.locator("#dag h3", has_text=f"#{first}").wait_for()
    steps = page.locator("#dag .dag-step")
    assert steps.count() == 4
    assert (
        page.eval_on_selector_all("#dag .dag-step", "ss => ss.map(s => s.dataset.state)")
        == ["SUCCEEDED"] * 4
    )
    train = page.locator("#step-train")
    job = next(s["job_id"] for s in done["steps"] if s["name"] == "train")
    assert train.locator("a").get_attribute("href") == f"#/jobs/{job}"
    # Four edges: prepare->train, train->evaluate, prepare->report, evaluate->report.
    page.wait_for_function("document.querySelectorAll('#dag svg.dag-edges line').length === 4")
    # Stages by depth: evaluate comes after train, report after evaluate.
    cols = page.eval_on_selector_all(
        "#dag .dag-col",
        "cs => cs.map(c => [...c.querySelectorAll('.dag-step strong')].map(s => s.textContent))",
    )
    assert cols == [["prepare"], ["train"], ["evaluate"], ["report"]]
    page.click(f"#dag-{second}")
    page.locator("#dag h3", has_text=f"#{second}").wait_for()
    assert page.locator("#dag .cache-hit").count() == 4
    assert f"outputs of pipeline {first} step train" in page.inner_text("#step-train")
    assert "4 cache hits" in page.inner_text("#dag-summary")
    page.screenshot(path=shots / "pipelines.png", full_page=True)


PAGES = [
    "queue",
    "queue?which=running",
    "submit",
    "cluster",
    "nodes",
    "usage",
    "models",
    "deployments",
]


def test_every_page_passes_axe_and_works_in_a_narrow_window_and_by_keyboard(
    page: Any, server: ServerProcess, axe_source: str, shots: Path
) -> None:
    found: dict[str, list[str]] = {}
    for where in [*PAGES, f"jobs/{State.tiny}"]:
        go(page, server.url, where)
        page.evaluate(axe_source)
        result = page.evaluate(
            "async () => (await axe.run(document, {runOnly: ['wcag2a', 'wcag2aa', "
            "'wcag21a', 'wcag21aa']})).violations.map(v => [v.id, v.impact, v.nodes.length])"
        )
        bad = [f"{i} ({impact}, {n} nodes)" for i, impact, n in result if impact in SERIOUS]
        if bad:
            found[where] = bad
        name = where.replace("?which=", "-").replace("/", "-")
        if where in ("cluster", "usage", "submit"):
            page.screenshot(path=shots / f"{name}.png", full_page=True)
    assert not found, f"serious accessibility violations: {found}"
    page.set_viewport_size({"width": 400, "height": 800})
    for where in ("queue", "cluster", "models", f"jobs/{State.tiny}"):
        go(page, server.url, where)
        wide = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert wide <= 1, f"{where} scrolls sideways by {wide}px at 400px wide"
    page.screenshot(path=shots / "narrow-job.png")
    page.set_viewport_size({"width": 1280, "height": 900})
    go(page, server.url, "queue")
    page.reload()
    page.wait_for_selector("main[data-ready]")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")  # brand, Queue, Submit
    page.keyboard.press("Enter")
    page.wait_for_selector("#spec")


def _events_until(lines: Any, want: Any, timeout: float) -> list[tuple[str, Any]]:
    """(event, data) pairs read from an event stream until `want(event, data)` holds."""
    got: list[tuple[str, Any]] = []
    event = ""
    deadline = time.monotonic() + timeout
    for line in lines:
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            got.append((event, json.loads(line[6:])))
            if want(event, got[-1][1]):
                return got
        if time.monotonic() > deadline:
            break
    raise AssertionError(f"no matching event within {timeout}s; got {got}")


def test_the_event_stream_sends_changes_only_of_teams_one_may_see(
    server: ServerProcess, admin: Client
) -> None:
    import httpx

    admin.create_team("secret")
    vic = admin.create_token(user="vic")["token"]
    with httpx.Client(base_url=server.url, timeout=httpx.Timeout(30, read=30)) as http:
        assert http.get("/api/v1/stream").status_code == 401
        headers = {"Authorization": f"Bearer {vic}"}
        with http.stream("GET", "/api/v1/stream", headers=headers) as answer:
            assert answer.headers["content-type"].startswith("text/event-stream")
            lines = answer.iter_lines()
            _events_until(lines, lambda e, d: e == "hello", 10)
            hidden = admin.submit({**SLEEPER, "name": "hidden", "team": "secret"})["id"]
            shown = admin.submit({**SLEEPER, "name": "shown", "team": "vision"})["id"]
            got = _events_until(
                lines,
                lambda e, d: e == "jobs" and any(j["id"] == shown for j in d["items"]),
                20,
            )
    ids = {j["id"] for e, d in got if e == "jobs" for j in d["items"]}
    assert shown in ids and hidden not in ids
    for job in (hidden, shown):
        admin.cancel(job)


def test_tyard_usage_gpu_hours_answers_json_and_names_a_bad_grouping(
    server: ServerProcess,
) -> None:
    from tests.e2e.conftest import tyard

    token = (server.home / "admin.token").read_text().strip()
    common = ["--server", server.url, "--token", token]
    done = tyard("usage", "--gpu-hours", "--by", "team,user", "--json", *common)
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout.strip().splitlines()[-1])
    assert body["by"] == ["team", "user"]
    assert body["kinds"] == ["useful", "restarts", "preemption", "idle"]
    assert body["rows"] == []  # CPU-only jobs here: no GPU-hours (tests/integration counts them)
    bad = tyard("usage", "--gpu-hours", "--by", "planet", *common)
    assert bad.returncode == 2 and "by: cannot group GPU-hours by 'planet'" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_the_deployments_page_shows_the_gateways_request_rate_ttft_and_tokens(
    browser: Any, server: ServerProcess, admin: Client, shots: Path
) -> None:
    with own_tab(browser, server) as page:
        _gateway_numbers_on_the_deployments_page(page, server, admin, shots)


def _gateway_numbers_on_the_deployments_page(
    page: Any, server: ServerProcess, admin: Client, shots: Path
) -> None:
    admin.create_deployment(model="mock", name="echo", engine="mock", replicas=1)
    wait_until(lambda: admin.deployment("echo")["ready_replicas"] >= 1, 60, "a ready replica")
    token = (server.home / "admin.token").read_text().strip()
    chat = {"model": "echo", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}

    def ask(n: int) -> None:  # through the gateway, as any OpenAI client would
        with httpx.Client(base_url=server.url, timeout=30) as http:
            for _ in range(n):
                answer = http.post(
                    "/v1/chat/completions", json=chat, headers={"Authorization": f"Bearer {token}"}
                )
                assert answer.status_code == 200, answer.text

    ask(3)
    go(page, server.url, "deployments")
    total = ".total[data-deployment=echo]"
    wait_until(lambda: page.inner_text(total) == "3 (0 failed)", 15, "3 requests counted")
    assert "ms" in page.inner_text(".ttft[data-deployment=echo]")  # p50 / p90 since start
    ask(4)  # while the page is open: its next readings have a rate over the window
    wait_until(lambda: page.inner_text(total) == "7 (0 failed)", 15, "7 requests counted")
    rate = page.inner_text(".rps[data-deployment=echo]")
    assert float(rate) > 0, rate
    assert float(page.inner_text(".tps[data-deployment=echo]")) > 0
    assert page.get_attribute(".ttft[data-deployment=echo]", "title").endswith("last minute")
    # the same numbers through the API
    numbers = httpx.get(
        f"{server.url}/api/v1/deployments/echo/gateway",
        headers={"Authorization": f"Bearer {token}"},
    ).json()
    assert numbers["requests"] == 7 and numbers["errors"] == 0 and numbers["ttft_p90_s"] > 0
    page.screenshot(path=shots / "deployments.png")
