from __future__ import annotations

import json
from pathlib import Path

import pytest

from tensoryard.agent.fake_nvml import FakeNvml

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


@pytest.fixture
def h100x8() -> FakeNvml:
    """8 H100s fed with the recorded values in fixtures/nvml_h100x8.json."""
    doc = json.loads((FIXTURES / "nvml_h100x8.json").read_text(encoding="utf-8"))
    return FakeNvml.from_records(doc["gpus"])
