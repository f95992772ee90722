"""The retention sweep's rows (``benchmarks/retention.py``): slow, it trains fine-tunes."""
from __future__ import annotations

import pytest

from benchmarks import retention


@pytest.mark.slow
def test_a_zoo_forgetting_row_and_an_ecosystem_row():
    row = retention.measure("zoo", "lora", "lora_forgetting", 0)
    assert row["retention"] == "lost" and row["lr_test"] == "vanished" and row["ratio"] > 2
    eco = retention.measure("eco", "lora_gpt2", "healthy", 0)
    assert eco["retention"] == "lost" and eco["fraction"] > 1  # the sibling chain is overwritten
    assert eco["lr_test"] == "persisted" and eco["p_healthy_after"] > 0.9
