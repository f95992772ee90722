import math

import pytest
import torch
from torch import nn

from neuraldbg.events.stepstats import mean_std, rms
from neuraldbg.monitor import stats as S


def test_sums_and_host_helpers():
    y = torch.tensor([[1.0, -1.0], [3.0, 1.0]])
    s, ss = S.total(y).item(), S.sumsq(y).item()
    assert (s, ss) == (4.0, 12.0)
    assert S.norm(y).item() == pytest.approx(math.sqrt(12.0))
    assert S.sumsq(y.t()).item() == 12.0  # a non-contiguous view goes through the norm
    assert rms(ss, 4) == math.sqrt(3.0)
    m, sd = mean_std(s, ss, 4)
    assert m == 1.0 and math.isclose(sd, math.sqrt(2.0))


def test_half_sums_accumulate_in_float32():
    big = torch.full((4,), 300.0, dtype=torch.float16)  # 300^2 overflows fp16, not fp32
    assert S.sumsq(big).dtype == torch.float32 and S.sumsq(big).item() == 4 * 90000.0
    assert S.total(big).dtype == torch.float32


def dead(y):
    """The dead fraction the host derives from the per-unit maxima: 1 - active / units."""
    units = S.relu_units(y)
    assert units.numel() == S.unit_count(y)
    assert S.relu_stats(y)[1].item() == pytest.approx(float((units != 0).float().mean()))  # the compiled path
    return 1.0 - (units != 0).float().mean().item()


def test_dead_fraction_per_unit_over_batch():
    y = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 2.0, 0.0]])  # units 0 and 3 never fire
    assert dead(y) == 0.5
    conv = torch.zeros(2, 4, 3, 3)
    conv[:, 1] = 1.0
    assert dead(conv) == 0.75  # channels are the units
    seq = torch.zeros(2, 5, 4)
    seq[1, 3, 2] = 1.0
    assert dead(seq) == 0.75


def test_relu_sum_of_maxima_is_finite_exactly_when_the_output_is():
    y = torch.rand(8, 5)
    assert math.isfinite(S.relu_units(y).sum().item()) and math.isfinite(S.relu_stats(y)[0].item())
    y[3, 2] = float("nan")
    assert math.isnan(S.relu_units(y).sum().item()) and math.isnan(S.relu_stats(y)[0].item())
    y[3, 2] = float("inf")
    assert math.isinf(S.relu_units(y).sum().item()) and math.isinf(S.relu_stats(y)[0].item())


def test_output_stats_layout_by_kind():
    y = torch.rand(6, 4)
    assert len(S.output_stats(y, "plain", sq=True)) == 2 and len(S.output_stats(y, "plain", sq=False)) == 1
    assert [t.dim() for t in S.output_stats(y, "relu", sq=True)] == [1, 0]  # per-unit maxima, sum of squares
    assert len(S.output_stats(y, "relu", sq=False, traced=True)) == 2
    assert len(S.output_stats(y, "bounded", sq=True, bounds=(0.0, 1.0))) == 3
    with pytest.raises(ValueError, match="bounds"):
        S.output_stats(y, "bounded", sq=False)


def test_saturation_only_for_bounded():
    y = torch.tensor([0.999, 0.001, 0.5, 0.995])
    assert S.saturated_fraction(y, 0.0, 1.0, 0.01).item() == 0.75
    assert S.activation_kind(nn.Linear(2, 2)) == "plain"
    assert S.activation_kind(nn.Sigmoid()) == "bounded" and S.bounds_of(nn.Hardtanh(-2, 2)) == (-2.0, 2.0)
    p = torch.tensor([[0.995, 0.005], [0.5, 0.5]])
    assert S.softmax_saturated_fraction(p, -1, 0.01).item() == 0.5


def test_softmax_rows_with_one_open_key_are_not_saturated():
    # causal attention: the first query sees one key, its row is one-hot by construction
    causal = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    assert S.softmax_saturated_fraction(causal, -1, 0.1).item() == 0.0
    collapsed = torch.tensor([[1.0, 0.0, 0.0], [0.95, 0.05, 0.0], [0.02, 0.03, 0.95]])
    assert S.softmax_saturated_fraction(collapsed, -1, 0.1).item() == 1.0
    half = torch.tensor([[1.0, 0.0, 0.0], [0.95, 0.05, 0.0], [0.2, 0.3, 0.5]])
    assert S.softmax_saturated_fraction(half, -1, 0.1).item() == 0.5


