"""Fixtures shared by the monitor's tests."""
from __future__ import annotations

import pytest

from tests.tiny import spy_steps


@pytest.fixture
def seen(monkeypatch):
    """Every StepStats the detectors receive, in order."""
    return spy_steps(monkeypatch)
