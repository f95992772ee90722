"""The ecosystem's fine-tunes of a model trained to its floor: where they apply, what they start
from, and that the monitor meets trained weights."""
from __future__ import annotations

import math

import pytest

eco = pytest.importorskip("benchmarks.ecosystem")

STEPS = 20


def test_the_fine_tunes_apply_to_the_plain_torch_archs_only():
    for arch in eco.architectures():
        names = {i.name for i in eco.injections(arch)}
        want = arch in ("torch_tabular", "torch_encoder")
        assert ("finetune_at_floor" in names) is want and ("finetune_lr_x100" in names) is want, arch
    assert eco.FAULTS["finetune_at_floor"].truth is None
    assert eco.FAULTS["finetune_lr_x100"].truth == ("learning_rate", "too_high")


def test_a_fine_tune_starts_from_the_floor_the_setup_trained_to():
    healthy = eco.run("torch_tabular", "healthy", seed=0, steps=STEPS, threads=1)
    r = eco.run("torch_tabular", "finetune_at_floor", seed=0, steps=STEPS, monitor=True, threads=1)
    chance = math.log(3)
    assert healthy.losses[0] > 0.9 * chance          # a fresh classifier starts near ln 3
    assert r.losses[0] < 0.5 * chance                # the pre-trained one far below it
    assert r.truth is None
    assert r.dbg.signatures().as_dict().get("started_trained")  # the monitor knows
    assert all(h.cause != "initialization" for h in r.dbg.get_causal_hypotheses())
    high = eco.run("torch_tabular", "finetune_lr_x100", seed=0, steps=STEPS, threads=1)
    assert high.losses[0] == r.losses[0]             # the same pre-trained model, before its first update