@pytest.mark.parametrize("host_check", [True, False])  # False: the counting path (GPU, torch.compile)
def test_input_stats_counts_nan_and_inf(host_check):
    x = torch.tensor([1.0, float("nan"), float("inf"), 3.0, -float("inf")])
    s, nr, finite, not_nan = S.input_stats(x, host_check)
    assert (finite.item(), not_nan.item()) == (2.0, 4.0)  # 3 non-finite, 1 NaN: 2 infs
    clean = torch.tensor([1.0, 2.0, 3.0])
    s, nr, finite, not_nan = S.input_stats(clean, host_check)
    assert (s.item(), nr.item() ** 2, finite.item(), not_nan.item()) == (6.0, pytest.approx(14.0), 3.0, 3.0)


def test_input_stats_read_the_same_on_both_paths_when_a_finite_input_overflows_its_sum():
    # the host check reads only the norm: finite entries whose sum (or norm) overflows still
    # count as finite, as the counting path counts them
    for x in (torch.tensor([3e38, 3e38]), torch.tensor([1e19, 1e19, -1.0]), torch.tensor([1e30, -1e30, 2.0])):
        host = [t.item() for t in S.input_stats(x, True)]
        counted = [t.item() for t in S.input_stats(x, False)]
        assert host[2:] == counted[2:] == [float(x.numel())] * 2
        assert host[:2] == counted[:2] or all(a != a and b != b for a, b in zip(host[:2], counted[:2]))


def test_the_input_counts_kept_between_steps_follow_the_input_size_and_dtype():
    # the finite counts of a clean input are kept for the next input of the same size: one of
    # another size or dtype must get its own
    counts = [S.input_stats(x)[2] for x in (torch.ones(3, 4), torch.ones(3, 4), torch.ones(5),
                                             torch.ones(5, dtype=torch.float64), torch.ones(3, 4))]
    assert [(c.item(), c.dtype) for c in counts] == [(12.0, torch.float32), (12.0, torch.float32), (5.0, torch.float32),
                                                     (5.0, torch.float64), (12.0, torch.float32)]
    assert counts[0] is counts[1]  # kept, not made again


def test_grad_norms_propagate_nonfinite_and_handle_half_and_sparse():
    grads = [torch.tensor([3.0, 4.0]), torch.tensor([float("nan")]), torch.full((4,), 300.0, dtype=torch.float16)]
    n = S.grad_norms(grads)
    assert n.dtype == torch.float32 and n[0].item() == 5.0 and math.isnan(n[1].item()) and n[2].item() == 600.0
    sparse = torch.sparse_coo_tensor([[0, 2]], [3.0, 4.0], (5,), check_invariants=True)
    assert S.grad_norms([sparse, torch.tensor([1.0], dtype=torch.float64)]).tolist() == [5.0, 1.0]


def test_softmax_collapse_beyond_underflow_is_saturated_given_the_logits():
    """Regression: attention logits hundreds apart make the other probabilities exactly 0, and
    a row with one non-zero entry read as 'one open key', so complete collapse was never
    saturated. With the logits, only masked keys (-inf or finfo.min) are closed."""
    logits = torch.tensor([[0.0, -900.0, -800.0], [0.0, float("-inf"), float("-inf")],
                           [0.0, -700.0, torch.finfo(torch.float32).min]])
    y = torch.softmax(logits, -1)
    assert torch.count_nonzero(y, -1).tolist() == [1, 1, 1]  # every row underflowed or masked
    assert S.softmax_saturated_fraction(y, -1, 0.1).item() == 0.0  # without logits: not seen
    # rows 0 and 2 have two or more open keys and are one-hot; row 1 has a single open key
    assert S.softmax_saturated_fraction(y, -1, 0.1, logits).item() == 1.0
    spread = torch.tensor([[0.0, 0.1, float("-inf")]])
    assert S.softmax_saturated_fraction(torch.softmax(spread, -1), -1, 0.1, spread).item() == 0.0
    stats = S.output_stats(y, "softmax", sq=False, softmax_dim=-1, x=logits)
    assert stats[-1].item() == 1.0


def test_batched_gradient_norms_equal_the_per_parameter_ones():
    # hand-made gradients: two shapes that repeat (stacked per shape), one alone, one large
    grads = [torch.full((3, 4), 2.0), torch.full((4,), -1.0), torch.arange(12.0).reshape(3, 4),
             torch.ones(4) * 3.0, torch.ones(2, 2, 2), torch.ones(S.SMALL + 1) * 0.5]
    want = [math.sqrt(12 * 4.0), 2.0, math.sqrt(sum(i * i for i in range(12))), 6.0, math.sqrt(8.0),
            0.5 * math.sqrt(S.SMALL + 1)]
    plan = S.norm_plan(grads, group_min=2)
    groups, rest = plan
    assert sorted(map(sorted, groups)) == [[0, 2], [1, 3]] and sorted(rest) == [4, 5]
    norms = S.planned_norms(grads, plan)
    order = [i for pos in (*groups, rest) for i in pos]  # the norms come out group by group
    assert norms.tolist() == pytest.approx([want[i] for i in order], rel=1e-6)
    assert S.grad_norms(grads).tolist() == pytest.approx(want, rel=1e-6)


