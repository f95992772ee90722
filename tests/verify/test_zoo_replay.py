"""The zoo's replay (``RunResult.replay``): the very batches of the run, for every architecture."""
from __future__ import annotations

import pytest
import torch

import models
from neuraldbg.verify.snapshots import capture, of, restore


def _replays_exactly(arch: str, steps: int | None) -> None:
    r = models.run(arch, "healthy", seed=0, steps=steps, monitor={"snapshots": True})
    dbg, snaps = r.dbg, of(r.dbg)
    assert callable(r.replay) and len(snaps.all()) >= 2
    end = capture(dbg.root, dbg.optimizer, dbg.scaler, -1, snaps.tracked, full=True)
    before = {n: p.detach().clone() for n, p in dbg.root.named_parameters()}
    snap = snaps.all()[-1]
    restore(snap, dbg.root, dbg.optimizer, dbg.scaler, snaps.tracked)
    for t in range(snap.step, min(snap.step + 4, r.steps)):
        # the same batch, RNG draws and state as the run: the loss is identical, bit for bit
        assert float(r.replay(dbg.model, dbg.optimizer, t).detach()) == r.losses[t], (arch, t)
    restore(end, dbg.root, dbg.optimizer, dbg.scaler, snaps.tracked)
    assert all(torch.equal(before[n], p) for n, p in dbg.root.named_parameters())


@pytest.mark.parametrize("arch", ["mlp", "rl"])
def test_replay_reproduces_the_run(arch):
    _replays_exactly(arch, 40)


@pytest.mark.slow
@pytest.mark.parametrize("arch", models.architectures())
def test_replay_reproduces_every_architecture(arch):
    _replays_exactly(arch, None)


def test_zoo_verify_end_to_end():
    r = models.run("mlp", "lr_too_high", seed=0, steps=60, monitor={"snapshots": True})
    v = r.dbg.verify(r.replay)
    top = v.hypotheses[0]
    assert (top.cause, top.state) == ("learning_rate", "too_high") and top.verified is True
    assert r.dbg.snapshot_bytes > 0
    bare = models.run("mlp", "healthy", seed=0, steps=10)
    assert callable(bare.replay) and bare.dbg is None


@pytest.mark.slow
@pytest.mark.parametrize("arch,injection", [("pyg_gcn", "healthy"), ("hf_bert", "inf_input")])
def test_ecosystem_replay_reproduces_the_run(arch, injection):
    """The ecosystem's replay trains on the run's cached batches (a token fault is applied to
    the embedding again, from its generator state), with the same schedule and clipping."""
    from benchmarks import ecosystem as eco

    pytest.importorskip(eco.get_arch(arch).library)
    r = eco.run(arch, injection, seed=3, monitor={"snapshots": True})
    dbg, snaps = r.dbg, of(r.dbg)
    end = capture(dbg.root, dbg.optimizer, dbg.scaler, -1, snaps.tracked, full=True)
    snap = snaps.before(r.onset if r.onset is not None else r.steps // 2)
    restore(snap, dbg.root, dbg.optimizer, dbg.scaler, snaps.tracked)
    for t in range(snap.step, snap.step + 3):
        got, want = float(r.replay(dbg.model, dbg.optimizer, t).detach()), r.losses[t]
        assert got == want or (got != got and want != want), (t, got, want)
    restore(end, dbg.root, dbg.optimizer, dbg.scaler, snaps.tracked)
    v = dbg.verify(r.replay)
    assert v.extra_steps > 0


def test_zoo_lora_forgetting_is_confirmed_by_its_reference():
    """The zoo's LoRA fine-tune at 50x its rate learns task B like the healthy run: over 60
    steps the observation is a coin toss (task A partly lost, the step size 'elevated'). The
    rate /10 keeps task A far better than it slows task B, and verification settles it."""
    r = models.run("lora", "lora_forgetting", seed=0, steps=60, monitor={"snapshots": True})
    v = r.dbg.verify(r.replay)
    t = next(t for t in v.tests if t.label == "learning_rate/too_high")
    assert 0.2 < v.posterior_before.p_healthy < 0.8
    assert t.outcome == "vanished" and t.improvement < 0 and t.reference_gain > 0.3
    assert "reference loss +" in t.sentence()
    top = v.hypotheses[0]
    assert (top.cause, top.state, top.verified) == ("learning_rate", "too_high", True) and top.probability > 0.9
    healthy = models.run("lora", "healthy", seed=0, steps=60, monitor={"snapshots": True})
    hv = healthy.dbg.verify(healthy.replay)
    assert hv.posterior.p_healthy > 0.99 and all(t.reference_gain is None for t in hv.tests)


def test_zoo_lora_reference_can_be_turned_off():
    r = models.run("lora", "healthy", seed=0, steps=30, monitor={"reference": None})
    assert r.dbg.reference is None and "reference_first" not in r.dbg.trace().signatures.as_dict()
