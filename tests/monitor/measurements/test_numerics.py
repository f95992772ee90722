"""The numerics measurements (``neuraldbg/monitor/measurements/numerics.py`` and the lost
updates of ``step_size.py``) on hand-made tensors."""
from __future__ import annotations

import math

import torch
from torch import nn

from neuraldbg.causal.nodes.numerics import NONFINITE_WEIGHTS_STEP
from neuraldbg.monitor.measurements.numerics import Numerics, dtype_name, first_nonfinite_row, majority_dtype
from neuraldbg.monitor.stats import grad_norms
from neuraldbg.monitor.measurements.step_size import lost_counts


def test_dtype_name():
    assert dtype_name(torch.bfloat16) == "bfloat16" and dtype_name(torch.float32) == "float32"


def test_the_majority_dtype_counts_trainable_elements():
    big = nn.Linear(100, 100).to(torch.bfloat16)        # 10,100 elements
    small = nn.Linear(10, 10)                            # 110 fp32 elements
    assert majority_dtype(list(big.parameters()) + list(small.parameters())) == "bfloat16"
    for p in big.parameters():
        p.requires_grad_(False)                          # frozen: not what the optimizer trains
    assert majority_dtype(list(big.parameters()) + list(small.parameters())) == "float32"
    assert majority_dtype([torch.zeros(3, dtype=torch.int64)]) is None
    assert majority_dtype([]) is None


def _flag(tensors: list[torch.Tensor]) -> bool:
    """Whether one check of ``tensors`` is found non-finite."""
    return first_nonfinite_row(grad_norms(tensors).view(1, -1), 0).item() == 0


def test_the_nonfinite_check_sees_nan_and_inf_in_any_tensor_and_never_overflows():
    fine = [torch.ones(4), torch.full((3,), 60000.0, dtype=torch.float16)]  # a 2-norm would overflow fp16
    assert not _flag(fine)
    assert _flag(fine + [torch.tensor([1.0, math.nan])])
    assert _flag([torch.tensor([math.inf], dtype=torch.bfloat16)])
    # float64 weights in their own precision (a float32 norm would refuse them, or overflow)
    wide = [torch.full((3,), 1e100, dtype=torch.float64), torch.ones(2)]  # beyond float32 norms
    assert not _flag(wide) and _flag(wide + [torch.tensor([math.nan], dtype=torch.float64)])


def test_the_first_nonfinite_row_is_numbered_from_the_start_given():
    rows = torch.tensor([[1.0, 2.0], [math.inf, 0.0], [math.nan, 1.0]])
    assert first_nonfinite_row(rows, 10).item() == 11
    assert first_nonfinite_row(rows[:1], 10, none=-7).item() == -7


def test_lost_counts_count_elements_meant_to_move_that_did_not():
    before = [torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([[1.0, 1.0]])]
    after = [torch.tensor([1.0, 2.5, 3.0, 4.0]), torch.tensor([[1.0, 0.5]])]
    grads = [torch.tensor([0.1, 0.1, 0.0, 0.2]), torch.tensor([[0.3, 0.3]])]
    # meant to move: 3 + 2 elements; unchanged among them: index 0 and 3, and [0, 0]
    lost, meant = lost_counts(before, after, grads).tolist()
    assert (lost, meant) == (3.0, 5.0)


def test_bf16_updates_below_resolution_are_lost_and_fp32_ones_are_not():
    w = torch.full((1000,), 0.03)
    g = torch.ones(1000)
    for dtype, lost_all in ((torch.bfloat16, True), (torch.float32, False)):
        b = w.to(dtype)
        a = b - torch.tensor(3e-5, dtype=dtype)            # an Adam step of about the rate
        lost, meant = lost_counts([b], [a], [g.to(dtype)]).tolist()
        assert meant == 1000 and (lost == 1000) is lost_all and (lost == 0) is not lost_all


class _Ctx:
    """The part of the monitor's context the update check reads."""

    step = 0

    def is_primary(self, optimizer) -> bool:
        return True


def test_the_update_check_reads_the_parameters_the_optimizer_holds_now():
    # the parameter list is kept between checks: a parameter swapped into a group (same count)
    # must be the one read, and one without a gradient (not updated) is not read
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    m, ctx = Numerics(), _Ctx()
    m.optimizer_post(ctx, opt, True)
    assert NONFINITE_WEIGHTS_STEP not in m.steps()
    idle = nn.Parameter(torch.full((2, 3), math.nan))  # no gradient: not updated, not read
    opt.param_groups[0]["params"][0] = idle
    ctx.step = 1
    m.optimizer_post(ctx, opt, True)
    assert NONFINITE_WEIGHTS_STEP not in m.steps()
    bad = nn.Parameter(torch.full((2, 3), math.inf))
    bad.grad = torch.zeros_like(bad)
    opt.param_groups[0]["params"][0] = bad
    ctx.step = 2
    m.optimizer_post(ctx, opt, True)
    assert m.steps()[NONFINITE_WEIGHTS_STEP] == 2


def test_checks_folded_in_several_batches_date_the_first_nonfinite_update(monkeypatch):
    # the norms wait on the device and are folded every few checks: the date must be the first
    # non-finite check's whichever fold it fell in, and a parameter count that changes between
    # checks (rows of another length) must not mix rows
    import neuraldbg.monitor.measurements.numerics as numerics

    monkeypatch.setattr(numerics, "DENSE_UPDATES", 10 ** 6)  # every update checked
    monkeypatch.setattr(numerics, "FOLD_NORMS", 7)           # folds of four checks of two norms
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    m, ctx = Numerics(), _Ctx()
    for step in range(10):
        ctx.step = step
        m.optimizer_post(ctx, opt, True)
    assert NONFINITE_WEIGHTS_STEP not in m.steps()  # a read folds the checks still waiting
    extra = nn.Parameter(torch.zeros(4))
    extra.grad = torch.zeros(4)
    opt.add_param_group({"params": [extra]})        # rows of three norms from step 10
    for step in range(10, 30):
        ctx.step = step
        with torch.no_grad():
            extra.fill_(math.nan if step == 17 else 0.0)  # non-finite once: the first stays the date
        m.optimizer_post(ctx, opt, True)
    assert m.steps()[NONFINITE_WEIGHTS_STEP] == 17


def _weights_step_of(dtype: torch.dtype) -> tuple[int, object]:
    """(internal errors, nonfinite_weights_step) of a small run whose bias is made NaN after the
    update of step 8."""
    from neuraldbg import NeuralDbg

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with NeuralDbg(model, every=1) as dbg:
        for step in range(12):
            x, y = torch.randn(16, 4, dtype=dtype), torch.randint(0, 2, (16,))
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step == 8:
                with torch.no_grad():
                    model[2].bias.fill_(math.nan)
            dbg.record_loss(loss)
    return dbg.internal_errors, dbg.trace().signatures.value(NONFINITE_WEIGHTS_STEP)


def test_a_float64_model_is_checked_without_a_monitor_error():
    """Regression: the update check asked for float32 norms of every weight, which torch refuses
    for float64 tensors (no narrowing): every checked update of a float64 model was an internal
    error and ``nonfinite_weights_step`` was never read. It now reads as the float32 model's."""
    errors, step = _weights_step_of(torch.float64)
    assert errors == 0 and step is not None
    assert (errors, step) == _weights_step_of(torch.float32)
