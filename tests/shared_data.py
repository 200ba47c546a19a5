"""The reference data beside the repository (../shared: traces, CRD schemas, exporter lists).

`missing_shared(message)` skips a test that needs it when it is absent, except under CI (the
environment variable CI set), where an absent ../shared fails the run: CI must never pass by
skipping what it was meant to check.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def missing_shared(message: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"../shared is required in CI: {message}", pytrace=False)
    pytest.skip(message)
