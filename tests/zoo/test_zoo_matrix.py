"""Every architecture learns, is deterministic, and every injection breaks its run.

The symptom checks (models.symptoms) compare with the healthy run of the same seed using
relative criteria only; none of them reads NeuralDBG.
"""
from __future__ import annotations

import math

import pytest

import models
from models.symptoms import check, learns
from zoo_testing import SEEDS, cached_run, fresh_run, injection_params


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("arch", models.architectures())
def test_healthy_run_learns(arch, seed):
    r = cached_run(arch, "healthy", seed)
    assert r.truth is None and r.onset is None and r.dbg is None
    assert len(r.losses) == r.steps and r.wall_time > 0
    ok, why = learns(r)
    assert ok, f"{arch} seed {seed} does not learn: {why}"


@pytest.mark.parametrize("arch", models.architectures())
def test_runs_are_bitwise_deterministic(arch):
    steps = 20  # bitwise equality does not need the whole run
    a = fresh_run(arch, "healthy", 0, steps)
    b = fresh_run(arch, "healthy", 0, steps)
    assert a.losses == b.losses
    assert a.signals == b.signals
    # ... equal to the start of the full run (steps only truncates), and the seed matters
    assert cached_run(arch, "healthy", 0).losses[:steps] == a.losses
    assert cached_run(arch, "healthy", 1).losses[:steps] != a.losses


@pytest.mark.parametrize("arch,injection,seed", injection_params(seeds=(0, 1)))
def test_injection_breaks_its_run(arch, injection, seed):
    r = cached_run(arch, injection, seed)
    healthy = cached_run(arch, "healthy", seed)
    assert r.truth is not None and r.injection == injection
    ok, why = check(r, healthy)
    assert ok, f"{arch}/{injection} seed {seed} does not show {r.symptom!r}: {why}"
    if r.onset:  # a mid-run fault: the run is the healthy run until the onset
        assert r.losses[: r.onset] == healthy.losses[: r.onset]
        assert all(math.isfinite(v) for v in r.losses[: r.onset])
