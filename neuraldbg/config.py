"""Detector thresholds: one validated, frozen dataclass, each field with its origin.

Anchors come from published tools (SageMaker Debugger, AutoTrainer) and were then checked
against healthy runs of the zoo (MLP, CNN, tiny transformer, 300 steps, 5 seeds), where they
raise no failure events. Relative criteria (a layer against its own early baseline, or
against the other layers) are preferred to absolute ones, which do not transfer between
architectures.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from neuraldbg.vocab import families_with


@dataclass(frozen=True)
class DetectorConfig:
    """Thresholds of every detector. Construct with keyword arguments; invalid values raise."""

    # -- warm-up --------------------------------------------------------------------------
    #: checked steps used to form per-layer baselines (gradient scale, input distribution)
    warmup_checks: int = 5

    # -- gradient health ------------------------------------------------------------------
    #: absolute vanishing: RMS of a layer's parameter gradient below this
    #: (SageMaker Debugger's vanishing_gradient rule uses mean |grad| < 1e-7)
    vanish_abs: float = 1e-7
    #: relative vanishing: layer gradient RMS / largest layer gradient RMS below this
    #: (AutoTrainer flags first/last-layer gradient-norm ratios below 1e-3)
    vanish_ratio: float = 1e-3
    #: relative exploding: layer gradient RMS / its own warm-up median above this
    explode_rel: float = 100.0
    #: absolute exploding: layer gradient RMS above this. Healthy zoo models sit at 1e-4..1e-1
    #: RMS per element; a 30x too large init gives 5..50 at step 0, before any baseline exists
    explode_abs: float = 10.0
    #: cross-layer exploding: layer gradient RMS / smallest layer RMS above this while the
    #: layer also grew against its own baseline (AutoTrainer: first/last ratio > 70)
    explode_ratio: float = 70.0

    #: consecutive GradScaler overflow steps tolerated before they are reported: the scaler
    #: halves its scale per overflow, so 16 in a row take the default 2**16 down to 1, after
    #: which the gradients themselves are not finite, not merely the scaling
    scaler_overflow_patience: int = 16

    # -- activation regime ----------------------------------------------------------------
    #: dead: fraction of ReLU units never active over the batch (70-90% in the literature)
    dead_fraction: float = 0.7
    #: saturated: fraction of bounded-activation outputs near a bound (> 50%)
    saturated_fraction: float = 0.5
    #: "near a bound": within this fraction of the output range
    saturation_margin: float = 0.01
    #: a softmax row is saturated within this of one-hot (largest probability >= 0.9): the
    #: softmax Jacobian's diagonal p(1 - p) is then at most 0.09, so it passes under a tenth
    #: of the gradient; rows with a single unmasked entry are one-hot by construction and
    #: are not counted
    softmax_saturation_margin: float = 0.1
    #: consecutive checks a regime must hold before it is reported (one bad batch is noise)
    regime_persistence: int = 3

    # -- optimizer instability (loss) -----------------------------------------------------
    #: loss steps in the robust reference window for spikes
    spike_window: int = 20
    #: spike: z of log loss above this, against the median of the window's last values and the
    #: MAD of its step-to-step differences (a falling curve's descent is no noise) ...
    spike_z: float = 6.0
    #: ... and the loss above this multiple of the window median ...
    spike_ratio: float = 2.0
    #: ... and the jump above this fraction of the first losses' level (a 2x blip on a loss
    #: that has already fallen near 0 is noise, not an instability)
    spike_min_jump: float = 0.5
    #: divergence: median of recent losses above this multiple of the first losses' median
    divergence_factor: float = 3.0
    #: and above this multiple of the best (lowest) window median seen
    divergence_best_factor: float = 10.0
    #: losses in the divergence window (sustained growth, not one spike)
    divergence_window: int = 5
    #: plateau: window (steps) over which progress is measured
    plateau_window: int = 80
    #: plateau: relative improvement of the loss over the whole window below this ...
    plateau_rel: float = 0.01
    #: ... while the loss has made less than this relative progress since the start (a run
    #: that learned and then levels off has converged, it is not stuck)
    plateau_max_progress: float = 0.1
    #: families whose objective is not minimized monotonically (adversarial / RL): no plateau
    #: (the ``non_monotone`` trait of ``neuraldbg/vocab.py``)
    plateau_exempt_families: tuple[str, ...] = field(default_factory=lambda: families_with("non_monotone"))

    # -- data anomaly ---------------------------------------------------------------------
    #: shift: input std ratio to the warm-up reference beyond this factor (either way)
    shift_scale_factor: float = 5.0
    #: shift: input mean moved by more than this many reference standard deviations
    shift_mean_z: float = 3.0
    #: checked steps before the shift reference starts (the first batches may be special)
    shift_skip_checks: int = 2
    #: token inputs: warm-up checks whose id histograms form the reference and, compared
    #: leave-one-out, the null band of sampling noise (events/tokens.py)
    token_reference_checks: int = 10
    #: token inputs: shifted beyond this many times the largest warm-up (null) distance
    token_shift_factor: float = 2.0

    # -- collapsing -----------------------------------------------------------------------
    #: a repeat of the same event in the same layer within this many checks merges into it
    collapse_gap_checks: int = 3

    # -- cost on deep models --------------------------------------------------------------
    #: monitored modules (counted on entry) above which each checked step measures the
    #: outputs of one rotating share of the modules: ceil(n / this) shares, at most
    #: rotation_max_shares, so every module is measured within that many checks (parameter
    #: gradients stay measured on every check). It bounds a check's per-module work (about
    #: 15 us per module on a CPU) where modules are many; the detection delay it adds is in
    #: docs/events.md ("Deep models")
    rotate_modules_above: int = 64
    #: the most rotating shares: above rotate_modules_above x this many modules, the shares
    #: grow instead of their number, so a layer is never unobserved for more checks than this
    #: (1: every module on every check, whatever the model's size)
    rotation_max_shares: int = 4
    #: trainable parameters (counted on entry) above which a module's parameters share one
    #: gradient hook, on its first parameter, and the others' gradients are read when the
    #: backward pass ends: every hooked parameter costs each backward pass, checked or not, a
    #: call into Python inside torch (docs/overhead.md). The gradients read are the same; below
    #: it every parameter keeps its own hook
    group_param_hooks_above: int = 64
    #: read parameter gradients from hooks on the parameters (above) instead of noticing each
    #: backward pass by the model output's gradient, which leaves nothing in torch. The monitor
    #: switches to them by itself where the output cannot see every pass (docs/overhead.md); set
    #: it where gradients are consumed inside backward by hooks registered after the monitor
    #: entered (an optimizer run in backward)
    param_grad_hooks: bool = False

    def __post_init__(self) -> None:
        positive = [f.name for f in fields(self) if isinstance(getattr(self, f.name), (int, float))
                    and not isinstance(getattr(self, f.name), bool)]
        for name in positive:
            v = getattr(self, name)
            if not v > 0:
                raise ValueError(f"DetectorConfig.{name} must be > 0, got {v!r}")
        for name in ("dead_fraction", "saturated_fraction", "saturation_margin", "softmax_saturation_margin",
                     "plateau_rel", "plateau_max_progress", "vanish_ratio"):
            v = getattr(self, name)
            if not 0 < v < 1:
                raise ValueError(f"DetectorConfig.{name} must be in (0, 1), got {v!r}")
        if self.vanish_abs >= self.explode_abs:
            raise ValueError("DetectorConfig.vanish_abs must be below explode_abs")
        if not isinstance(self.plateau_exempt_families, tuple):
            object.__setattr__(self, "plateau_exempt_families", tuple(self.plateau_exempt_families))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "DetectorConfig":
        """Build from a mapping; unknown keys raise, naming the valid ones."""
        valid = {f.name for f in fields(cls)}
        unknown = set(d) - valid
        if unknown:
            raise ValueError(f"unknown DetectorConfig fields {sorted(unknown)}; valid: {sorted(valid)}")
        return cls(**dict(d))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        d = dataclasses.asdict(self)
        d["plateau_exempt_families"] = list(self.plateau_exempt_families)
        return d
