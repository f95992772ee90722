"""NeuralDBG's failure-injection benchmark (run from a checkout: ``python -m benchmarks``).

Modules: :mod:`benchmarks.suites` (what runs: the zoo or the ecosystem suite),
:mod:`benchmarks.harness` (``run``: pool, resume, progress), :mod:`benchmarks.records` (the
records schema and files), :mod:`benchmarks.metrics` (scoring, pure),
:mod:`benchmarks.baselines` (rule baselines), :mod:`benchmarks.evaluation`,
:mod:`benchmarks.report` and :mod:`benchmarks.plots` (``report``).
Importing the package imports neither torch nor the zoo.
"""

import logging
import sys

_HANDLER_MARK = "_neuraldbg_benchmarks"


def log_to_stderr(level: int, fmt: str = "%(levelname)s %(name)s: %(message)s") -> None:
    """Show the ``neuraldbg`` logger (which every benchmark module logs to) on stderr at ``level``,
    once per process; the root logger stays the application's."""
    log = logging.getLogger("neuraldbg")
    if not any(getattr(h, _HANDLER_MARK, False) for h in log.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(fmt))
        setattr(handler, _HANDLER_MARK, True)
        log.addHandler(handler)
    log.setLevel(level)
