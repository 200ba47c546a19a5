"""`tyard server --webhooks FILE`: receivers from YAML, every problem named by its field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tensoryard.cli.main import app as cli
from tensoryard.errors import ConfigError, SpecError
from tensoryard.registry.webhooks import EVENTS, load_webhooks_file


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hooks.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_receivers_take_their_secret_from_the_environment_a_file_or_the_yaml(
    tmp_path: Path,
) -> None:
    (tmp_path / "secret").write_text("from-file\n")
    path = _file(
        tmp_path,
        f"""
webhooks:
  - url: https://ci.example.org/hook
    secret_env: HOOK_SECRET
    events: [model.alias.moved]
    retries: 2
    backoff_s: 0.5
  - url: http://127.0.0.1:9000/hook
    secret_file: {tmp_path / "secret"}
  - url: http://127.0.0.1:9001/hook
    secret: inline
    timeout_s: 3
""",
    )
    ci, local, inline = load_webhooks_file(path, environ={"HOOK_SECRET": "from-env"})
    assert (ci.secret, ci.events, ci.retries, ci.backoff_s) == (
        "from-env",
        ("model.alias.moved",),
        2,
        0.5,
    )
    assert (local.secret, local.events) == ("from-file", EVENTS)
    assert (inline.secret, inline.timeout_s) == ("inline", 3.0)


def test_an_empty_file_configures_no_receiver(tmp_path: Path) -> None:
    assert load_webhooks_file(_file(tmp_path, "")) == ()
    assert load_webhooks_file(_file(tmp_path, "webhooks: []\n")) == ()


def test_every_problem_is_reported_at_once_with_its_field_and_fix(tmp_path: Path) -> None:
    path = _file(
        tmp_path,
        """
webhooks:
  - url: https://a.example/hook
    secret_env: NOT_SET_ANYWHERE
  - secret: x
  - url: https://b.example/hook
  - url: https://c.example/hook
    secret: x
    secret_env: Y
  - url: ftp://d.example/hook
    secret: x
  - url: https://e.example/hook
    secret: x
    events: [model.deleted]
  - url: https://f.example/hook
    secret: x
    retries: many
    colour: blue
  - just a string
extra: 1
""",
    )
    with pytest.raises(SpecError) as err:
        load_webhooks_file(path, environ={})
    paths = {i.path: i for i in err.value.issues}
    assert set(paths) == {
        "extra",
        "webhooks[0].secret_env",
        "webhooks[1].url",
        "webhooks[2].secret",
        "webhooks[3].secret",
        "webhooks[4]",
        "webhooks[5]",
        "webhooks[6].retries",
        "webhooks[6].colour",
        "webhooks[7]",
    }
    assert "export NOT_SET_ANYWHERE=" in paths["webhooks[0].secret_env"].fix
    assert "(got secret, secret_env)" in paths["webhooks[3].secret"].message
    assert "not http(s)" in paths["webhooks[4]"].message
    assert "unknown events ['model.deleted']" in paths["webhooks[5]"].message
    assert str(path) in str(err.value)


def test_a_receiver_listed_twice_and_broken_yaml_are_refused(tmp_path: Path) -> None:
    twice = "webhooks:\n" + "  - {url: 'https://a.example/h', secret: x}\n" * 2
    with pytest.raises(SpecError, match=re.escape("receiver https://a.example/h listed twice")):
        load_webhooks_file(_file(tmp_path, twice))
    with pytest.raises(SpecError, match="not valid YAML"):
        load_webhooks_file(_file(tmp_path, "webhooks: [\n"))
    with pytest.raises(SpecError, match="expected a mapping with a list under 'webhooks'"):
        load_webhooks_file(_file(tmp_path, "webhooks: {url: x}\n"))
    with pytest.raises(ConfigError, match=r"cannot read webhooks file .*--webhooks"):
        load_webhooks_file(tmp_path / "missing.yaml")


def test_the_server_refuses_a_bad_webhooks_file_before_it_starts_without_a_traceback(
    tmp_path: Path,
) -> None:
    path = _file(tmp_path, "webhooks:\n  - url: https://a.example/h\n")
    home = tmp_path / "home"
    result = CliRunner().invoke(
        cli, ["server", "--home", str(home), "--port", "1", "--webhooks", str(path)]
    )
    assert result.exit_code != 0
    assert "webhooks[0].secret" in result.output and "secret_env" in result.output
    assert "Traceback" not in result.output
    assert not (home / "tensoryard.db").exists()  # nothing was created
