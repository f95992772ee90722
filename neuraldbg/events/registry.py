"""Registry of detectors (accelerate-style ``register_*``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TypeVar

from neuraldbg.config import DetectorConfig
from neuraldbg.events.base import Event
from neuraldbg.events.stepstats import StepStats


@dataclass(frozen=True)
class DetectorContext:
    """What a detector knows about the model: its family and the layers in forward order."""

    family: str
    layer_order: tuple[str, ...]
    input_layer: str | None


class Detector:
    """Base class: stats in, events out. One small subclass per quantity.

    ``update`` returns *hits*: events observed at this step. The monitor's event log
    collapses consecutive hits of the same kind in the same layer into one transition.
    """

    name: str = "detector"
    #: whether :meth:`update` reads a step that recorded nothing but its loss (an unchecked
    #: step; its ``names`` are empty and ``has_backward`` is False). The monitor skips the call
    #: where this is False: at ``every=10`` nine steps in ten are such steps.
    reads_loss_only: bool = True

    def __init__(self, config: DetectorConfig, context: DetectorContext) -> None:
        self.config = config
        self.context = context

    def update(self, stats: StepStats) -> list[Event]:  # pragma: no cover - abstract
        """Consume one checked step; return the events seen at it."""
        raise NotImplementedError

    def forget_layer(self, layer: str) -> None:
        """Drop what this detector learned about ``layer`` (its module was replaced mid-run).

        The monitor calls this on every detector when a layer name gets a new module; the
        default keeps nothing per layer and does nothing. Detectors with per-layer baselines
        override it, since a baseline of the old weights says nothing about the new ones.
        """


DETECTORS: dict[str, type[Detector]] = {}
D = TypeVar("D", bound=type[Detector])


def register_detector(name: str) -> Callable[[D], D]:
    """Class decorator adding a detector under ``name`` (used by ``NeuralDbg(detectors=...)``)."""

    def deco(cls: D) -> D:
        if name in DETECTORS and DETECTORS[name] is not cls:
            raise ValueError(f"detector {name!r} is already registered")
        cls.name = name
        DETECTORS[name] = cls
        return cls

    return deco


def build_detectors(names: list[str] | tuple[str, ...] | None, config: DetectorConfig,
                    context: DetectorContext) -> list[Detector]:
    """Instantiate the named detectors (all registered ones when ``names`` is None)."""
    import neuraldbg.events.detectors  # noqa: F401  (registers the built-in detectors)

    names = list(DETECTORS) if names is None else list(names)
    unknown = [n for n in names if n not in DETECTORS]
    if unknown:
        raise ValueError(f"unknown detectors {unknown}; valid: {sorted(DETECTORS)}")
    return [DETECTORS[n](config, context) for n in names]
