"""`tyard models ...` against a live control plane on loopback (uvicorn in a thread, SQLite):
promotion of a real tiny-GPT checkpoint, Hugging Face export and import, aliases, lineage,
access rules and bad input."""

from __future__ import annotations

import importlib.util
import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import uvicorn
from safetensors.torch import load_file
from typer.testing import CliRunner

from tensoryard.cli.main import app as cli
from tensoryard.server.config import ServerConfig
from tensoryard.server.main import ControlPlane, build_control_plane
from tensoryard.spec.job import JobSpec

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tiny_gpt" / "model.py"
DATA_HASH = "b3:" + "cd" * 32


def _tiny_gpt() -> Any:
    spec = importlib.util.spec_from_file_location("tiny_gpt_model", EXAMPLE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["tiny_gpt_model"] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class Live:
    url: str
    plane: ControlPlane
    tokens: dict[str, str]
    job_id: int
    model: Any


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def live(tmp_path: Path, migrated_sqlite_url: str) -> Iterator[Live]:
    port = _free_port()
    config = ServerConfig(home=tmp_path / "server", db_url=migrated_sqlite_url, port=port)
    plane = build_control_plane(config)
    store = plane.store
    store.ensure_team("nlp")
    tokens = {"admin": plane.admin_token}
    for user, role in (("vera", "viewer"), ("mo", "member")):
        store.create_user(user)
        store.set_member("nlp", user, role)
        tokens[user] = store.create_token(user).token
    store.create_user("outsider")
    tokens["outsider"] = store.create_token("outsider").token
    # a job of team nlp that wrote a real tiny-GPT checkpoint at step 40
    env = {"TYARD_CODE_REVISION": "f00dbabe", "TYARD_DATA_MANIFEST": DATA_HASH}
    spec = JobSpec.model_validate(
        {"name": "pretrain", "team": "nlp", "command": ["train.py"], "env": env}
    )
    job = store.create_job(spec, run_dir_root=tmp_path / "runs")
    module = _tiny_gpt()
    torch.manual_seed(0)
    model = module.TinyGPT(module.GPTConfig(seq_len=32, d_model=64, n_layers=2, n_heads=4))
    ckpt = Path(job.run_dir) / "ckpt" / "step-000000040"  # inside the job's own files
    ckpt.mkdir(parents=True)
    torch.save({"model": model.state_dict(), "step": 40}, ckpt / "state.pt")
    store.add_checkpoint(job.id, 1, step=40, path=str(ckpt), ts=time.time())
    store.add_metrics(job.id, 1, [{"step": 40, "ts": time.time(), "values": {"loss": 2.0}}])
    server = uvicorn.Server(uvicorn.Config(plane.app(), port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield Live(f"http://127.0.0.1:{port}", plane, tokens, job.id, model)
    server.should_exit = True
    thread.join(timeout=10)
    store.close()


def tyard(live: Live, who: str, *args: str) -> tuple[int, Any]:
    env = {"TYARD_SERVER": live.url, "TYARD_TOKEN": live.tokens[who]}
    result = CliRunner().invoke(cli, list(args), env=env)
    text = result.stdout.strip()
    if result.exit_code == 0 and "--json" in args:
        return 0, json.loads(text.splitlines()[-1])
    return result.exit_code, text + result.stderr


def test_a_checkpoint_goes_from_job_to_registry_to_hugging_face_and_back(
    live: Live, tmp_path: Path
) -> None:
    code, v1 = tyard(
        live, "mo", "models", "register", "nlp/tiny-gpt", "--job", str(live.job_id),
        "--alias", "candidate", "--tag", "stage=pretrain", "--json",
    )  # fmt: skip
    assert code == 0, v1
    assert (v1["version"], v1["checkpoint_step"], v1["metrics"]) == (1, 40, {"loss": 2.0})
    assert (v1["code_revision"], v1["data_manifest"]) == ("f00dbabe", DATA_HASH)
    assert v1["format"] == "state-dict" and v1["aliases"] == ["candidate"]

    out = tmp_path / "hf"
    code, _ = tyard(
        live, "vera", "models", "export", "nlp/tiny-gpt:candidate", str(out), "--hf", "--json"
    )
    assert code == 0
    config = json.loads((out / "config.json").read_text())
    assert (config["d_model"], config["n_layers"], config["seq_len"]) == (64, 2, 32)
    module = sys.modules["tiny_gpt_model"]
    reloaded = module.TinyGPT(
        module.GPTConfig(seq_len=32, d_model=64, n_layers=config["n_layers"], n_heads=4)
    )
    reloaded.load_state_dict(load_file(str(out / "model.safetensors")))
    idx = torch.randint(0, 256, (2, 16))
    assert torch.equal(reloaded(idx), live.model(idx))

    code, imported = tyard(
        live, "mo", "models", "import", "nlp/tiny-gpt", str(out), "--parent", "1",
        "--alias", "production", "--json",
    )  # fmt: skip
    assert code == 0, imported
    assert (imported["version"], imported["format"], imported["source"]) == (2, "hf", "hf-import")

    code, lineage = tyard(live, "vera", "models", "lineage", "nlp/tiny-gpt:production", "--json")
    assert [a["version"] for a in lineage["ancestors"]] == [1]
    code, found = tyard(live, "vera", "models", "lineage", "--data-manifest", DATA_HASH, "--json")
    assert [(v["model"], v["version"]) for v in found] == [("tiny-gpt", 1)]
    code, model = tyard(live, "vera", "models", "show", "nlp/tiny-gpt", "--json")
    assert model["aliases"] == {"candidate": 1, "production": 2}


def test_files_register_and_aliases_move(live: Live, tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "weights.safetensors").write_bytes(b"\0" * 100_000)
    for _ in range(2):
        code, v = tyard(
            live, "mo", "models", "register", "nlp/m", str(tmp_path / "w"), "--metric",
            "eval_loss=1.5", "--json",
        )  # fmt: skip
        assert code == 0, v
    assert v["format"] == "safetensors" and v["metrics"] == {"eval_loss": 1.5}

    assert tyard(live, "mo", "models", "alias", "nlp/m", "production", "1")[0] == 0
    code, moved = tyard(live, "mo", "models", "alias", "nlp/m", "production", "2", "--json")
    assert code == 0 and moved["version"] == 2
    code, v1 = tyard(live, "mo", "models", "show", "nlp/m:1", "--json")
    assert v1["aliases"] == []


@pytest.mark.parametrize(
    ("who", "args", "code", "message"),
    [
        ("mo", ["models", "alias", "nlp/m", "production", "7"], 2, "has no version 7"),
        ("mo", ["models", "show", "nlp/m:staging"], 2, "has no alias 'staging'"),
        ("mo", ["models", "show", "nlp/ghost"], 2, "model nlp/ghost does not exist"),
        ("mo", ["models", "register", "nlp/m", "--job", "999"], 2, "job 999 does not exist"),
        ("mo", ["models", "register", "nlp"], 2, "is not TEAM/MODEL"),
        ("vera", ["models", "alias", "nlp/m", "production", "1"], 1, "needs the role member"),
        ("outsider", ["models", "show", "nlp/m"], 1, "is not a member of team 'nlp'"),
    ],
    ids=[
        "an alias on a missing version",
        "a missing alias",
        "a missing model",
        "a missing job",
        "a reference without a model",
        "a viewer moving an alias",
        "an outsider reading",
    ],
)
def test_bad_requests_get_clear_errors_and_change_nothing(
    live: Live, tmp_path: Path, who: str, args: list[str], code: int, message: str
) -> None:
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "a.bin").write_bytes(b"a" * 1000)
    assert tyard(live, "mo", "models", "register", "nlp/m", str(tmp_path / "w"))[0] == 0

    got, text = tyard(live, who, *args)

    assert got == code and message in " ".join(text.split()), text
    assert live.plane.store.get_model("nlp", "m").latest_version == 1
    assert live.plane.store.get_model("nlp", "m").aliases == {}


def test_importing_a_directory_without_a_tokenizer_names_what_is_missing(
    live: Live, tmp_path: Path
) -> None:
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    (tmp_path / "hf" / "model.safetensors").write_bytes(b"x")

    code, text = tyard(live, "mo", "models", "import", "nlp/m", str(tmp_path / "hf"))

    assert code == 2 and "tokenizer.json: missing" in text
    assert live.plane.store.list_models() == []


def test_a_data_manifest_that_is_neither_a_directory_nor_a_hash_is_refused_before_anything(
    live: Live, tmp_path: Path
) -> None:
    code, out = tyard(
        live, "mo", "models", "register", "nlp/tiny-gpt", "--job", str(live.job_id),
        "--data-manifest", str(tmp_path / "no-such-dataset"),
    )  # fmt: skip
    assert code == 2, out
    assert "neither an existing dataset directory nor a dataset hash" in out
    assert "nothing was registered" in out
    assert live.plane.store.list_models() == [] or all(
        m.latest_version is None for m in live.plane.store.list_models()
    )


def test_an_alias_breaking_the_naming_rule_names_the_field_and_the_fix(live: Live) -> None:
    code, out = tyard(
        live, "mo", "models", "register", "nlp/tiny-gpt", "--job", str(live.job_id),
        "--alias", "Bad_Alias",
    )  # fmt: skip
    assert code == 2, out
    assert "aliases" in out and "fix:" in out, out
    assert "rejected the spec" not in out
