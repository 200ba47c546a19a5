"""slurmrestd's JSON per OpenAPI version (rest_api.py) and the REST client's discovery, auth and
error translation (rest.py) over httpx's MockTransport. The v0.0.38 node and partition entries
are recorded from the real slurmrestd of scripts/slurm-testenv (Slurm 22.05.8, n2 drained);
the v0.0.40/v0.0.41 shapes follow SchedMD's published schema."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tensoryard.errors import ConfigError, ExecutorError
from tensoryard.executors.slurm.config import SlurmConfig, slurm_config_from
from tensoryard.executors.slurm.rest import SlurmRest, announced_versions
from tensoryard.executors.slurm.rest_api import DIALECTS, V0038, V0040, V0041, supported_versions
from tensoryard.executors.slurm.script import JobDescription
from tensoryard.executors.slurm.status import parse_jobs


def description(**changes: Any) -> JobDescription:
    base: dict[str, Any] = {
        "script": "#!/bin/bash\necho hi\n",
        "name": "tyard.k1",
        "comment": "tensoryard job=7 attempt=1 key=k1 epoch=3",
        "nodes": 2,
        "cpus_per_task": 4,
        "memory_mib": 2048,
        "standard_output": "/runs/job-7/attempt-1/launcher.log",
        "working_directory": "/work",
        "environment": {"PATH": "/usr/bin", "TYARD_JOB_ID": "7"},
        "gpus_per_node": 8,
        "time_limit_min": 90,
        "partition": "gpu",
        "qos": "high",
        "account": "nlp",
        "signal_lead_s": 120,
    }
    return JobDescription(**{**base, **changes})


# -- submission bodies --------------------------------------------------------------------------


def test_v0_0_38_takes_plain_numbers_an_environment_object_and_a_steps_signal() -> None:
    body = V0038().submit_body(description())
    assert body["script"].startswith("#!/bin/bash")
    assert body["job"] == {
        "name": "tyard.k1",
        "comment": "tensoryard job=7 attempt=1 key=k1 epoch=3",
        "nodes": "2",
        "tasks_per_node": 1,
        "cpus_per_task": 4,
        "memory_per_node": 2048,
        "standard_output": "/runs/job-7/attempt-1/launcher.log",
        "current_working_directory": "/work",
        "environment": {"PATH": "/usr/bin", "TYARD_JOB_ID": "7"},
        "requeue": False,
        "signal": "TERM@120",
        "gres": "gpu:8",
        "time_limit": 90,
        "partition": "gpu",
        "qos": "high",
        "account": "nlp",
    }


def test_v0_0_38_leaves_out_what_the_job_does_not_ask_for() -> None:
    job = V0038().submit_body(
        description(gpus_per_node=0, time_limit_min=None, partition=None, qos=None, account=None)
    )["job"]
    assert not {"gres", "time_limit", "partition", "qos", "account"} & set(job)


def test_v0_0_38_cannot_pin_nodes_and_says_which_setting_to_change() -> None:
    assert not V0038().pins_nodes
    with pytest.raises(ExecutorError, match="cannot pin nodes \\(fix: set admission: slurm"):
        V0038().submit_body(description(required_nodes=("n1", "n2")))


def test_v0_0_40_wraps_numbers_lists_the_environment_and_signals_the_batch_shell() -> None:
    body = V0040().submit_body(description(required_nodes=("n1", "n2")))
    job = body["job"]
    assert body["script"].startswith("#!/bin/bash") and "script" not in job
    assert job["nodes"] == "2"
    assert job["memory_per_node"] == {"set": True, "infinite": False, "number": 2048}
    assert job["time_limit"] == {"set": True, "infinite": False, "number": 90}
    assert job["environment"] == ["PATH=/usr/bin", "TYARD_JOB_ID=7"]
    assert (job["kill_warning_signal"], job["kill_warning_flags"]) == ("USR1", ["BATCH_JOB"])
    assert job["kill_warning_delay"]["number"] == 120
    assert job["tres_per_node"] == "gres/gpu:8"
    assert job["required_nodes"] == ["n1", "n2"] and job["requeue"] is False
    assert "signal" not in job and "gres" not in job


def test_v0_0_41_takes_the_script_inside_the_job() -> None:
    body = V0041().submit_body(description())
    assert set(body) == {"job"} and body["job"]["script"].startswith("#!/bin/bash")
    assert body["job"]["memory_per_node"]["number"] == 2048


@pytest.mark.parametrize(
    ("answer", "job_id"),
    [({"job_id": 12, "step_id": "BATCH"}, 12), ({"job_id": {"set": True, "number": 40}}, 40)],
    ids=["a plain job id (v0.0.38)", "a wrapped one"],
)
def test_the_new_job_id_is_read_from_the_submission_answer(
    answer: dict[str, Any], job_id: int
) -> None:
    assert V0038().submitted_id(answer) == job_id


def test_an_answer_without_a_job_id_is_an_error_naming_the_version() -> None:
    with pytest.raises(
        ExecutorError, match=r"slurmrestd v0\.0\.40 answered the submission without"
    ):
        V0040().submitted_id({"errors": []})


# -- nodes and partitions -------------------------------------------------------------------------

NODES_0038 = [  # recorded: GET /slurm/v0.0.38/nodes (fields the executor reads)
    {"name": "n1", "cpus": 4, "real_memory": 4000, "gres": "gpu:4", "state": "idle",
     "state_flags": [], "partitions": ["debug", "long"]},
    {"name": "n2", "cpus": 4, "real_memory": 4000, "gres": "gpu:4", "state": "idle",
     "state_flags": ["DRAIN"], "partitions": ["debug", "long"]},
]  # fmt: skip
PARTITIONS_0038 = [  # recorded: GET /slurm/v0.0.38/partitions
    {"name": "debug", "nodes": "n[1-2]", "flags": ["default"], "state": "UP"},
    {"name": "long", "nodes": "n[1-2]", "flags": [], "state": "UP"},
]


def test_v0_0_38_nodes_read_as_scontrol_shows_them_and_a_drained_one_is_unavailable() -> None:
    n1, n2 = (V0038().node(raw) for raw in NODES_0038)
    assert (n1.name, n1.cpus, n1.memory_mib, n1.gpus, n1.gpu_model) == ("n1", 4, 4000, 4, "gpu")
    assert n1.state == "IDLE" and n1.available and n1.partitions == ("debug", "long")
    assert n2.state == "IDLE+DRAIN" and not n2.available


def test_v0_0_38_partitions_say_which_is_the_default_and_whether_they_are_up() -> None:
    debug, long = (V0038().partition(raw) for raw in PARTITIONS_0038)
    assert (debug.name, debug.default, debug.up) == ("debug", True, True)
    assert (long.name, long.default, long.up) == ("long", False, True)


def test_v0_0_40_nodes_and_partitions_take_state_lists_and_wrapped_numbers() -> None:
    node = V0040().node(
        {"name": "g1", "cpus": 96, "real_memory": {"set": True, "number": 512000},
         "gres": "gpu:h100:8(S:0-1)", "state": ["MIXED", "DRAIN"], "partitions": ["gpu"]}
    )  # fmt: skip
    assert (node.cpus, node.memory_mib, node.gpus, node.gpu_model) == (96, 512000, 8, "h100")
    assert node.state == "MIXED+DRAIN" and not node.available
    part = V0040().partition({"name": "gpu", "partition": {"state": ["UP"]}, "flags": ["DEFAULT"]})
    assert (part.name, part.default, part.up) == ("gpu", True, True)
    down = V0041().partition({"name": "old", "partition": {"state": ["DOWN"]}})
    assert (down.default, down.up) == (False, False)


def test_v0_0_40_job_listings_decode_state_lists_and_exit_code_objects() -> None:
    [job] = parse_jobs(
        {"jobs": [{"job_id": 9, "name": "tyard.k9", "job_state": ["FAILED"],
                   "state_reason": "NonZeroExitCode",
                   "exit_code": {"status": ["EXITED"], "return_code": {"set": True, "number": 3}},
                   "start_time": {"set": True, "number": 1700000000}}]}
    )  # fmt: skip
    assert (job.state, job.exit_code, job.attempt_key) == ("FAILED", 3 << 8, "k9")
    assert job.start_time == 1700000000.0


# -- versions -------------------------------------------------------------------------------------


def openapi(*versions: str) -> dict[str, Any]:
    paths: dict[str, Any] = {
        f"/slurm/{v}/{tail}": {} for v in versions for tail in ("jobs", "ping")
    }
    return {"openapi": "3.0.2", "paths": {**paths, "/openapi/v3": {}, "/slurmdb/v0.0.38/qos": {}}}


def test_the_announced_versions_are_read_from_the_openapi_paths() -> None:
    assert announced_versions(openapi("v0.0.38", "v0.0.37")) == ["v0.0.37", "v0.0.38"]
    assert announced_versions({"paths": {}}) == [] and announced_versions({}) == []
    assert supported_versions() == ["v0.0.41", "v0.0.40", "v0.0.38"] == list(DIALECTS)


def rest_for(
    handler: Callable[[httpx.Request], httpx.Response], tmp_path: Path, **settings: Any
) -> SlurmRest:
    token = tmp_path / "token"
    token.write_text("SLURM_JWT=tok-123\n")
    data = {"rest_url": "http://slurm-head:6820", "rest_user": "alice",
            "rest_token_file": str(token), **settings}  # fmt: skip
    return SlurmRest(slurm_config_from(data), transport=httpx.MockTransport(handler))


def serving(*versions: str, seen: list[httpx.Request] | None = None) -> Any:
    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        if request.url.path == "/openapi/v3":
            return httpx.Response(200, json=openapi(*versions))
        return httpx.Response(200, json={"errors": [], "jobs": [], "pings": [{"ping": "UP"}]})

    return handler


@pytest.mark.parametrize(
    ("announced", "spoken"),
    [
        (("v0.0.38",), "v0.0.38"),
        (("v0.0.39", "v0.0.40", "v0.0.41"), "v0.0.41"),
        (("v0.0.40", "v0.0.42"), "v0.0.40"),
    ],
    ids=["Slurm 22.05 speaks v0.0.38", "the newest we speak wins", "an unknown newer one is"
         " passed over"],
)  # fmt: skip
def test_the_newest_version_both_sides_speak_is_chosen(
    tmp_path: Path, announced: tuple[str, ...], spoken: str
) -> None:
    seen: list[httpx.Request] = []
    rest = rest_for(serving(*announced, seen=seen), tmp_path)
    rest.ping()
    assert rest.dialect.version == spoken
    assert seen[-1].url.path == f"/slurm/{spoken}/ping"
    assert seen[-1].headers["X-SLURM-USER-NAME"] == "alice"
    assert seen[-1].headers["X-SLURM-USER-TOKEN"] == "tok-123"  # "SLURM_JWT=" taken off


def test_a_server_that_speaks_no_version_we_speak_is_refused_with_the_fix(tmp_path: Path) -> None:
    rest = rest_for(serving("v0.0.36", "v0.0.37"), tmp_path)
    with pytest.raises(ExecutorError) as caught:
        rest.ping()
    words = str(caught.value)
    assert "slurmrestd at http://slurm-head:6820 (rest_url) speaks v0.0.36, v0.0.37" in words
    assert "tensoryard speaks v0.0.41, v0.0.40, v0.0.38" in words
    assert "fix: load one of them in slurmrestd" in words and "remove rest_url" in words


def test_a_pinned_version_the_server_does_not_announce_is_refused(tmp_path: Path) -> None:
    rest = rest_for(serving("v0.0.38"), tmp_path, rest_api_version="0.0.40")
    with pytest.raises(
        ExecutorError, match=r"rest_api_version v0\.0\.40: slurmrestd at .* does not"
    ):
        rest.ping()
    assert rest_for(serving("v0.0.38", "v0.0.40"), tmp_path, rest_api_version="v0.0.38").dialect
    with pytest.raises(ExecutorError, match=r"rest_api_version v0\.0\.39 is not one tensoryard"):
        _ = rest_for(serving("v0.0.39"), tmp_path, rest_api_version="v0.0.39").dialect


def test_a_server_without_the_openapi_listing_is_asked_version_by_version(
    tmp_path: Path,
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path in ("/openapi/v3", "/slurm/v0.0.41/ping"):
            return httpx.Response(404, text="Unable to find path")
        return httpx.Response(200, json={"errors": [], "pings": [{"ping": "UP"}]})

    rest = rest_for(handler, tmp_path)
    rest.ping()
    assert rest.dialect.version == "v0.0.40"


# -- errors -----------------------------------------------------------------------------------


def test_a_refused_token_names_the_token_setting_and_how_to_get_a_fresh_one(
    tmp_path: Path,
) -> None:
    rest = rest_for(lambda r: httpx.Response(401, text="Authentication failure"), tmp_path)
    with pytest.raises(ExecutorError) as caught:
        rest.jobs()
    words = str(caught.value)
    assert "refused the token in rest_token_file" in words and "for user alice" in words
    assert "fix: put a fresh `scontrol token username=alice lifespan=SECONDS`" in words


def test_slurmctld_refusing_the_token_behind_slurmrestd_is_explained(tmp_path: Path) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/openapi/v3":
            return httpx.Response(200, json=openapi("v0.0.38"))
        error = {"error": "Unspecified error", "error_number": -1, "source": "slurm_load_jobs",
                 "description": "Failed while looking for jobs"}  # fmt: skip
        return httpx.Response(500, json={"errors": [error], "jobs": []})

    with pytest.raises(ExecutorError) as caught:
        rest_for(handler, tmp_path).jobs()
    words = str(caught.value)
    assert "GET /slurm/v0.0.38/jobs failed (HTTP 500): Unspecified error: Failed while" in words
    assert "slurmctld refuses an invalid or expired token this way" in words


def test_an_unreachable_server_names_rest_url_and_the_fix(tmp_path: Path) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("Connection refused", request=request)

    with pytest.raises(ExecutorError, match=r"\(rest_url\) is unreachable .*fix: start slurm"):
        rest_for(handler, tmp_path).ping()

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    with pytest.raises(ExecutorError, match="did not answer GET /openapi/v3 within 15s"):
        rest_for(slow, tmp_path).ping()


def test_a_missing_token_says_where_it_was_looked_for(tmp_path: Path) -> None:
    config = slurm_config_from({"rest_url": "http://h:6820", "rest_token_env": "MY_JWT"})
    rest = SlurmRest(config, transport=httpx.MockTransport(serving("v0.0.38")), environ={})
    with pytest.raises(ExecutorError, match="no slurmrestd token in \\$MY_JWT \\(rest_token_env"):
        rest.ping()
    rest = SlurmRest(
        config, transport=httpx.MockTransport(serving("v0.0.38")), environ={"MY_JWT": "abc"}
    )
    rest.ping()
    gone = slurm_config_from({"rest_url": "http://h:6820", "rest_token_file": str(tmp_path / "x")})
    with pytest.raises(ExecutorError, match="cannot read the slurmrestd token: rest_token_file"):
        SlurmRest(gone, transport=httpx.MockTransport(serving("v0.0.38"))).ping()


def test_cancel_deletes_each_job_with_the_signal_as_a_query(tmp_path: Path) -> None:
    seen: list[httpx.Request] = []
    rest = rest_for(serving("v0.0.38", seen=seen), tmp_path)
    rest.cancel([4, 5], signal="TERM")
    deletes = [(r.method, r.url.path, r.url.params.get("signal")) for r in seen[1:]]
    assert deletes == [
        ("DELETE", "/slurm/v0.0.38/job/4", "TERM"),
        ("DELETE", "/slurm/v0.0.38/job/5", "TERM"),
    ]


def test_submit_posts_the_versions_body_and_returns_the_job_id(tmp_path: Path) -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/openapi/v3":
            return httpx.Response(200, json=openapi("v0.0.40"))
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={"job_id": 77, "errors": []})

    assert rest_for(handler, tmp_path).submit(description()) == 77
    assert bodies[0]["job"]["memory_per_node"]["number"] == 2048


# -- settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"rest_url": "slurm-head:6820"}, "rest_url 'slurm-head:6820' must start with http://"),
        ({"rest_api_version": "latest"}, "rest_api_version 'latest' is not an OpenAPI version"),
        (
            {"rest_url": "http://h:6820", "extra_sbatch_args": ["--constraint=a"]},
            "extra_sbatch_args are sbatch options and rest_url submits through slurmrestd",
        ),
    ],
    ids=["a URL without a scheme", "a version that is not one", "sbatch options in REST mode"],
)
def test_bad_rest_settings_are_refused_naming_the_setting(data: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=words.replace("(", "\\(")):
        slurm_config_from(data)


def test_rest_settings_are_read_and_normalised() -> None:
    config = slurm_config_from(
        {"rest_url": "https://h:6820/", "rest_api_version": "0.0.38", "rest_token_file": "~/t"}
    )
    assert config.rest and config.rest_url == "https://h:6820"
    assert config.rest_api_version == "v0.0.38"
    assert config.rest_token_file == Path("~/t").expanduser()
    assert not SlurmConfig().rest
