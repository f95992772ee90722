"""Prior tuning: fit the causal network's CPDs to benchmark runs (``docs/priors.md``).

Imported only by ``neuraldbg tune-priors`` and the prior-evaluation benchmark, never by the
monitor or the queries. Four parts, each knowing nothing of the others' inputs:

* :mod:`~neuraldbg.fit.cases` -- training cases (:class:`Run`) read from a benchmark directory;
* :mod:`~neuraldbg.fit.em` -- EM of every non-root CPD under a structured Dirichlet prior;
* :mod:`~neuraldbg.fit.select` -- held-out scores, K-fold by seed, and the temperature;
* :mod:`~neuraldbg.fit.write` -- :func:`tune`, the fitted prior file and its provenance.
"""
from __future__ import annotations

from neuraldbg.fit.cases import Run, TuneError, inputs_hash, load_runs, truth_of
from neuraldbg.fit.em import DEFAULT_ESS, FitInfo, fit_cpds, pseudo_counts
from neuraldbg.fit.select import (DEFAULT_FOLDS, TEMPERATURE_GRID, CVResult, Prediction, cross_validate, fold_groups,
                                  label_metrics, predict, prior_mix_weights)
from neuraldbg.fit.write import TuneResult, hand_set_base, tune

__all__ = ["DEFAULT_ESS", "DEFAULT_FOLDS", "TEMPERATURE_GRID", "CVResult", "FitInfo", "Prediction", "Run",
           "TuneError", "TuneResult", "cross_validate", "fit_cpds", "fold_groups", "hand_set_base", "inputs_hash",
           "label_metrics", "load_runs", "predict", "prior_mix_weights", "pseudo_counts", "truth_of", "tune"]
