"""What ``record_loss`` accepts: any real scalar, checked without a device sync.

Python numbers (``numbers.Real``: int, float, Fraction, ...), numpy real scalars of any dtype,
numpy arrays and torch tensors holding exactly one element of a real dtype. Complex and
boolean values, and anything that is not a number, raise ``TypeError``; more than one
element raises ``ValueError``. A tensor is kept on its device (detached) and read with the
step's other statistics; nothing here waits for the device.
"""
from __future__ import annotations

import numbers
import sys
from typing import Any

import torch

_VALID = ("a real scalar: a float or a 0-d tensor (any Python real number, numpy real scalar or "
          "one-element array, or one-element tensor of a real dtype)")


def loss_value(loss: Any) -> float | torch.Tensor:
    """``loss`` as a float or a detached 0-d tensor; ``TypeError``/``ValueError`` otherwise."""
    if type(loss) is torch.Tensor and loss.dtype.is_floating_point and loss.dim() == 0:
        return loss.detach()  # the common case, once per step: nothing else to check
    if isinstance(loss, torch.Tensor):
        if loss.is_complex() or loss.dtype == torch.bool:
            raise TypeError(f"record_loss expects {_VALID}; got a tensor of dtype {loss.dtype}")
        if loss.numel() != 1:
            raise ValueError(f"record_loss expects a scalar loss, got a tensor of shape {tuple(loss.shape)}")
        return loss.detach().reshape(())
    if isinstance(loss, bool):
        raise TypeError(f"record_loss expects {_VALID}; got the bool {loss!r}")
    if isinstance(loss, numbers.Real) and not _is_numpy(loss):
        return float(loss)
    np = sys.modules.get("numpy")  # a numpy value implies numpy is loaded: never import it here
    if np is not None and isinstance(loss, (np.ndarray, np.generic)):
        kind = np.asarray(loss).dtype.kind
        if kind not in "iuf":  # signed, unsigned, floating: not bool, complex, object or text
            raise TypeError(f"record_loss expects {_VALID}; got a numpy value of dtype {np.asarray(loss).dtype}")
        if np.size(loss) != 1:
            raise ValueError(f"record_loss expects a scalar loss, got an array of shape {np.shape(loss)}")
        return float(np.asarray(loss).reshape(()))
    raise TypeError(f"record_loss expects {_VALID}; got {type(loss).__name__}")


def _is_numpy(x: Any) -> bool:
    # np.float64 subclasses float and np.bool_ registers as nothing; route every numpy value
    # through the dtype check so np.float64(nan) and np.float32 behave the same
    return type(x).__module__ == "numpy"


#: autograd nodes of a negative log-likelihood: what ``F.cross_entropy`` and ``F.nll_loss`` end in
_NLL_NODES = ("NllLossBackward", "NllLoss2DBackward", "NllLossNdBackward")
#: autograd nodes of losses that are not a K-way cross-entropy (a regression, a binary or
#: margin loss): met in the walk with no likelihood node, they settle the question at once, so a
#: regression head on a deep network (a diffusion U-Net's noise MSE) is not read against ln K
#: merely because its graph is too large to read to its end
_OTHER_LOSS_NODES = ("MseLossBackward", "SmoothL1LossBackward", "HuberLossBackward", "SoftMarginLossBackward",
                     "BinaryCrossEntropyBackward", "BinaryCrossEntropyWithLogitsBackward",
                     "MultiLabelSoftMarginLossBackward", "MultiMarginLossBackward")
#: how far up a loss's graph the likelihood node is looked for (a mean over micro-batches, a
#: division by the accumulation count, a sum of two terms sit between it and the loss)
_GRAPH_DEPTH = 6
#: graph nodes visited at most: a bounded walk, once per run
_GRAPH_NODES = 64


def is_cross_entropy(loss: Any) -> bool | None:
    """Whether ``loss`` is a cross-entropy (its autograd graph reaches a negative
    log-likelihood node within a few nodes): ``False`` when the whole graph was read without
    one, or when a regression, binary or margin loss node comes first (an MSE, a TD loss);
    ``None`` when it cannot be told (a number, a detached tensor, a graph
    too large to read to its end). Reads the graph's nodes only, never a value: no device sync. Only a
    cross-entropy is read against chance level ``ln K`` (``neuraldbg/causal/nodes/run.py``)."""
    fn = getattr(loss, "grad_fn", None) if isinstance(loss, torch.Tensor) else None
    if fn is None:
        return None
    frontier, seen, other = [fn], 0, False
    for _ in range(_GRAPH_DEPTH):
        nxt = []
        for node in frontier:
            name = type(node).__name__
            if name.startswith(_NLL_NODES):
                return True
            other = other or name.startswith(_OTHER_LOSS_NODES)
            seen += 1
            if seen > _GRAPH_NODES:
                # a large graph not walked to its end: a cross-entropy may lie beyond, unless a
                # loss of another kind was met on the way (the loss is that one, or a sum in which
                # the likelihood term would have sat as near the top)
                return False if other else None
            nxt.extend(f for f, _ in getattr(node, "next_functions", ()) if f is not None)
        if other:
            # the loss node of a regression sits at the top of the graph: the rest of this level is
            # read (a sum of a cross-entropy and a regression term has both up here), the network
            # below it is not
            return False
        frontier = nxt
        if not frontier:
            return False  # the whole graph read, no negative log-likelihood in it
    return None
