import math

import torch
from torch import nn

from neuraldbg.events.stepstats import mean_std, rms
from neuraldbg.monitor import stats as S


def test_sums_and_host_helpers():
    y = torch.tensor([[1.0, -1.0], [3.0, 1.0]])
    s, ss = S.sums(y).tolist()
    assert (s, ss) == (4.0, 12.0)
    assert rms(ss, 4) == math.sqrt(3.0)
    m, sd = mean_std(s, ss, 4)
    assert m == 1.0 and math.isclose(sd, math.sqrt(2.0))


def test_dead_fraction_per_unit_over_batch():
    y = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 2.0, 0.0]])  # units 0 and 3 never fire
    assert S.dead_fraction(y).item() == 0.5
    conv = torch.zeros(2, 4, 3, 3)
    conv[:, 1] = 1.0
    assert S.dead_fraction(conv).item() == 0.75  # channels are the units
    seq = torch.zeros(2, 5, 4)
    seq[1, 3, 2] = 1.0
    assert S.dead_fraction(seq).item() == 0.75


def test_saturation_only_for_bounded():
    y = torch.tensor([0.999, 0.001, 0.5, 0.995])
    assert S.saturated_fraction(y, 0.0, 1.0, 0.01).item() == 0.75
    assert S.activation_kind(nn.Linear(2, 2)) == "plain"
    assert S.activation_kind(nn.Sigmoid()) == "bounded" and S.bounds_of(nn.Hardtanh(-2, 2)) == (-2.0, 2.0)
    p = torch.tensor([[0.995, 0.005], [0.5, 0.5]])
    assert S.softmax_saturated_fraction(p, -1, 0.01).item() == 0.5


def test_input_stats_counts_nan_and_inf_and_sums_finite():
    x = torch.tensor([1.0, float("nan"), float("inf"), 3.0])
    assert S.input_stats(x).tolist() == [4.0, 10.0, 1.0, 1.0]


def test_grad_stats_propagates_nonfinite_and_handles_half():
    assert S.grad_stats(torch.tensor([3.0, 4.0])).item() == 25.0
    assert math.isnan(S.grad_stats(torch.tensor([float("nan")])).item())
    big = torch.full((4,), 300.0, dtype=torch.float16)  # 300^2 overflows fp16, not fp32
    assert S.grad_stats(big).item() == 4 * 90000.0
