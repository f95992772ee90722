"""NeuralDBG's failure-injection benchmark (run from a checkout: ``python -m benchmarks``).

Modules: :mod:`benchmarks.metrics` (scoring, pure), :mod:`benchmarks.baselines` (rule
baselines), :mod:`benchmarks.harness` (``run``), :mod:`benchmarks.report` (``report``).
Importing the package imports neither torch nor the zoo.
"""
