"""The ecosystem's precision faults (root ``numerics``) and their healthy twins: where they apply,
and that each mechanism happens where the fault says, watched through the runner itself (no
monitor): the inputs, forward, loss and gradients finite while the update turns the weights
non-finite; the bf16 weights' updates rounding away while the autocast twin's land."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

eco = pytest.importorskip("benchmarks.ecosystem")
from benchmarks.ecosystem import precision  # noqa: E402
from models.symptoms import head, tail  # noqa: E402

PLAIN = ("torch_tabular", "torch_encoder")


class Probe:
    """What one run shows around its optimizer steps, recorded by hooks a fault's setup installs:
    per step, whether the inputs, the forward's output, the gradients and the weights before the
    update were finite, whether the weights after it were, and the share of the weight matrices'
    elements with a non-zero gradient that the update left exactly as they were."""

    def __init__(self) -> None:
        self.inputs_finite: list[bool] = []
        self.outputs_finite: list[bool] = []
        self.input_dtypes: set[torch.dtype] = set()
        self.grads_finite: list[bool] = []
        self.weights_finite_before: list[bool] = []
        self.weights_finite_after: list[bool] = []
        self.unchanged_share: list[float] = []
        self.zero_grad_coords = 0  # in the first step's gradient
        self.nan_at_zero_grads = True  # every NaN born in the first update sits where the gradient was 0
        self.weight_dtypes: set[torch.dtype] = set()
        self.task = None

    def install(self, task, layer, opt) -> None:
        """Wrap ``task``'s batches and hook its model and ``opt`` (a fault's ``setup`` signature)."""
        self.task, draw = task, task.batch
        model = task.model
        self.weight_dtypes = {p.dtype for p in model.parameters()}
        mats = [p for p in model.parameters() if p.dim() >= 2]
        params = [p for p in model.parameters() if p.requires_grad]
        held: dict = {}

        def batch(n):
            bt = draw(n)
            floats = [v for v in bt.values() if torch.is_tensor(v) and v.is_floating_point()]
            self.inputs_finite.append(all(bool(torch.isfinite(v).all()) for v in floats))
            self.input_dtypes |= {v.dtype for v in floats}
            return bt

        def forward_hook(module, args, out):
            self.outputs_finite.append(bool(torch.isfinite(out).all()))

        def pre(o, a, k):
            self.grads_finite.append(all(bool(torch.isfinite(p.grad).all()) for p in params if p.grad is not None))
            self.weights_finite_before.append(all(bool(torch.isfinite(p).all()) for p in params))
            held["before"] = [p.detach().clone() for p in mats]
            held["moving"] = [p.grad is not None and p.grad != 0 for p in mats]
            if len(self.grads_finite) == 1:
                held["zero"] = [p.grad == 0 for p in params]
                self.zero_grad_coords = sum(int(z.sum()) for z in held["zero"])

        def post(o, a, k):
            self.weights_finite_after.append(all(bool(torch.isfinite(p).all()) for p in params))
            same = sum(int(((p.detach() == b) & m).sum()) for p, b, m in zip(mats, held["before"], held["moving"]))
            self.unchanged_share.append(same / max(1, sum(int(m.sum()) for m in held["moving"])))
            if len(self.weights_finite_after) == 1:
                self.nan_at_zero_grads = all(bool(z[torch.isnan(p.detach())].all())
                                             for p, z in zip(params, held["zero"]))

        task.batch = batch
        model.register_forward_hook(forward_hook)
        opt.register_step_pre_hook(pre)
        opt.register_step_post_hook(post)


def _probed(monkeypatch, arch: str, name: str, seed: int, steps: int):
    """Run ``name`` on ``arch`` through the runner with a :class:`Probe` added to its setup."""
    probe, fault = Probe(), eco.FAULTS[name]

    def setup(task, layer, opt):
        if fault.setup is not None:
            fault.setup(task, layer, opt)
        probe.install(task, layer, opt)

    monkeypatch.setitem(eco.FAULTS, name, dataclasses.replace(fault, setup=setup))
    return eco.run(arch, name, seed=seed, steps=steps, threads=1), probe


def test_the_precision_faults_apply_where_their_mechanism_happens():
    numerics = {"fp16_weights_adam", "adam_eps_zero", "bf16_weights_small_lr"}
    twins = {"bf16_autocast", "fp16_autocast_scaler"}
    want = {"torch_tabular": {"fp16_weights_adam", "adam_eps_zero", "fp16_autocast_scaler"},
            "torch_encoder": numerics | twins}
    for arch in eco.architectures():
        got = {i.name for i in eco.injections(arch)} & (numerics | twins)
        assert got == want.get(arch, set()), arch
    inj = {i.name: i for i in eco.injections("torch_encoder")}
    for name in ("fp16_weights_adam", "adam_eps_zero"):
        assert (inj[name].truth, inj[name].onset, inj[name].symptom) == (("numerics", "overflow"), 0, "nonfinite")
    lost = inj["bf16_weights_small_lr"]
    assert (lost.truth, lost.onset, lost.symptom) == (("numerics", "updates_lost"), 0, "stuck")
    for name in twins:
        assert inj[name].truth is None and inj[name].onset is None
    # the precision is the fault's on every seed, the recipe's (bf16 on odd seeds) for every other fault
    assert [precision.autocast_dtype("recipe", s) for s in (0, 3)] == [None, torch.bfloat16]
    assert [precision.autocast_dtype(eco.FAULTS[n].autocast, 3) for n in sorted(numerics | twins)] == \
        [None, torch.bfloat16, None, torch.float16, None]
    with pytest.raises(ValueError, match="valid: recipe, off"):
        precision.autocast_dtype("fp8", 0)


@pytest.mark.parametrize("seed", [0, 3])  # fp32 without and with accumulation
@pytest.mark.parametrize("arch", PLAIN)
def test_fp16_weights_under_adam_turn_non_finite_in_the_first_update(monkeypatch, arch, seed):
    r, p = _probed(monkeypatch, arch, "fp16_weights_adam", seed, steps=2)
    assert p.weight_dtypes == {torch.float16} and r.metrics["bf16"] == 0.0
    if eco.get_arch(arch).inputs == "float":
        assert p.input_dtypes == {torch.float16}  # cast to the weights' dtype, as the first layer needs
    accum = int(r.metrics["accumulation"])
    assert all(p.inputs_finite[:accum]) and all(p.outputs_finite[:accum]) and math.isfinite(r.losses[0])
    assert p.grads_finite[0] and p.weights_finite_before[0]
    assert not p.weights_finite_after[0]            # born in the update, from finite everything
    assert not math.isfinite(r.losses[1])            # and the next forward reads it


@pytest.mark.parametrize("seed", [0, 1, 3])  # odd seeds too: the fault runs in fp32 on every seed
@pytest.mark.parametrize("arch", PLAIN)
def test_adam_eps_zero_makes_nan_where_the_first_gradient_is_zero(monkeypatch, arch, seed):
    r, p = _probed(monkeypatch, arch, "adam_eps_zero", seed, steps=2)
    assert p.weight_dtypes == {torch.float32} and r.metrics["bf16"] == 0.0
    assert all(p.inputs_finite) and p.outputs_finite[0] and math.isfinite(r.losses[0])
    assert p.grads_finite[0] and p.weights_finite_before[0] and p.zero_grad_coords > 0
    assert not p.weights_finite_after[0] and p.nan_at_zero_grads  # 0/0, exactly there
    assert not math.isfinite(r.losses[1])


def test_bf16_weights_lose_most_updates_and_stall_where_the_autocast_twin_learns(monkeypatch):
    """Full runs (the rate follows the run's schedule, and the stall is a run's): on every step,
    most bf16 matrix elements with a non-zero gradient stay as they were (67-98 %), where all but a
    few of the twin's fp32 ones move; the twin's loss falls clearly, the bf16 weights' by under a
    fifth of the healthy run's."""
    r, p = _probed(monkeypatch, "torch_encoder", "bf16_weights_small_lr", 0, steps=None)
    assert p.weight_dtypes == {torch.bfloat16} and all(p.weights_finite_after)
    assert min(p.unchanged_share) > 0.5, p.unchanged_share   # non-zero gradients, no move
    twin, q = _probed(monkeypatch, "torch_encoder", "bf16_autocast", 0, steps=None)
    assert q.weight_dtypes == {torch.float32} and twin.metrics["bf16"] == 1.0
    # fp32 master weights: every update lands, but in the cosine's last steps, whose rates near zero
    # even fp32 rounds away
    assert max(q.unchanged_share[:int(0.9 * twin.steps)]) < 0.01, q.unchanged_share
    assert r.losses[0] == pytest.approx(twin.losses[0], abs=0.01)  # the same model and batch, rounded
    healthy = eco.run("torch_encoder", "healthy", seed=0, threads=1)
    gain = {n: head(x.losses) - tail(x.losses) for n, x in (("fault", r), ("twin", twin), ("healthy", healthy))}
    assert gain["twin"] > 0.3 * head(twin.losses)
    assert gain["fault"] < 0.2 * gain["healthy"] and gain["fault"] < 0.5 * gain["twin"]


def test_the_fp16_autocast_twin_trains_with_its_scaler_handed_to_the_monitor(monkeypatch):
    r, p = _probed(monkeypatch, "torch_tabular", "fp16_autocast_scaler", 3, steps=4)
    assert p.weight_dtypes == {torch.float32} and p.input_dtypes == {torch.float32}
    assert all(p.weights_finite_after) and max(p.unchanged_share) < 0.01
    healthy = eco.run("torch_tabular", "healthy", seed=0, steps=4, threads=1)
    fp16 = eco.run("torch_tabular", "fp16_autocast_scaler", seed=0, steps=4, monitor=True, threads=1)
    assert isinstance(fp16.dbg.scaler, torch.amp.GradScaler) and fp16.metrics["bf16"] == 0.0
    assert fp16.losses != healthy.losses                               # the forward ran in fp16
    assert fp16.losses == pytest.approx(healthy.losses, abs=1e-3)      # and learns as fp32 does
