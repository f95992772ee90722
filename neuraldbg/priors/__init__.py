"""Family priors over the root causes: shipped JSON files, loader and family detection.

``load_priors(family=None, path=None)`` returns validated :class:`Priors`;
``detect_family(model)`` guesses the family from module types; ``tune(runs, family)`` fits a
family's CPDs to benchmark runs (:mod:`neuraldbg.priors.tune`; numpy only). Nothing
here imports pgmpy (or torch, until ``detect_family`` is called with a model).
"""
from __future__ import annotations

from neuraldbg.priors.detect import detect_family
from neuraldbg.priors.loader import (
    DEFAULT_FAMILY,
    FAMILIES,
    SCHEMA_VERSION,
    PriorError,
    Priors,
    load_priors,
    read,
    validate,
)
# after the loader: the function shadows the submodule of the same name on the package
from neuraldbg.priors.tune import tune

__all__ = ["DEFAULT_FAMILY", "FAMILIES", "SCHEMA_VERSION", "PriorError", "Priors", "detect_family",
           "load_priors", "read", "tune", "validate"]

