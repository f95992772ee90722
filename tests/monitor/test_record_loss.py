"""``record_loss`` accepts any real scalar, refuses the rest clearly, and only while monitoring."""
import fractions
import math

import numpy as np
import pytest
import torch
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.monitor.lossinput import loss_value


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


REAL = [1, 2.5, float("nan"), float("inf"), fractions.Fraction(3, 2), np.float16(1.5), np.float32(1.5),
        np.float64(1.5), np.longdouble(1.5), np.int8(2), np.int64(2), np.uint8(2), np.uint64(2), np.array(1.5),
        np.array([1.5]), np.array([[2]], dtype=np.int32), np.float32("nan")]
TENSORS = [torch.tensor(1.5), torch.tensor([1.5]), torch.tensor([[1.5]], dtype=torch.float64),
           torch.tensor(1.5, dtype=torch.float16), torch.tensor(1.5, dtype=torch.bfloat16),
           torch.tensor(2, dtype=torch.int64), torch.tensor(2, dtype=torch.uint8), torch.tensor(2, dtype=torch.int8)]


@pytest.mark.parametrize("x", REAL, ids=lambda x: f"{type(x).__name__}:{getattr(x, 'dtype', '')}")
def test_real_scalars_become_floats(x):
    v = loss_value(x)
    assert type(v) is float
    assert math.isnan(v) if math.isnan(float(np.asarray(x, dtype=np.float64).reshape(()))) else v == float(
        np.asarray(x, dtype=np.float64).reshape(()))


@pytest.mark.parametrize("t", TENSORS, ids=lambda t: str(t.dtype))
def test_one_element_tensors_of_any_real_dtype_stay_on_the_device(t):
    v = loss_value(t.requires_grad_() if t.is_floating_point() else t)
    assert isinstance(v, torch.Tensor) and v.shape == () and not v.requires_grad and v.dtype == t.dtype


@pytest.mark.parametrize("x,what", [
    (1 + 2j, "complex"), (np.complex64(1), "complex64"), (np.array(1j), "complex128"),
    (torch.tensor(1 + 1j), "complex64"), (True, "bool"), (np.bool_(True), "bool"),
    (torch.tensor(True), "torch.bool"), ("1.0", "str"), (None, "NoneType"), ([1.0], "list"),
    (np.array("x"), "<U1"), (np.array(1.0, dtype=object), "object"),
])
def test_complex_and_non_numeric_losses_are_type_errors(x, what):
    with pytest.raises(TypeError, match="record_loss expects a real scalar: a float or a 0-d tensor") as exc:
        loss_value(x)
    assert what in str(exc.value)


@pytest.mark.parametrize("x", [torch.ones(3), np.ones(2), torch.ones(0)])
def test_more_than_one_element_is_a_value_error(x):
    with pytest.raises(ValueError, match="record_loss expects a scalar loss, got"):
        loss_value(x)


@pytest.mark.parametrize("every", [1, 10])  # 10: all but the first are unchecked steps' (step, loss) pairs
def test_every_accepted_kind_reaches_the_loss_history(every):
    m = model()
    losses = [2, np.float32(1.5), np.int64(1), np.array(0.75), torch.tensor(0.5, dtype=torch.bfloat16),
              torch.tensor([0.25], dtype=torch.float64)]
    with NeuralDbg(m, every=every) as dbg:
        for loss in losses:
            m(torch.randn(3, 4))
            dbg.record_loss(loss)
    hist = [v for _, v in dbg.trace().loss.history]
    assert hist == [2.0, 1.5, 1.0, 0.75, 0.5, 0.25]


@pytest.mark.parametrize("every", [1, 3, 10])
def test_every_step_reaches_the_loss_history_in_order_whatever_every(every):
    """Unchecked steps between unchecked steps take a short close (queued losses, no buffer
    swap): float and tensor losses still arrive in step order."""
    m = model()
    want = []
    with NeuralDbg(m, every=every) as dbg:
        for step in range(25):
            m(torch.randn(3, 4)).sum().backward()
            value = 0.5 + step
            dbg.record_loss(torch.tensor(value) if step % 2 else value)
            want.append((step, value))
    assert list(dbg.trace().loss.history) == want


def test_after_exit_record_loss_raises_and_reentry_says_already_used():
    m = model()
    dbg = NeuralDbg(m)
    with dbg:
        dbg.record_loss(1.0)
        with pytest.raises(RuntimeError, match="already active"):
            dbg.__enter__()
    with pytest.raises(RuntimeError, match="record_loss called after the with block exited"):
        dbg.record_loss(1.0)
    with pytest.raises(RuntimeError, match="this NeuralDbg is already used; create a new one per run"):
        with dbg:
            pass
    assert dbg.trace().loss.n == 1  # the late call recorded nothing


def test_is_cross_entropy_reads_the_graph_only():
    from torch.nn import functional as F

    from neuraldbg.monitor.lossinput import is_cross_entropy
    x = torch.randn(4, 3, requires_grad=True)
    y = torch.tensor([0, 1, 2, 0])
    assert is_cross_entropy(F.cross_entropy(x, y)) is True
    assert is_cross_entropy(F.cross_entropy(x, y) / 2) is True  # divided by the accumulation count
    assert is_cross_entropy(F.cross_entropy(x, y, label_smoothing=0.1)) is True
    assert is_cross_entropy(F.mse_loss(x, torch.zeros(4, 3))) is False
    assert is_cross_entropy(F.cross_entropy(x, y).detach()) is None
    assert is_cross_entropy(1.0) is None


def test_a_deep_regression_is_not_read_against_ln_k():
    """Regression: a diffusion U-Net's noise MSE has a graph too large to read to its end, so the
    loss kind read "unknown" and the U-Net's 16 output channels set a chance level ln 16 for an MSE
    (a first loss of 0.96 read "0.35x chance", an lr x100 stall read "learning"). A regression
    loss node at the top of the graph settles it."""
    import torch.nn.functional as F

    from neuraldbg.monitor.lossinput import is_cross_entropy

    deep = nn.Sequential(*[m for _ in range(40) for m in (nn.Linear(4, 4), nn.Tanh())])
    x = torch.randn(3, 4)
    assert is_cross_entropy(F.mse_loss(deep(x), torch.zeros(3, 4))) is False
    assert is_cross_entropy(F.smooth_l1_loss(deep(x), torch.zeros(3, 4))) is False
    assert is_cross_entropy(F.binary_cross_entropy_with_logits(deep(x), torch.ones(3, 4))) is False
    # a likelihood term beside it still makes a cross-entropy
    both = F.cross_entropy(deep(x), torch.tensor([0, 1, 2])) + F.mse_loss(deep(x), torch.zeros(3, 4))
    assert is_cross_entropy(both) is True
    # a deep classifier whose likelihood sits at the top is told at once
    assert is_cross_entropy(F.cross_entropy(deep(x), torch.tensor([0, 1, 2]))) is True
