"""The web console in a real browser: Debian's Chromium driven by Playwright (no browser is
downloaded), against a real `tyard server` started per module.

Needs `scripts/web-testenv build` (Chromium from apt, axe-core from npm into the cache). Under CI
(`CI=true`) a missing browser or axe-core fails the tests; elsewhere they skip saying how to get
them. Screenshots go to `$TYARD_SCREENSHOT_DIR` (default: the test's temporary directory);
`TYARD_SCREENSHOT_DIR=docs/console` refreshes the committed ones.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import REPO, ServerProcess, _kill_leftovers

CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-sync",
    "--no-first-run",
    "--metrics-recording-only",
]
PORTS = range(27210, 27300)  # this area's port range


def missing(what: str) -> None:
    hint = "run scripts/web-testenv build (as root for apt), then pip install playwright"
    if os.environ.get("CI"):
        pytest.fail(f"{what} is required in CI; {hint}", pytrace=False)
    pytest.skip(f"{what} unavailable; {hint}")


def _testenv(what: str) -> str | None:
    done = subprocess.run(
        [str(REPO / "scripts" / "web-testenv"), what], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or None if done.returncode == 0 else None


def free_port() -> int:
    for port in PORTS:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port in {PORTS}")


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path = _testenv("chromium")
    if path is None:
        missing("Debian's chromium")
    assert path is not None
    return path


@pytest.fixture(scope="session")
def axe_source() -> str:
    path = _testenv("axe")
    if path is None:
        missing("axe-core (npm)")
    assert path is not None
    return Path(path).read_text()


# Module scope, not session: Playwright's sync API keeps an asyncio loop running in this thread
# while it is open, and every later test that calls asyncio.run() would fail under it.
@pytest.fixture(scope="module")
def browser(chromium_path: str) -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("the playwright Python package")
    with sync_playwright() as pw:
        # launch() gives every run a fresh temporary profile (user-data-dir) of its own.
        chrome = pw.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS)
        yield chrome
        chrome.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    home = tmp_path_factory.mktemp("console") / "home"
    home.mkdir()
    proc = ServerProcess(
        home=home, port=free_port(), extra_args=["--cpu-slots", "4", "--local-nodes", "n1,n2"]
    )
    proc.start()
    yield proc
    proc.stop()
    _kill_leftovers(home)


@pytest.fixture(scope="session")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = os.environ.get("TYARD_SCREENSHOT_DIR")
    path = (REPO / where) if where else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path
