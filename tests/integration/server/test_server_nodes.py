"""`tyard nodes` and the node health API against a live control plane on loopback (uvicorn in
a thread, SQLite, two local nodes, no control loop: what the API records is checked here, what
the loop does with it in tests/unit/server/test_controller_drain.py and the whole loop in
tests/e2e/test_e2e_health_loop.py)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn
from typer.testing import CliRunner

from tensoryard.cli.main import app as cli
from tensoryard.client import Client
from tensoryard.errors import ClientError
from tensoryard.server.config import ServerConfig
from tensoryard.server.main import ControlPlane, build_control_plane


@dataclass
class Live:
    url: str
    plane: ControlPlane

    def admin(self) -> Client:
        return Client(self.url, self.plane.admin_token)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def live(tmp_path: Path, migrated_sqlite_url: str) -> Iterator[Live]:
    port = _free_port()
    config = ServerConfig(
        home=tmp_path / "server",
        db_url=migrated_sqlite_url,
        port=port,
        cpu_slots=2,
        local_nodes=("n1", "n2"),
    )
    plane = build_control_plane(config)
    plane.controller.lead()  # registers the nodes, as the loop does when it takes the lead
    server = uvicorn.Server(uvicorn.Config(plane.app(), port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield Live(f"http://127.0.0.1:{port}", plane)
    server.should_exit = True
    thread.join(timeout=10)
    plane.store.close()


def tyard(live: Live, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        cli, [*args, "--server", live.url, "--token", live.plane.admin_token]
    )
    return result.exit_code, result.output


def test_an_admin_cordons_drains_and_uncordons_a_node_and_reads_its_history(live: Live) -> None:
    code, out = tyard(live, "nodes", "list", "--json")
    assert code == 0, out
    listed = json.loads(out)
    assert [(n["name"], n["state"]) for n in listed] == [("n1", "ready"), ("n2", "ready")]
    # the executor's own view beside ours: both nodes are in it and take jobs
    assert [(n["schedulable"], n["condition"]) for n in listed] == [(True, ""), (True, "")]
    code, out = tyard(live, "nodes", "cordon", "n1", "--reason", "firmware update")
    assert code == 0 and "node n1 is cordoned: firmware update" in out, out
    code, out = tyard(live, "nodes", "cordon", "n1", "-r", "bad fan", "--drain", "--json")
    assert code == 0 and json.loads(out)["state"] == "draining", out
    code, out = tyard(live, "nodes", "uncordon", "n1", "-r", "fan replaced")
    assert code == 0 and "node n1 is ready" in out, out
    code, out = tyard(live, "nodes", "history", "n1", "--json")
    history = json.loads(out)
    assert [(e["kind"], e["message"], e["actor"]) for e in history] == [
        ("uncordon", "fan replaced", "admin"),
        ("drain", "bad fan", "admin"),
        ("cordon", "firmware update", "admin"),
        ("registered", "", ""),
    ]
    code, out = tyard(live, "nodes", "list")
    assert code == 0 and "n1" in out and "ready" in out and "schedulable" in out
    actions = [(a.action, a.object) for a in live.plane.store.list_audit()]
    assert actions.count(("node.manage", "node/n1")) == 3


def test_a_health_report_drains_the_node_it_names_once_and_says_what_it_did(live: Live) -> None:
    xid = {
        "status": "firing",  # Alertmanager's spelling
        "labels": {
            "alertname": "GpuFatalXid",
            "health_action": "drain_node",
            "Hostname": "n2",
            "gpu": "2",
            "xid": "79",
        },
    }
    resolved = {**xid, "status": "resolved", "labels": {**xid["labels"], "Hostname": "n1"}}
    stranger = {**xid, "labels": {**xid["labels"], "Hostname": "n9"}}
    hang = {"labels": {"alertname": "JobHang", "health_action": "restart_job", "job": "4"}}
    with live.admin() as client:
        answer = client.report_health([xid, resolved, stranger, hang])
        assert [n["name"] for n in answer["drained"]] == ["n2"]
        assert answer["drained"][0]["reason"] == "XID 79 on GPU 2"
        assert answer["unknown_nodes"] == ["n9"]
        assert answer["not_handled"] == ["restart_job 4: JobHang"]
        again = client.report_health([xid])
        assert again["drained"] == [] and again["unchanged"] == ["n2"]
        nodes = {n["name"]: n["state"] for n in client.nodes()}
    assert nodes == {"n1": "ready", "n2": "draining"}
    assert len(live.plane.store.node_history("n2")) == 2  # registered, drain


def test_only_platform_admins_change_nodes_and_bad_input_names_the_fix(live: Live) -> None:
    store = live.plane.store
    store.ensure_team("nlp")
    store.create_user("alice")
    store.set_member("nlp", "alice", "member")
    token = store.create_token("alice", name="t").token
    with Client(live.url, token) as alice:
        assert [n["name"] for n in alice.nodes()] == ["n1", "n2"]  # anyone may look
        with pytest.raises(ClientError) as err:
            alice.cordon("n1", "mine now")
        assert err.value.status == 403
        with pytest.raises(ClientError) as err:
            alice.report_health([])
        assert err.value.status == 403
    code, out = tyard(live, "nodes", "cordon", "n9", "--reason", "x")
    assert code == 2 and "tyard nodes list" in out
    response = httpx.post(
        f"{live.url}/api/v1/nodes/n1/cordon",
        json={"reason": "", "drain": "sometimes"},
        headers={"Authorization": f"Bearer {live.plane.admin_token}"},
    )
    assert response.status_code == 422
    paths = {d["path"] for d in response.json()["detail"]}
    assert {"reason", "drain"} <= paths
    assert store.get_node("n1").state == "ready"


def test_top_shows_nodes_teams_and_jobs_once_or_as_json(live: Live, tmp_path: Path) -> None:
    from tensoryard.spec.job import JobSpec
    from tensoryard.spec.states import JobState

    store = live.plane.store
    store.ensure_team("nlp", gpu_quota=8)
    ids = []
    for name, team in (("big", "nlp"), ("small", "default"), ("later", "nlp")):
        spec = JobSpec.model_validate(
            {
                "name": name,
                "team": team,
                "command": ["x.py"],
                "launcher": "python",
                "workdir": str(tmp_path),
                "resources": {"cpu": 1},
            }
        )
        ids.append(store.create_job(spec, run_dir_root=tmp_path / "runs").id)
    store.transition(ids[0], JobState.ADMITTED, reason="test", placement={"n1": []})
    store.set_node_state("n2", "draining", reason="XID 79 on GPU 2", actor="agent")

    code, out = tyard(live, "top", "--json")
    assert code == 0, out
    view = json.loads(out)
    nodes = {n["name"]: n for n in view["nodes"]}
    assert nodes["n1"]["jobs"] == [ids[0]] and nodes["n1"]["cpu_used"] == 1
    assert (nodes["n2"]["state"], nodes["n2"]["reason"]) == ("draining", "XID 79 on GPU 2")
    teams = {t["name"]: t for t in view["teams"]}
    assert (teams["nlp"]["gpu_quota"], teams["nlp"]["running"], teams["nlp"]["pending"]) == (
        8,
        1,
        1,
    )
    assert teams["default"]["pending"] == 1
    assert [j["id"] for j in view["running"]] == [ids[0]]
    assert sorted(j["id"] for j in view["pending"]) == ids[1:] and view["pending_total"] == 2

    code, out = tyard(live, "top", "--once")
    assert code == 0, out
    assert "draining" in out and "XID 79 on GPU 2" in out and "pending (2)" in out


def test_the_node_states_are_platform_metrics(live: Live) -> None:
    live.plane.store.set_node_state("n2", "cordoned", reason="maintenance", actor="admin")
    response = httpx.get(
        f"{live.url}/metrics", headers={"Authorization": f"Bearer {live.plane.admin_token}"}
    )
    lines = [line for line in response.text.splitlines() if line.startswith("tyard_node_state{")]
    assert 'tyard_node_state{node="n2",state="cordoned"} 1.0' in lines
    assert 'tyard_node_state{node="n1",state="ready"} 1.0' in lines
    assert len(lines) == 6  # two nodes x three states


def test_a_failed_preflight_cordons_the_node_and_a_passing_one_is_only_recorded(
    live: Live,
) -> None:
    headers = {"Authorization": f"Bearer {live.plane.admin_token}"}
    passed = {"node": "n1", "ok": True, "checks": [{"name": "gpus", "status": "pass"}]}
    failed = {
        "node": "n2",
        "ok": False,
        "checks": [
            {"name": "gpus", "status": "pass", "message": "8 x H100"},
            {"name": "ib", "status": "fail", "message": "mlx5_3 port 1 is DOWN"},
        ],
    }
    with httpx.Client(base_url=live.url, headers=headers) as http:
        ok = http.post("/api/v1/nodes/n1/preflight", json=passed)
        assert ok.status_code == 200, ok.text
        assert ok.json()["cordoned"] is False and ok.json()["node"]["state"] == "ready"
        bad = http.post("/api/v1/nodes/n2/preflight", json=failed)
        assert bad.status_code == 200, bad.text
        assert bad.json()["cordoned"] is True and bad.json()["failed"] == ["ib"]
        assert bad.json()["node"]["reason"] == "preflight failed: ib: mlx5_3 port 1 is DOWN"
        again = http.post("/api/v1/nodes/n2/preflight", json=passed | {"node": "n2"})
        assert again.json()["node"]["state"] == "cordoned"  # a pass never uncordons
        wrong = http.post("/api/v1/nodes/n1/preflight", json=failed)
        assert wrong.status_code == 422 and "post it to the report's own node" in wrong.text
        unknown = http.post("/api/v1/nodes/n9/preflight", json=passed | {"node": "n9"})
        assert unknown.status_code == 404
    assert [e.kind for e in live.plane.store.node_history("n1")] == ["preflight", "registered"]
    assert [e.kind for e in live.plane.store.node_history("n2")] == [
        "preflight",
        "cordon",
        "registered",
    ]

    # the real preflight of this machine, reported by the CLI to the control plane
    code, out = tyard(
        live,
        "cluster",
        "preflight",
        "--node",
        "n1",
        "--no-allreduce",
        "--report-to",
        "control-plane",
        "--json",
    )
    report = json.loads(out[out.index("{") :])
    assert code == (0 if report["ok"] else 1), out
    with live.admin() as client:
        state = {n["name"]: n["state"] for n in client.nodes()}["n1"]
    assert state == ("ready" if report["ok"] else "cordoned")
