"""The benchmark's command-line entry points show the ``neuraldbg`` logger without configuring
the root logger (``benchmarks/__init__.py``: ``log_to_stderr``).

Regression: ``python -m benchmarks``, the harness's pool workers and ``benchmarks.priors_eval``
called ``logging.basicConfig``, which configures the root logger of whoever imports and runs
them (a notebook, another tool's process)."""
import logging

from benchmarks import log_to_stderr


def test_log_to_stderr_adds_one_handler_to_neuraldbg_and_leaves_the_root_logger_alone():
    root, log = logging.getLogger(), logging.getLogger("neuraldbg")
    root_before, level_before = list(root.handlers), log.level
    ours = [h for h in log.handlers if getattr(h, "_neuraldbg_benchmarks", False)]
    try:
        log_to_stderr(logging.INFO)
        log_to_stderr(logging.WARNING, "%(message)s")
        added = [h for h in log.handlers if getattr(h, "_neuraldbg_benchmarks", False)]
        assert len(added) == 1 and log.level == logging.WARNING
        assert root.handlers == root_before
    finally:
        for h in log.handlers:
            if getattr(h, "_neuraldbg_benchmarks", False) and h not in ours:
                log.removeHandler(h)
        log.setLevel(level_before)
