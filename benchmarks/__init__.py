"""NeuralDBG's failure-injection benchmark (run from a checkout: ``python -m benchmarks``).

Modules: :mod:`benchmarks.suites` (what runs: the zoo or the ecosystem suite),
:mod:`benchmarks.harness` (``run``: pool, resume, progress), :mod:`benchmarks.records` (the
records schema and files), :mod:`benchmarks.metrics` (scoring, pure),
:mod:`benchmarks.baselines` (rule baselines), :mod:`benchmarks.evaluation`,
:mod:`benchmarks.report` and :mod:`benchmarks.plots` (``report``).
Importing the package imports neither torch nor the zoo.
"""
