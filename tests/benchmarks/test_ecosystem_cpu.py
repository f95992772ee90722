"""A CPU without bf16 LSTM kernels: the ecosystem LSTM runs in float32 under bf16 autocast, and
says so, instead of failing (oneDNN has no bf16 LSTM without AVX-512 BF16; ``ONEDNN_MAX_CPU_ISA=AVX2``
gives the same answer on a CPU that has it)."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from benchmarks import ecosystem as eco
from benchmarks.ecosystem import cpu
from benchmarks.ecosystem.plain import Forecaster

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_bf16_lstm(monkeypatch):
    """The probe forced to "missing", whatever this CPU has."""
    monkeypatch.setattr(cpu, "bf16_lstm", lambda: False)


def _lstm_dtype(model: Forecaster, bf16: bool) -> torch.dtype:
    seen = []
    handle = model.lstm.register_forward_hook(lambda m, a, out: seen.append(out[0].dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        model(torch.randn(2, 5, 1)).float().sum().backward()
    handle.remove()
    return seen[0]


def test_the_lstm_runs_in_float32_inside_bf16_autocast_without_the_kernel(no_bf16_lstm):
    torch.manual_seed(0)
    model = Forecaster(2)
    assert _lstm_dtype(model, bf16=True) == torch.float32
    assert _lstm_dtype(model, bf16=False) == torch.float32
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_the_lstm_follows_the_probe_of_this_cpu():
    """Unforced, the LSTM runs in bf16 where the probe found the kernel, in float32 where not."""
    model = Forecaster(2)
    assert _lstm_dtype(model, bf16=True) == (torch.bfloat16 if cpu.bf16_lstm() else torch.float32)


def test_a_bf16_run_records_the_fallback_and_an_fp32_run_records_none(no_bf16_lstm):
    bf16 = eco.run("torch_lstm", "nan_input", seed=3, steps=12, monitor=True, threads=1)
    assert bf16.metrics["bf16"] == 1.0 and bf16.notes == (cpu.LSTM_FP32,)
    assert all(math.isfinite(v) for v in bf16.losses[:bf16.onset]) and bf16.dbg is not None
    fp32 = eco.run("torch_lstm", "healthy", seed=0, steps=4, threads=1)
    assert fp32.metrics["bf16"] == 0.0 and fp32.notes == ()
    # a model without an LSTM takes no fallback, bf16 or not
    assert cpu.fallback_notes(torch.nn.Linear(2, 2), bf16=True) == ()


def test_the_probe_leaves_the_random_state_alone():
    cpu.bf16_lstm.cache_clear()
    torch.manual_seed(7)
    cpu.bf16_lstm()
    after_probe = torch.rand(4)
    torch.manual_seed(7)
    assert torch.equal(torch.rand(4), after_probe)


def test_onednn_held_to_avx2_has_no_bf16_lstm_and_the_run_falls_back():
    """The real probe in a fresh process (oneDNN reads ``ONEDNN_MAX_CPU_ISA`` once, at start):
    no bf16 LSTM, and a bf16 run of the LSTM trains to its fault with the fallback noted."""
    script = textwrap.dedent("""
        import math
        from benchmarks import ecosystem as eco
        from benchmarks.ecosystem import cpu
        r = eco.run("torch_lstm", "nan_input", seed=3, steps=12, monitor=True, threads=1)
        print(cpu.bf16_lstm(), r.notes == (cpu.LSTM_FP32,), all(math.isfinite(v) for v in r.losses[:r.onset]))
    """)
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "True", "True"], done.stdout + done.stderr[-2000:]
