"""What one step records on the device, and the tables the host reads it back with.

Each hook call appends one record ``(slot, element count, 0-d tensors)`` to the step's
:class:`StepBuffer`; a *slot* says which module and statistic group it is, so the host
(:mod:`neuraldbg.monitor.transfer`) can compile one layout per distinct sequence of slots.
Tables only grow: a step recorded before the model changed still reads correctly after.
The helpers at the end say what a hook reads of a module's arguments and output.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from neuraldbg.monitor import stats as S

#: slot groups of a step's record: a module output, the model input, and an output with no
#: elements (no values: the marker of a missing observation)
OUT, INPUT, EMPTY = 0, 2, 3
#: the slot of the model input (there is one table per monitor)
INPUT_SLOT = 0


class Tables:
    """Append-only index of layer names, record slots and hooked parameters.

    The host reads a step's flat vector with it (:mod:`neuraldbg.monitor.transfer`): a slot
    is ``(group, layer index, activation kind, carries a sum of squares, ReLU unit count)``;
    a parameter has a layer and a size. Entries
    are never removed or renumbered (a replaced module gets new slots under its old layer
    index), so a step recorded before the model changed still reads correctly after.
    """

    def __init__(self) -> None:
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.slots: list[tuple[int, int, str | None, bool, int]] = [(INPUT, -1, None, False, 0)]
        self.param_layer: list[int] = []
        self.param_numel: list[int] = []
        self.version = 0  # bumped on every addition: cached readers rebuild

    def layer(self, name: str) -> int:
        """The index of layer ``name`` (added when new)."""
        i = self.index.get(name)
        if i is None:
            i = self.index[name] = len(self.names)
            self.names.append(name)
            self.version += 1
        return i

    def slot(self, group: int, layer: int, kind: str | None = None, sq: bool = False, units: int = 0) -> int:
        """A new record slot (``kind``: activation kind of an output, ``sq``: whether its
        record carries a sum of squares, ``units``: a ReLU-like output's unit count)."""
        self.slots.append((group, layer, kind, sq, units))
        self.version += 1
        return len(self.slots) - 1

    def param(self, layer: int, numel: int) -> int:
        """A new parameter index."""
        self.param_layer.append(layer)
        self.param_numel.append(numel)
        self.version += 1
        return len(self.param_layer) - 1


class StepBuffer:
    """What the hooks recorded in one step, still on the device."""

    __slots__ = ("step", "active", "tables", "records", "pgrad", "losses", "scale", "eval_skipped", "n_fwd",
                 "traced", "root_called", "entry", "ran_without_grad", "blocks")

    def __init__(self, step: int, active: bool, tables: Tables) -> None:
        self.step = step
        self.active = active
        self.tables = tables
        # (slot, element count, 0-d tensors): one append per hook call; or a Block of several
        self.records: list[Any] = []
        self.blocks = False             # whether a Block is among the records
        self.pgrad: list[tuple] = []    # (parameter indices, 1-d norms) per backward pass: last wins
        self.losses: list = []          # float or 0-d tensor
        self.scale: Any = None          # GradScaler scale during this step's backward (1-element tensor)
        self.eval_skipped = False       # forwards skipped because the model was in eval()
        self.n_fwd = 0                  # module outputs measured
        self.traced = False             # recorded by hooks traced under torch.compile
        self.root_called = False        # the root module's forward ran in this step
        self.entry: list[tuple] = []    # inputs of sub-networks called directly (see ModuleHooks)
        self.ran_without_grad: set[int] = set()  # layers whose training-mode forward ran under no_grad

    def restart(self, step: int) -> None:
        """This buffer as a new one of unchecked ``step``. Only for a buffer that holds nothing
        (:meth:`blank`): what is left to reset are the flags the root's input hook and a skipped
        forward set."""
        self.step = step
        self.root_called = self.eval_skipped = self.traced = False
        self.n_fwd = 0

    def empty(self) -> bool:
        return not (self.records or self.pgrad or self.losses or self.ran_without_grad)

    def blank(self) -> bool:
        """Whether nothing at all was recorded (an unchecked step's buffer before its loss)."""
        return not (self.records or self.pgrad or self.losses or self.ran_without_grad or self.entry) \
            and self.scale is None


class Block:
    """The statistics of several module outputs measured together (``neuraldbg.monitor.held``),
    one record for all of them: their slots and element counts, and their values as flat runs in
    the order the records would hold them (``scal``: the scalars, ``vec``: the per-unit maxima
    of ReLU-like outputs; either None; ``neuraldbg.monitor.stats.batched_output_blocks``)."""

    __slots__ = ("slots", "ns", "scal", "vec")

    def __init__(self, slots: tuple[int, ...], ns: tuple[int, ...], scal: Any, vec: Any) -> None:
        self.slots, self.ns, self.scal, self.vec = slots, ns, scal, vec


class Spec:
    """What a module's hooks need, looked up once at registration."""

    __slots__ = ("name", "kind", "bounds", "dim", "sq", "layer", "out", "empty", "by_units", "tables", "defer")

    def __init__(self, name: str, mod: nn.Module, layer: int, tables: Tables) -> None:
        self.name = name
        self.kind = S.activation_kind(mod)
        self.bounds = S.bounds_of(mod)
        self.dim = getattr(mod, "dim", None)
        # the output RMS is read by gradient events only, so only where gradients are
        self.sq = next(iter(mod.parameters(recurse=False)), None) is not None
        self.layer, self.tables = layer, tables
        self.out = tables.slot(OUT, layer, self.kind, self.sq)
        self.empty = tables.slot(EMPTY, layer)
        self.by_units: dict[int, int] = {}  # ReLU-like: a slot per unit count (divided on the host)
        #: whether its output statistics may wait for the end of the forward (neuraldbg.monitor.held):
        #: None until a checked forward showed whether a later op changes the output in place
        #: (False then, for good); bounded and softmax outputs are always measured at once
        self.defer: bool | None = None if self.kind in ("plain", "relu") else False

    def relu_slot(self, units: int) -> int:
        """The output slot of a ReLU-like module for outputs of ``units`` units."""
        slot = self.by_units.get(units)
        if slot is None:
            slot = self.by_units[units] = self.tables.slot(OUT, self.layer, self.kind, self.sq, units)
        return slot


# ---- what modules pass and return -----------------------------------------------------

def tensors_of(args, kwargs):
    """The tensors among a call's arguments (also inside lists and tuples, one level deep)."""
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (x for x in a if isinstance(x, torch.Tensor))


def first_tensor(output) -> torch.Tensor | None:
    """A module's main output: the tensor itself, or the first element of a tuple/list
    (LSTM, GRU and MultiheadAttention return (output, state))."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None


def describe(output) -> str:
    """A short description of a module output the monitor cannot measure."""
    if isinstance(output, torch.Tensor):
        return f"tensor dtype={output.dtype} layout={output.layout}"
    return type(output).__name__


#: the data-parallel wrappers :func:`wrappers` looks through
DATA_PARALLEL = (nn.DataParallel, nn.parallel.DistributedDataParallel)


def wrappers(model: nn.Module) -> list[nn.Module]:
    """``model`` and each module it wraps under ``torch.compile``, ``DataParallel`` and DDP
    wrappers, outermost first (the last is the user's module)."""
    chain = [model]
    while len(chain) < 9:
        if hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        elif isinstance(model, DATA_PARALLEL):
            model = model.module
        else:
            break
        chain.append(model)
    return chain


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module under ``torch.compile``, ``DataParallel`` and DDP wrappers."""
    return wrappers(model)[-1]


def dist_rank() -> tuple[int | None, int | None]:
    """``(rank, world_size)`` under an initialized ``torch.distributed``, else ``(None, None)``."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # noqa: BLE001 - a broken distributed setup must not stop the monitor
        pass
    return None, None


def monitored_modules(root: nn.Module) -> list[tuple[str, nn.Module]]:
    """Leaf modules plus any module owning parameters directly (e.g. MultiheadAttention)."""
    out = []
    for name, mod in root.named_modules():
        # the registries children() and parameters(recurse=False) read, read directly: the
        # generators cost microseconds per module, and this walk runs every few checks
        is_leaf = not any(m is not None for m in mod._modules.values())
        owns = any(p is not None for p in mod._parameters.values())
        if is_leaf or owns:
            out.append((name or type(mod).__name__.lower(), mod))
    return out
