"""`tyard data prepare|inspect|verify` end to end through Typer."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from tensoryard.cli import data as data_cli
from tensoryard.data.format import shard_file_name


@pytest.fixture
def app() -> typer.Typer:
    root = typer.Typer()
    data_cli.register(root)

    @root.callback()
    def _main() -> None:
        """Root stand-in so `data` stays a sub-command."""

    return root


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": f"doc {i} " * 20}) + "\n" for i in range(200)))
    return path


def run(app: typer.Typer, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["data", *map(str, args)])
    return result.exit_code, result.output


def test_prepare_inspect_and_verify_a_corpus(
    app: typer.Typer, corpus: Path, tmp_path: Path
) -> None:
    out = tmp_path / "ds"
    code, text = run(app, "prepare", corpus, "--out", out, "--shard-tokens", "5000", "-q")
    assert code == 0, text
    assert "prepared" in text and "200 documents" in text
    code, text = run(app, "inspect", out, "--json")
    summary = json.loads(text)
    assert code == 0
    assert summary["num_documents"] == 200
    assert summary["num_shards"] == -(-summary["num_tokens"] // 5000)
    assert summary["tokenizer"]["name"] == "byte"
    code, text = run(app, "inspect", out)
    assert code == 0 and "dataset id" in text and summary["dataset_id"] in text
    code, text = run(app, "verify", out, "-q")
    assert code == 0 and "match the manifest" in text
    code, text = run(app, "prepare", corpus, "--out", out, "--shard-tokens", "5000", "--json")
    assert code == 0 and json.loads(text)["dataset_id"] == summary["dataset_id"]


def test_import_megatron_makes_a_verifiable_dataset(app: typer.Typer, tmp_path: Path) -> None:
    tokens = np.arange(1000, dtype=np.uint16)
    (tmp_path / "m.bin").write_bytes(tokens.tobytes())
    head = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, 2, 3)
    body = np.array([600, 400], "<i4").tobytes() + np.array([0, 1200], "<i8").tobytes()
    (tmp_path / "m.idx").write_bytes(head + body + np.arange(3, dtype="<i8").tobytes())
    code, text = run(app, "import-megatron", tmp_path / "m", "--out", tmp_path / "ds")
    assert code == 0, text
    assert "1,000 tokens" in text and "2 sequences" in text
    assert run(app, "verify", tmp_path / "ds", "-q")[0] == 0
    code, text = run(app, "import-megatron", tmp_path / "nope", "--out", tmp_path / "ds2")
    assert code == 2 and "nope.idx" in text


def test_verify_exits_2_naming_a_corrupt_shard(
    app: typer.Typer, corpus: Path, tmp_path: Path
) -> None:
    out = tmp_path / "ds"
    assert run(app, "prepare", corpus, "--out", out, "--shard-tokens", "5000", "-q")[0] == 0
    shard = out / shard_file_name(1)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    shard.write_bytes(bytes(data))
    code, text = run(app, "verify", out, "-q")
    assert code == 2
    assert "shard-000001.tok" in text and "content hash" in text


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["prepare", "{tmp}/missing.jsonl", "--out", "{tmp}/o"], "no such file"),
        (["prepare", "{corpus}", "--out", "{tmp}/o", "--tokenizer", "nope.json"], "tokenizer"),
        (["prepare", "{corpus}", "--out", "{tmp}/o", "--text-field", "body"], "--text-field"),
        (["inspect", "{tmp}"], "manifest.json: missing"),
        (["verify", "{tmp}"], "manifest.json: missing"),
    ],
    ids=[
        "a missing input file",
        "a tokenizer that is neither byte nor a file",
        "records without the text field",
        "inspecting a directory that is no dataset",
        "verifying a directory that is no dataset",
    ],
)
def test_bad_input_exits_2_with_a_message(
    app: typer.Typer, corpus: Path, tmp_path: Path, args: list[str], expected: str
) -> None:
    filled = [a.format(tmp=tmp_path, corpus=corpus) for a in args]
    code, text = run(app, *filled, *(["-q"] if filled[0] != "inspect" else []))
    assert code == 2
    assert expected in text
    assert "Traceback" not in text
