"""The monitor's measurements, one module each, and the parts a monitor is built with.

Every measurement is a :class:`~neuraldbg.lifecycle.Measurement`: it declares the signatures it
reports (declared next to the evidence node that reads them, ``neuraldbg/causal/nodes/``),
follows the monitor's lifecycle and says whether it applies to a monitor
(:meth:`~neuraldbg.lifecycle.Measurement.for_monitor`). A module of this package registers its
measurements with :func:`register_measurement`; :func:`parts_for` lists what one monitor runs,
in the order the monitor calls them: the measurements (by module name, then registration),
then the optional add-ons (snapshots, then autosave, so its final document sees what the others
flushed on exit).
"""
from __future__ import annotations

import importlib
import pkgutil
from functools import partial
from typing import Any, TypeVar

from torch import nn

from neuraldbg.lifecycle import Addon, Measurement

M = TypeVar("M", bound=type[Measurement])
MEASUREMENTS: list[type[Measurement]] = []


def register_measurement(cls: M) -> M:
    """Class decorator: every monitor asks ``cls.for_monitor(root, settings)`` for its instance."""
    if cls not in MEASUREMENTS:
        MEASUREMENTS.append(cls)
    return cls


def measurement_classes() -> list[type[Measurement]]:
    """Every registered measurement, the modules of this package imported first (by name)."""
    for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        importlib.import_module(f"{__name__}.{m.name}")
    return list(MEASUREMENTS)


def parts_for(root: nn.Module, settings: Any) -> list[Addon]:
    """The measurements and add-ons of a monitor of ``root`` with ``settings``."""
    parts: list[Addon] = [m for cls in measurement_classes() if (m := cls.for_monitor(root, settings)) is not None]
    if settings.snapshots:  # checkpoints for verify(); the reference init scales serve its re-initialization
        from neuraldbg.monitor.measurements.weights import config_init_range, reference_stds
        from neuraldbg.verify.snapshots import make_snapshots

        snaps = make_snapshots(settings.snapshots, partial(reference_stds, init_range=config_init_range(root)))
        if snaps is not None:
            parts.append(snaps)
    if settings.autosave is not None:  # the session on disk while training runs
        from neuraldbg.monitor.autosave import Autosave

        parts.append(Autosave(settings.autosave, settings.autosave_interval))
    return parts
