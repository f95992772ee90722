"""The optimizers that step a monitored model: given (``optimizer=``) or found.

torch calls global optimizer step hooks (``torch.optim.optimizer.register_optimizer_step_pre_hook``
/ ``..._post_hook``) for every optimizer's step in the process. :class:`OptimizerWatch` keeps one
pair of them while the monitor is active and passes on the steps of the optimizers that hold
any of the model's parameters (checked once per optimizer and param-group count: a host-side set
lookup, no tensor work). So the step size, the loop checks and the snapshots need no
``optimizer=``; when one is given it is the *primary* optimizer the step size is read from (a
GAN's generator optimizer, say), and the others are still seen. An optimizer that is not a
``torch.optim.Optimizer`` but offers ``register_step_pre_hook`` gets per-instance hooks.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

import torch
from torch import nn


class OptimizerWatch:
    """The optimizers stepping one model, and the hooks that report their steps.

    ``pre(optimizer)`` / ``post(optimizer)`` are called around each step of a watched optimizer.
    """

    #: set by the monitor on an unchecked step whose optimizer steps nothing needs (no part listens
    #: there, and it is not the step after a checked one): the global hooks then return at once
    quiet = False

    def __init__(self, root: nn.Module, explicit: Any, pre: Callable[[Any], None],
                 post: Callable[[Any], None]) -> None:
        self.root = root
        self.explicit = explicit
        self.found: list[Any] = [explicit] if explicit is not None else []
        self._pre, self._post = pre, post
        self._params: set[int] = set()
        self._decided: dict[int, tuple[int, bool]] = {}  # id(opt) -> (param-group count, watched)
        self._primary: set[int] = set()
        self.handles: list[Any] = []
        self._report: Callable[..., None] = lambda *a, **k: None

    @property
    def primary(self) -> Any:
        """The optimizer given, else the first one found stepping the model (``None`` before)."""
        return self.found[0] if self.found else None

    def start(self, report: Callable[..., None]) -> None:
        """Register the hooks (the model's parameters are read now); ``report(key, msg, level)``
        says what went wrong in a hook, once (a hook never raises into training)."""
        self._report = report
        self._params = {id(p) for p in self.root.parameters()}
        opt = self.explicit
        if opt is not None:
            self._primary = {id(p) for g in getattr(opt, "param_groups", ()) for p in g["params"]}
            if not isinstance(opt, torch.optim.Optimizer):
                if hasattr(opt, "register_step_pre_hook") and hasattr(opt, "param_groups"):
                    self.handles += [opt.register_step_pre_hook(lambda o, a, k: self._pre(o)),
                                     opt.register_step_post_hook(lambda o, a, k: self._post(o))]
                else:
                    report(("step_probe",), f"optimizer {type(opt).__name__} has no step hooks; its steps are "
                           "not measured", level=logging.INFO)
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self.handles += [register_optimizer_step_pre_hook(self._global_pre),
                         register_optimizer_step_post_hook(self._global_post)]

    def refresh(self) -> None:
        """Read the model's parameters again (a module was added or replaced mid-run): an
        optimizer built afterwards on the new module alone holds none of the parameters read on
        entry, and would never be watched. Optimizers found so far stay found."""
        self._params = {id(p) for p in self.root.parameters()}
        self._decided = {k: v for k, v in self._decided.items() if v[1]}

    def stop(self) -> None:
        """Remove every hook (safe twice)."""
        for h in self.handles:
            h.remove()
        self.handles = []

    def is_primary(self, optimizer: Any) -> bool:
        """Whether ``optimizer``'s steps are the primary ones: it is the one given (or wraps its
        parameters), or no optimizer was given."""
        if self.explicit is None or optimizer is self.explicit:
            return True
        groups = getattr(optimizer, "param_groups", ())
        return bool(groups) and bool(groups[0]["params"]) and id(groups[0]["params"][0]) in self._primary

    def params_of(self, optimizer: Any) -> list[Any]:
        """The parameters ``optimizer`` holds (every param group)."""
        return [p for g in getattr(optimizer, "param_groups", ()) for p in g["params"]]

    def _watched(self, optimizer: Any) -> bool:
        if optimizer is self.explicit:
            return True
        groups = getattr(optimizer, "param_groups", None)
        if groups is None:
            return False
        seen = self._decided.get(id(optimizer))
        if seen is not None and seen[0] == len(groups):
            return seen[1]
        ours = any(id(p) in self._params for g in groups for p in g["params"])
        self._decided[id(optimizer)] = (len(groups), ours)
        if ours and all(o is not optimizer for o in self.found):
            self.found.append(optimizer)
        return ours

    def _global_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.quiet:
            return
        try:
            if self._watched(optimizer):
                self._pre(optimizer)
        except Exception as e:  # noqa: BLE001 - a hook never raises into training
            self._report(("internal", "optimizer hook", type(e).__name__),
                         f"internal error in the optimizer hook: {e!r}")

    def _global_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.quiet:
            return
        try:
            if self._watched(optimizer):
                self._post(optimizer)
        except Exception as e:  # noqa: BLE001 - a hook never raises into training
            self._report(("internal", "optimizer hook", type(e).__name__),
                         f"internal error in the optimizer hook: {e!r}")