def test_a_few_gradients_of_one_shape_go_to_the_foreach_norm_unstacked():
    # regression: an MLP's two bias vectors of one width were stacked (a copy, a stack and a
    # concatenation), 45 us more per checked step than measuring them in the foreach norm
    few = [torch.full((512,), 2.0), torch.ones(256, 512), torch.full((512,), 3.0)]
    groups, rest = S.norm_plan(few)
    assert groups == () and sorted(rest) == [0, 1, 2]
    many = [torch.full((32,), float(i)) for i in range(S.GROUP_MIN)] + [torch.ones(5)]
    groups, rest = S.norm_plan(many)
    assert groups == (tuple(range(S.GROUP_MIN)),) and rest == (S.GROUP_MIN,)
    norms = S.planned_norms(many, (groups, rest))
    want = [i * math.sqrt(32) for i in range(S.GROUP_MIN)] + [math.sqrt(5)]
    assert norms.tolist() == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("shape", [(6, 5), (4, 3, 5), (2, 3, 4, 4)])
@pytest.mark.parametrize("kind,sq", [("plain", True), ("plain", False), ("relu", False), ("relu", True)])
def test_batched_output_blocks_hold_the_per_output_values_in_record_order(shape, kind, sq):
    g = torch.Generator().manual_seed(0)
    ys = [torch.randn(shape, generator=g) for _ in range(5)]
    if kind == "relu":
        ys = [y.clamp_min(0) for y in ys]
        ys[1][..., 0] = 0.0  # a unit that is never on
    ys[2] = ys[2] * float("nan") if kind == "plain" else ys[2]  # non-finite stays non-finite
    scal, vec = S.batched_output_blocks(ys, kind, sq=sq)
    want = [S.output_stats(y, kind, sq=sq) for y in ys]
    if kind == "relu":  # maxima one output after the other; the sums of squares in order
        torch.testing.assert_close(vec, torch.cat([w[0] for w in want]), rtol=1e-6, atol=1e-6)
        assert vec.view(len(ys), -1).shape[1] == want[0][0].numel()
        if sq:
            torch.testing.assert_close(scal, torch.stack([w[1] for w in want]), rtol=1e-6, atol=1e-6)
        else:
            assert scal is None
    else:  # (sum, [sum of squares]) of each output, one after the other
        assert vec is None and scal.numel() == sum(len(w) for w in want)
        torch.testing.assert_close(scal, torch.stack([v for w in want for v in w]), rtol=1e-6, atol=1e-6,
                                   equal_nan=True)


def test_batched_output_blocks_by_hand():
    scal, vec = S.batched_output_blocks([torch.tensor([[1.0, -2.0]]), torch.tensor([[3.0, 4.0]])], "plain")
    assert scal.tolist() == [-1.0, 5.0, 7.0, 25.0] and vec is None
    ys = [torch.tensor([[0.0, 2.0], [1.0, 0.0]]), torch.tensor([[0.0, 0.0], [0.0, 3.0]])]
    scal, vec = S.batched_output_blocks(ys, "relu")
    assert vec.tolist() == [1.0, 2.0, 0.0, 3.0] and scal.tolist() == [5.0, 9.0]
    assert S.batchable([torch.zeros(2, 2)] * 2, "relu") and not S.batchable([torch.zeros(2, 2)], "plain")
    assert not S.batchable([torch.zeros(3)] * 2, "relu")


def test_batched_output_blocks_of_half_outputs_accumulate_in_float32():
    ys = [torch.full((64, 64), 60.0, dtype=torch.float16) for _ in range(3)]  # squares sum past fp16's max
    scal, _ = S.batched_output_blocks(ys, "plain", sq=True)
    for s, q in scal.view(3, 2):
        assert s.dtype == q.dtype == torch.float32
        assert s.item() == 60.0 * 4096 and q.item() == pytest.approx(3600.0 * 4096, rel=1e-6)


def test_batched_output_blocks_name_the_kinds_they_cover():
    with pytest.raises(ValueError, match="'plain' and 'relu'"):
        S.batched_output_blocks([torch.zeros(2, 2)] * 2, "bounded")
