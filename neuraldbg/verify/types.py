"""Result records of verification: plain, frozen, tensor-free (like :mod:`neuraldbg.causal.types`)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from neuraldbg.causal.types import Hypothesis, Posterior


@dataclass(frozen=True)
class Test:
    """One hypothesis put to the test: what was changed, over which steps, and what happened.

    ``outcome`` is ``"vanished"``, ``"persisted"`` or ``"untestable"`` (``reason`` says why);
    ``improvement`` is the mean relative loss improvement of the late window
    (:mod:`neuraldbg.verify.outcome`), ``None`` when nothing was replayed; ``symptoms`` and
    ``symptoms_after`` count the hypothesis' events in a window from the first step and their
    kinds' events in the replay; ``reference_gain`` is the reference loss' late improvement
    when the run gave up part of its reference task (``None`` otherwise).
    """

    cause: str
    state: str
    intervention: str
    outcome: str
    reason: str = ""
    start_step: int | None = None
    end_step: int | None = None       # exclusive
    steps: int = 0
    improvement: float | None = None
    nonfinite_before: int | None = None
    nonfinite_after: int | None = None
    events_after: int | None = None   # events the replay's monitor raised
    acted: int = 0                    # how often the intervention changed something
    layers: tuple[str, ...] = ()      # re-initialized layers (initialization tests)
    symptoms: int = 0                 # the hypothesis' events the paired window showed
    symptoms_after: int = 0           # replay events of their kinds (0 of >= 1: they vanished)
    reference_gain: float | None = None  # the reference loss' late improvement (retention not kept)

    @property
    def verified(self) -> bool | None:
        """``True`` when the symptom vanished, ``False`` when it persisted, ``None`` if untestable."""
        return None if self.outcome == "untestable" else self.outcome == "vanished"

    @property
    def label(self) -> str:
        """``cause/state``."""
        return f"{self.cause}/{self.state}"

    def sentence(self) -> str:
        """One sentence for a hypothesis' description."""
        if self.outcome == "untestable":
            return f"Not verified: {self.reason}."
        span = f"steps {self.start_step}-{(self.end_step or 0) - 1}"
        what = "vanished" if self.outcome == "vanished" else "persisted"
        parts = []
        if self.symptoms:
            ev = "event" if self.symptoms == 1 else "events"
            parts.append(f"{self.symptoms} {ev} of the run, {self.symptoms_after} of the same kind in the replay")
        if self.reference_gain is not None:
            parts.append(f"reference loss {100 * self.reference_gain:+.0f}%")
        if parts:
            what += f" ({'; '.join(parts)}; loss {100 * (self.improvement or 0.0):+.0f}%)"
        return f"Verified by replay ({span}, {self.intervention}): the symptom {what}."

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["layers"] = list(self.layers)
        for k in ("improvement", "reference_gain"):
            if isinstance(d[k], float) and not math.isfinite(d[k]):
                d[k] = None
        d["verified"] = self.verified
        return d


@dataclass(frozen=True)
class VerifiedHypothesis(Hypothesis):
    """A :class:`~neuraldbg.causal.types.Hypothesis` after verification: ``probability`` is
    the updated posterior, ``probability_before`` the observational one, ``verified``
    ``True``/``False``/``None`` (not tested, or untestable), ``test`` the test behind it."""

    verified: bool | None = None
    probability_before: float = math.nan
    test: Test | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        d = super().to_dict()
        d.update(verified=self.verified, probability_before=self.probability_before,
                 test=self.test.to_dict() if self.test is not None else None)
        return d


@dataclass(frozen=True)
class Verification:
    """What :meth:`NeuralDbg.verify` returns.

    ``hypotheses``: re-ranked by the updated posterior (every abnormal state above the
    reporting floor, and every tested one); ``posterior``: the updated posterior (same shape as
    ``dbg.posterior()``); ``posterior_before``: the observational one; ``tests``: one record per
    tested hypothesis, in the order tested; ``extra_steps``: replayed steps in all.
    """

    hypotheses: tuple[VerifiedHypothesis, ...]
    posterior: Posterior
    extra_steps: int
    tests: tuple[Test, ...] = ()
    posterior_before: Posterior | None = None
    #: the observational posterior over the 54 root joint states (compiled-network order), so
    #: the update can be recomputed offline with other likelihood tables
    root_joint_before: tuple[float, ...] = ()

    def __str__(self) -> str:
        lines = [f"verification: {len(self.tests)} hypotheses tested, {self.extra_steps} steps replayed, "
                 f"P(healthy) {self.posterior_before.p_healthy if self.posterior_before else float('nan'):.3f} "
                 f"-> {self.posterior.p_healthy:.3f}"]
        lines += [f"  {h}" for h in self.hypotheses]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        def post(p: Posterior | None) -> Any:
            return None if p is None else {v: dict(d) for v, d in p.items()}
        return {"hypotheses": [h.to_dict() for h in self.hypotheses], "posterior": post(self.posterior),
                "posterior_before": post(self.posterior_before), "extra_steps": self.extra_steps,
                "tests": [t.to_dict() for t in self.tests]}
