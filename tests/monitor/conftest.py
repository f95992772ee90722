"""Fixtures shared by the monitor's tests."""
from __future__ import annotations

import pytest

from neuraldbg.monitor import transfer as T


@pytest.fixture
def seen(monkeypatch):
    """Every StepStats the detectors receive, in order."""
    out = []
    orig = T.to_stepstats
    monkeypatch.setattr(T, "to_stepstats", lambda *a: out.append(orig(*a)) or out[-1])
    return out
