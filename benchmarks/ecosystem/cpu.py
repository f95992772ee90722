"""What this CPU can run, probed once, and the fallbacks a run takes where it cannot.

oneDNN has no bf16 LSTM primitive on CPUs without AVX-512 BF16 (AMD EPYC of earlier
generations, most desktop CPUs): an ``nn.LSTM`` under ``torch.autocast("cpu", bfloat16)`` raises
"could not create a primitive descriptor for the LSTM forward propagation primitive" there.
``ONEDNN_MAX_CPU_ISA=AVX2`` gives the same answer on a CPU that has it. A run that needs the
capability asks :func:`bf16_lstm` (one small probe per process) and, where it is missing, runs its
LSTM in float32 inside the autocast region; the benchmark records the fallback in its ``note``
column (:func:`fallback_notes`), so the run is neither failed nor silently different.
"""
from __future__ import annotations

import functools
import logging

import torch
from torch import nn

log = logging.getLogger("neuraldbg")

#: The note a run that took the LSTM fallback carries (``records.csv``'s ``note`` column).
LSTM_FP32 = "nn.LSTM ran in float32 under bf16 autocast: this CPU's oneDNN has no bf16 LSTM"


@functools.lru_cache(maxsize=None)
def bf16_lstm() -> bool:
    """Whether an ``nn.LSTM`` runs forward and backward under CPU bf16 autocast here.

    Probed once per process on a 2-layer LSTM of a few units; the probe leaves torch's global
    random state as it found it (a run seeded before it draws the same numbers either way).
    """
    try:
        with torch.random.fork_rng(devices=[]), torch.enable_grad():
            lstm = nn.LSTM(1, 4, num_layers=2, batch_first=True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out, _ = lstm(torch.zeros(2, 3, 1))
            out.float().sum().backward()
    except RuntimeError as exc:
        log.info("neuraldbg: no bf16 LSTM on this CPU (%s); LSTMs run in float32 under bf16 autocast",
                 str(exc).splitlines()[0])
        return False
    return True


def bf16_autocast_on() -> bool:
    """Whether the current code runs inside a CPU autocast region of dtype bfloat16."""
    try:  # torch >= 2.4 takes the device type; 2.2-2.3 have the CPU-specific functions
        on, dtype = torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")
    except TypeError:
        on, dtype = torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()
    return bool(on) and dtype == torch.bfloat16


def run_lstm(lstm: nn.LSTM, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """``lstm(x)``, in float32 with autocast off where bf16 autocast is on and the CPU has no bf16
    LSTM (:func:`bf16_lstm`); as written everywhere else."""
    if x.device.type == "cpu" and bf16_autocast_on() and not bf16_lstm():
        with torch.autocast("cpu", enabled=False):
            return lstm(x.float())
    return lstm(x)


def fallback_notes(model: nn.Module, bf16: bool) -> tuple[str, ...]:
    """The notes of the fallbacks a run of ``model`` takes on this CPU (empty: none), ``bf16``
    telling whether it trains under bf16 autocast."""
    if bf16 and any(isinstance(m, nn.LSTM) for m in model.modules()) and not bf16_lstm():
        return (LSTM_FP32,)
    return ()
