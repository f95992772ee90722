"""Shared helpers for the zoo tests: one cached run per (arch, injection, seed, steps).

Imported as ``from zoo_testing import ...`` (pytest's default import mode puts this folder
on ``sys.path``).

Runs are deterministic, so caching them across test files is safe and keeps the suite
fast: the healthy run of a seed is trained once and reused as every injection's baseline.
"""
from __future__ import annotations

import functools

import pytest

import models

#: The fast suite compiles with aot_eager: the same dynamo tracing (where hooks matter)
#: without inductor's C++ codegen, which costs 30 s cold on a 2-core CI box.
FAST_CONFIG = {"compiled": {"backend": "aot_eager"}}

#: Archs whose full injection sweep is slow-marked; these injections stay in the fast set.
EXPENSIVE = {
    "transformer": {"nan_softmax", "attention_collapse", "no_warmup", "data_shift"},
    "dcgan": {"gan_vanishing", "data_nan"},
    "lora": {"lora_forgetting", "init_too_large", "nan_softmax"},
    "diffusion": {"unet_nan", "data_shift"},
}

SEEDS = (0, 1)


@functools.lru_cache(maxsize=None)
def cached_run(arch: str, injection: str = "healthy", seed: int = 0, steps: int | None = None):
    """``models.run`` without monitor, memoised (fast config for ``compiled``)."""
    return models.run(arch, injection, seed, steps=steps, config=FAST_CONFIG.get(arch))


def fresh_run(arch: str, injection: str = "healthy", seed: int = 0, steps: int | None = None, **kw):
    """An uncached run with the fast config."""
    return models.run(arch, injection, seed, steps=steps, config=FAST_CONFIG.get(arch), **kw)


def injection_params(seeds=(0,)):
    """pytest params (arch, injection, seed) for every non-healthy injection; slow-marked
    where the architecture is expensive and the injection is not in its fast set."""
    out = []
    for arch in models.architectures():
        for inj in models.injection_names(arch):
            if inj == "healthy":
                continue
            for seed in seeds:
                slow = seed != 0 or (arch in EXPENSIVE and inj not in EXPENSIVE[arch])
                marks = [pytest.mark.slow] if slow else []
                out.append(pytest.param(arch, inj, seed, marks=marks, id=f"{arch}-{inj}-s{seed}"))
    return out
