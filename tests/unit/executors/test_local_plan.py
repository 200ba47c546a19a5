"""Launch plans, handles and attempt files of the local executor (no processes started)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

from tensoryard.errors import ExecutorError
from tensoryard.executors.base import LaunchRequest
from tensoryard.executors.local import LocalExecutor, LocalHandle
from tensoryard.executors.local.layout import AttemptLayout, read_json, write_json_atomic
from tensoryard.executors.local.plan import RANK_WRAPPER, LaunchPlan, build_plan
from tensoryard.spec.job import parse_job_spec


def request(tmp_path: Path, **spec: Any) -> LaunchRequest:
    env = spec.pop("request_env", {})
    placement = spec.pop("placement", {})
    data = {"name": "unit", "command": ["train.py", "--lr", "0.1"], "workdir": str(tmp_path)}
    data.update(spec)
    return LaunchRequest(
        job_id="42",
        attempt=2,
        spec=parse_job_spec(data),
        run_dir=tmp_path / "run",
        env=env,
        placement=placement,
    )


def plan_for(tmp_path: Path, base_env: dict[str, str] | None = None, **spec: Any) -> LaunchPlan:
    req = request(tmp_path, **spec)
    layout = AttemptLayout.for_attempt(req.run_dir, req.attempt)
    return build_plan(
        req, layout, python="/py", attempt_key="key-1", base_env=base_env or {"HOME": "/h"}
    )


def test_a_torchrun_job_runs_every_rank_through_the_rank_wrapper(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, resources={"processes_per_node": 2})
    argv = plan.argv
    assert argv[:3] == ["/py", "-m", "torch.distributed.run"]
    assert argv[argv.index("--nproc-per-node") + 1] == "2"
    assert "--standalone" in argv and argv[argv.index("--max-restarts") + 1] == "0"
    wrapper_at = argv.index(str(RANK_WRAPPER))
    assert argv[wrapper_at + 1 :] == [
        str(tmp_path / "run" / "attempt-2"),
        "train.py",
        "--lr",
        "0.1",
    ]
    assert plan.world_size == 2 and plan.cwd == str(tmp_path.resolve())


def test_granted_in_place_restarts_become_torchruns_max_restarts(tmp_path: Path) -> None:
    req = dataclasses.replace(request(tmp_path), in_place_restarts=2)
    layout = AttemptLayout.for_attempt(req.run_dir, req.attempt)
    argv = build_plan(req, layout, python="/py", attempt_key="k", base_env={}).argv
    assert argv[argv.index("--max-restarts") + 1] == "2"


@pytest.mark.parametrize(
    ("env", "attempt", "launch"),
    [
        ({"TYARD_ATTEMPT": "2"}, "2", None),  # torchrun without restarts
        ({"TYARD_ATTEMPT": "2", "TORCHELASTIC_RESTART_COUNT": "0"}, "2", None),
        ({"TYARD_ATTEMPT": "2", "TORCHELASTIC_RESTART_COUNT": "1"}, "3", "2"),
        ({"TYARD_ATTEMPT": "5", "TORCHELASTIC_RESTART_COUNT": "3"}, "8", "5"),
        ({"TYARD_ATTEMPT": "x", "TORCHELASTIC_RESTART_COUNT": "1"}, "x", None),  # left alone
        ({"TORCHELASTIC_RESTART_COUNT": "1"}, None, None),  # not a tensoryard job
    ],
)
def test_the_rank_wrapper_numbers_restarted_workers_as_the_next_attempts(
    env: dict[str, str], attempt: str | None, launch: str | None
) -> None:
    spec = importlib.util.spec_from_file_location("tyard_rank_wrapper", RANK_WRAPPER)
    assert spec is not None and spec.loader is not None
    wrapper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wrapper)
    child = wrapper._child_env(dict(env))
    assert (child.get("TYARD_ATTEMPT"), child.get("TYARD_LAUNCH_ATTEMPT")) == (attempt, launch)


def test_a_python_job_runs_the_script_under_the_given_interpreter(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, launcher="python")
    assert plan.argv == ["/py", "train.py", "--lr", "0.1"]
    assert plan.world_size == 1


def test_job_env_layers_contract_vars_over_spec_env_over_the_base(tmp_path: Path) -> None:
    plan = plan_for(
        tmp_path,
        base_env={"HOME": "/h", "A": "base", "B": "base"},
        env={"A": "spec", "TYARD_RUN_DIR": "from-spec"},
        request_env={"TYARD_RUN_DIR": "/runs/42", "TYARD_CHECKPOINT_DIR": "/ck"},
    )
    env = plan.env
    assert (env["HOME"], env["A"], env["B"]) == ("/h", "spec", "base")
    assert env["TYARD_RUN_DIR"] == "/runs/42" and env["TYARD_CHECKPOINT_DIR"] == "/ck"
    assert (env["TYARD_JOB_ID"], env["TYARD_ATTEMPT"]) == ("42", "2")
    assert env["TYARD_ATTEMPT_KEY"] == "key-1" and env["PYTHONUNBUFFERED"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # a CPU job sees no GPU


def test_a_gpu_job_sees_exactly_its_placed_gpus(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, resources={"gpus_per_node": 2}, placement={"node-a": [5, 3]})
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "3,5"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"resources": {"nodes": 2}}, "single-node jobs but resources.nodes=2"),
        ({"workdir": "/definitely/not/here"}, "workdir /definitely/not/here does not exist"),
        (
            {"resources": {"gpus_per_node": 2}, "placement": {"n": [0]}},
            "placement gives GPUs [0] but the job asks for 2",
        ),
    ],
    ids=[
        "a multi-node job is refused with the fix",
        "a missing workdir is refused before anything starts",
        "a placement with the wrong number of gpus is refused",
    ],
)
def test_impossible_launches_are_refused_with_a_reason(
    tmp_path: Path, spec: dict[str, Any], message: str
) -> None:
    with pytest.raises(ExecutorError, match=message.replace("[", r"\[").replace("]", r"\]")):
        plan_for(tmp_path, **spec)


def test_a_launch_plan_survives_a_json_round_trip(tmp_path: Path) -> None:
    plan = plan_for(tmp_path)
    assert LaunchPlan.from_dict(plan.to_dict()) == plan
    with pytest.raises(ExecutorError, match=r"launch\.json is incomplete"):
        LaunchPlan.from_dict({"launcher": "python"})


HANDLE = LocalHandle(
    job_id="42",
    attempt=2,
    attempt_dir="/runs/42/attempt-2",
    launcher="torchrun",
    world_size=2,
    shim_pid=1234,
    shim_create_time=1764670000.25,
    attempt_key="42-2-abc",
)


def test_a_handle_survives_a_json_round_trip() -> None:
    import json

    data = json.loads(json.dumps(HANDLE.to_dict()))
    assert data["executor"] == "local"
    assert LocalHandle.from_dict(data) == HANDLE


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({**HANDLE.to_dict(), "executor": "kubernetes"}, "belongs to executor 'kubernetes'"),
        ({k: v for k, v in HANDLE.to_dict().items() if k != "shim_pid"}, "malformed"),
        ({**HANDLE.to_dict(), "attempt": "two"}, "malformed"),
    ],
    ids=[
        "a handle of another executor is refused",
        "a handle missing a field is refused",
        "a handle with a wrong type is refused",
    ],
)
def test_bad_handles_raise_executor_errors(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ExecutorError, match=message):
        LocalHandle.from_dict(data)


def test_log_paths_name_one_file_per_rank() -> None:
    paths = LocalExecutor().log_paths(HANDLE.to_dict())
    assert paths == {
        0: Path("/runs/42/attempt-2/rank-0.log"),
        1: Path("/runs/42/attempt-2/rank-1.log"),
    }


def test_a_reused_attempt_directory_is_refused(tmp_path: Path) -> None:
    req = request(tmp_path, launcher="python")
    layout = AttemptLayout.for_attempt(req.run_dir, req.attempt)
    layout.dir.mkdir(parents=True)
    (layout.dir / "exit.json").write_text("{}")
    with pytest.raises(ExecutorError, match="already holds an attempt"):
        LocalExecutor().launch(req)


def test_a_run_dir_outside_the_root_is_refused(tmp_path: Path) -> None:
    executor = LocalExecutor(root=tmp_path / "root")
    with pytest.raises(ExecutorError, match="outside the executor root"):
        executor.launch(request(tmp_path, launcher="python"))


def test_attempt_files_are_written_atomically_and_privately(tmp_path: Path) -> None:
    path = tmp_path / "launch.json"
    write_json_atomic(path, {"a": 1}, mode=0o600)
    assert read_json(path) == {"a": 1}
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["launch.json"]  # no temp file left
    assert read_json(tmp_path / "absent.json") is None


def test_a_damaged_attempt_file_is_an_executor_error(tmp_path: Path) -> None:
    path = tmp_path / "exit.json"
    path.write_text("{not json")
    with pytest.raises(ExecutorError, match=r"exit\.json is not valid JSON"):
        read_json(path)
    path.write_text("[1, 2]")
    with pytest.raises(ExecutorError, match="holds list, expected an object"):
        read_json(path)


def test_rank_logs_are_found_by_name(tmp_path: Path) -> None:
    layout = AttemptLayout(tmp_path)
    for name in ("rank-0.log", "rank-12.log", "rank-1.exit.json", "launcher.log"):
        (tmp_path / name).write_text("")
    assert layout.existing_rank_logs() == {0, 12}


def _rank_wrapper() -> Any:
    spec = importlib.util.spec_from_file_location("tyard_rank_wrapper_wd", RANK_WRAPPER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Composed from the message pieces in torch 2.13.0's libtorch_cuda.so ("Watchdog caught
# collective operation timeout: ", " ran for ", "ProcessGroupNCCL dumping nccl trace to ");
# not recorded from a GPU run (no GPU here).
WATCHDOG_LOG = """step 41 loss 2.3
[rank1]:[E1203 10:00:00.000000 42 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for 600042 milliseconds before timing out.
[rank1]:[E1203 10:00:00.100000 42 ProcessGroupNCCL.cpp:1661] [PG ID 0 PG GUID 0(default_pg) Rank 1] ProcessGroupNCCL dumping nccl trace to /runs/7/nccl_trace_rank_1
"""  # noqa: E501


def test_the_rank_wrapper_names_an_nccl_watchdog_timeout_and_its_trace(tmp_path: Path) -> None:
    wrapper = _rank_wrapper()
    log = tmp_path / "rank-1.log"
    log.write_text(WATCHDOG_LOG)
    message = wrapper._watchdog_message(log)
    assert message.startswith("NCCL watchdog: collective operation timeout: WorkNCCL(SeqNum=812")
    assert "ran for 600042 milliseconds" in message
    assert message.endswith("(flight recorder trace: /runs/7/nccl_trace_rank_1)")
    record = wrapper._record(-6, log)  # the watchdog aborts the process (SIGABRT)
    assert record["error"] == message
    log.write_text("Traceback ...\nValueError: boom\n")
    assert wrapper._watchdog_message(log) == "" and wrapper._record(1, log)["error"] == ""
    assert wrapper._watchdog_message(tmp_path / "missing.log") == ""
    assert wrapper._record(0, log)["error"] == ""


def test_ranks_dump_their_stacks_into_the_attempt_dir_unless_the_job_opts_out(
    tmp_path: Path,
) -> None:
    plan = plan_for(tmp_path)
    assert plan.env["TYARD_STACKS_DIR"] == str(tmp_path / "run" / "attempt-2")
    opted_out = plan_for(tmp_path, env={"TYARD_STACKS_DIR": ""})  # the job uses SIGUSR2 itself
    assert opted_out.env["TYARD_STACKS_DIR"] == ""


def test_a_multi_node_job_on_namespace_nodes_runs_one_torchrun_per_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from tensoryard.executors.local.gang import _node_argv, _node_env
    from tensoryard.executors.local.netns import NetnsNodes

    netns = NetnsNodes(["n1", "n2", "n3"])
    req = request(
        tmp_path,
        resources={"nodes": 2, "processes_per_node": 2},
        placement={"n3": [], "n1": []},
        request_env={"TYARD_SERVER_URL": "http://127.0.0.1:8642"},
    )
    layout = AttemptLayout.for_attempt(req.run_dir, req.attempt)
    plan = build_plan(req, layout, python="/py", attempt_key="k", base_env={}, netns=netns)
    assert plan.argv[:3] == ["/py", "-m", "tensoryard.executors.local.gang"]
    gang = json.loads(plan.argv[3])
    assert [n["name"] for n in gang["nodes"]] == ["n3", "n1"]  # the placement's order
    assert gang["program"][:2] == [str(RANK_WRAPPER), str(layout.dir)]
    first = _node_argv(gang, 0, gang["nodes"][0])
    assert first[:4] == ["ip", "netns", "exec", "tyard-n3"]
    assert first[first.index("--master-addr") + 1] == "10.213.0.4"  # n3, node rank 0
    assert first[first.index("--node-rank") + 1] == "0"
    assert first[first.index("--nproc-per-node") + 1] == "2"
    second = _node_argv(gang, 1, gang["nodes"][1])
    assert second[second.index("--log-dir") + 1].endswith("node-1")
    monkeypatch.setenv("TYARD_SERVER_URL", "http://127.0.0.1:8642")  # what the shim passes on
    env = _node_env(gang, gang["nodes"][1])
    assert env["TYARD_SERVER_URL"] == "http://10.213.0.1:8642"  # the bridge, not loopback
    assert (env["TYARD_NODE"], env["GLOO_SOCKET_IFNAME"]) == ("n1", "eth0")


def test_a_multi_node_plan_refuses_a_node_without_a_namespace(tmp_path: Path) -> None:
    from tensoryard.executors.local.netns import NetnsNodes

    req = request(tmp_path, resources={"nodes": 2}, placement={"n1": [], "n9": []})
    layout = AttemptLayout.for_attempt(req.run_dir, req.attempt)
    netns = NetnsNodes(["n1", "n2"])
    with pytest.raises(ExecutorError, match="only n1, n2 are network-namespace nodes here"):
        build_plan(req, layout, python="/py", attempt_key="k", base_env={}, netns=netns)


def test_a_gang_with_in_place_restarts_rendezvouses_with_c10d_at_node_0(tmp_path: Path) -> None:
    import json

    from tensoryard.executors.local.gang import _node_argv
    from tensoryard.executors.local.netns import NetnsNodes

    req = request(
        tmp_path,
        resources={"nodes": 2, "processes_per_node": 1},
        placement={"n1": [], "n2": []},
    )
    req = dataclasses.replace(req, in_place_restarts=2)
    layout = AttemptLayout.for_attempt(req.run_dir, req.attempt)
    netns = NetnsNodes(["n1", "n2"])
    plan = build_plan(req, layout, python="/py", attempt_key="k", base_env={}, netns=netns)
    gang = json.loads(plan.argv[3])
    first, second = (_node_argv(gang, i, gang["nodes"][i]) for i in (0, 1))
    for argv in (first, second):
        assert argv[argv.index("--rdzv-backend") + 1] == "c10d"
        assert argv[argv.index("--rdzv-endpoint") + 1].startswith("10.213.0.2:")  # n1
        assert argv[argv.index("--rdzv-id") + 1] == layout.dir.name
        assert argv[argv.index("--max-restarts") + 1] == "2"
        assert "--master-addr" not in argv
    assert first[first.index("--rdzv-conf") + 1] == "is_host=true"  # node 0 hosts the store
    assert second[second.index("--rdzv-conf") + 1] == "is_host=false"


def test_the_rank_wrapper_numbers_a_gangs_rounds_alike_on_every_node(tmp_path: Path) -> None:
    """torchrun's restart count grows only on the node whose worker failed; the wrapper
    counts this local rank's starts instead, which every round makes on every node."""
    spec = importlib.util.spec_from_file_location("tyard_rank_wrapper", RANK_WRAPPER)
    assert spec is not None and spec.loader is not None
    wrapper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wrapper)
    base = {"TYARD_ATTEMPT": "3", "TYARD_GANG": "1", "LOCAL_RANK": "0"}
    failed = {**base, "TYARD_NODE": "n1"}  # its torchrun counts the restart
    healthy = {**base, "TYARD_NODE": "n2"}  # restarted for the new round: count stays 0
    rounds = []
    for count_n1, count_n2 in (("0", "0"), ("1", "0"), ("1", "1")):
        a = wrapper._child_env({**failed, "TORCHELASTIC_RESTART_COUNT": count_n1}, tmp_path)
        b = wrapper._child_env({**healthy, "TORCHELASTIC_RESTART_COUNT": count_n2}, tmp_path)
        assert a.get("TYARD_ATTEMPT") == b.get("TYARD_ATTEMPT")
        assert a["TYARD_RESTART_ROUND"] == b["TYARD_RESTART_ROUND"]
        rounds.append((a["TYARD_ATTEMPT"], a.get("TYARD_LAUNCH_ATTEMPT")))
    assert rounds == [("3", None), ("4", "3"), ("5", "3")]
