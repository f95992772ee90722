"""What the benchmark runs: the suites and their run lists.

A *suite* is an object with ``architectures()``, ``family(arch)``, ``injections(arch)``
(records with ``name``, ``truth``, ``onset``, ``layer``) and
``run(arch, injection, seed, steps=None, monitor=None, threads=None)`` returning a
:class:`models.RunResult`. The ``zoo`` suite is the :mod:`models` package; ``ecosystem`` is
:mod:`benchmarks.ecosystem`, imported only when asked for, whose ``suite_runs(quick)`` gives
its own run list. :func:`plan` and :func:`suite_plan` turn a suite into :class:`RunSpec` s;
:mod:`benchmarks.harness` runs them.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Sequence

__all__ = [
    "DEFAULT_BARE_SEEDS", "DEFAULT_SEEDS", "DEFAULT_SUITE", "HEALTHY_PER_SEED", "QUICK_BARE_SEEDS",
    "QUICK_HEALTHY_SEEDS", "QUICK_SEEDS", "SUITES", "RunSpec", "get_suite", "plan", "suite_plan",
]

#: Suite sizes. Full: 5 seeds per injection and 3 healthy runs per seed and architecture
#: (15 each; with twelve architectures 180 healthy runs, more than the 150 that zero false
#: alarms need to bound the rate below 0.02). The unmonitored timing twin is trained for
#: healthy runs of seeds 0-4: overhead is a property of healthy training, and five pairs per
#: architecture give its median at a fraction of the cost of twinning all.
#: Quick: one seed, two healthy runs (both twinned) per architecture.
DEFAULT_SEEDS = 5
HEALTHY_PER_SEED = 3
DEFAULT_BARE_SEEDS = 5
QUICK_SEEDS = 1
QUICK_HEALTHY_SEEDS = 2
QUICK_BARE_SEEDS = 2

#: The suites ``--suite`` accepts and the module each one is.
SUITES: dict[str, str] = {"zoo": "models", "ecosystem": "benchmarks.ecosystem"}
DEFAULT_SUITE = "zoo"
#: What every suite provides (``suite_runs(quick)`` is optional).
SUITE_INTERFACE = ("architectures", "family", "injections", "run")


@dataclass(frozen=True)
class RunSpec:
    """One benchmark run; ``steps=None`` lets the suite choose its default length."""

    arch: str
    injection: str
    seed: int
    steps: int | None = None
    time_bare: bool = True
    suite: str = DEFAULT_SUITE
    #: ``run --verify``: replayed steps per hypothesis and hypotheses tested (0: no verification)
    verify_steps: int = 0
    verify_top: int = 0
    #: the monitor's check interval (``every=``): ``"auto"``, the monitor's default, or a
    #: positive interval as text (``"1"``: every step)
    every: str = "auto"

    @property
    def key(self) -> str:
        """File stem of this run's record and session: ``[<suite>__]<arch>__<injection>__<seed>``.

        Zoo keys carry no suite prefix, so folders written before suites existed still resume.
        """
        stem = f"{self.arch}__{self.injection}__{self.seed}"
        return stem if self.suite == DEFAULT_SUITE else f"{self.suite}__{stem}"


# --------------------------------------------------------------------------- suites

def _zoo() -> Any:
    import models  # the zoo lives at the checkout root, next to this package

    return models


def get_suite(name: str = DEFAULT_SUITE) -> Any:
    """The suite object called ``name``; ``ValueError`` naming the valid ones if unknown."""
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; valid: {', '.join(SUITES)}")
    if name == DEFAULT_SUITE:
        return _zoo()
    try:
        suite = importlib.import_module(SUITES[name])
    except ModuleNotFoundError as exc:
        if exc.name != SUITES[name]:
            raise  # the suite exists but one of its own imports is missing: show that
        raise ValueError(f"suite {name!r} is not available ({SUITES[name]} is not installed)") from None
    missing = [f for f in SUITE_INTERFACE if not callable(getattr(suite, f, None))]
    if missing:
        raise ValueError(f"suite {name!r} ({SUITES[name]}) lacks {', '.join(missing)}")
    return suite


# --------------------------------------------------------------------------- planning

def _check_names(suite: Any, archs: Sequence[str] | None,
                 injections: Sequence[str] | None) -> tuple[list[str], dict[str, list[str]]]:
    """The selected architectures and the injection names of each; unknown names raise."""
    known = list(suite.architectures())
    archs = list(archs) if archs else known
    bad = [a for a in archs if a not in known]
    if bad:
        raise ValueError(f"unknown architecture(s) {bad}; valid: {', '.join(known)}")
    all_inj = {a: [i.name for i in suite.injections(a)] for a in archs}
    if injections:
        valid = sorted({n for names in all_inj.values() for n in names})
        bad = [i for i in injections if i not in valid]
        if bad:
            raise ValueError(f"unknown injection(s) {bad} for {archs}; valid: {', '.join(valid)}")
    return archs, all_inj


def _spec(arch: str, injection: str, seed: int, steps: int | None, bare_seeds: int | None,
          bare_injected: bool, suite: str) -> RunSpec:
    twin = injection == "healthy" or bare_injected
    return RunSpec(arch, injection, seed, steps, twin and (bare_seeds is None or seed < bare_seeds), suite)


def plan(zoo: Any = None, archs: Sequence[str] | None = None, injections: Sequence[str] | None = None,
         seeds: int = DEFAULT_SEEDS, healthy_seeds: int | None = None, steps: int | None = None,
         bare_seeds: int | None = None, bare_injected: bool = False, suite: str = DEFAULT_SUITE) -> list[RunSpec]:
    """The runs of a suite.

    Every selected architecture with every selected injection it supports, seeds ``0..seeds-1``;
    ``healthy`` gets ``healthy_seeds`` seeds (default ``HEALTHY_PER_SEED * seeds``). The
    unmonitored timing twin is trained for healthy runs of seeds below ``bare_seeds``
    (``None``: every seed), and for injected runs too when ``bare_injected``.
    Unknown names raise ``ValueError`` listing the valid ones. ``zoo`` is the suite object
    (default: the one named ``suite``).
    """
    zoo = zoo or get_suite(suite)
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    archs, all_inj = _check_names(zoo, archs, injections)
    specs: list[RunSpec] = []
    for a in archs:
        names = [n for n in all_inj[a] if not injections or n in injections]
        for n in names:
            if n == "healthy":
                k = healthy_seeds if healthy_seeds is not None else HEALTHY_PER_SEED * seeds
            else:
                k = seeds
            specs.extend(_spec(a, n, s, steps, bare_seeds, bare_injected, suite) for s in range(k))
    return specs


def suite_plan(zoo: Any, quick: bool, archs: Sequence[str] | None = None,
               injections: Sequence[str] | None = None, steps: int | None = None,
               bare_seeds: int | None = None, bare_injected: bool = False,
               suite: str = DEFAULT_SUITE) -> list[RunSpec]:
    """The suite's own run list (``zoo.suite_runs(quick)``), narrowed to ``archs``/``injections``."""
    _check_names(zoo, archs, injections)
    return [_spec(a, i, s, steps, bare_seeds, bare_injected, suite)
            for a, i, s in zoo.suite_runs(quick)
            if (not archs or a in archs) and (not injections or i in injections)]
