"""The warm-up evidence (neuraldbg/causal/nodes/schedule.py): its pure state on hand-computed
rates, and the extractor on hand-made traces: read on deep post-norm stacks only."""
from __future__ import annotations

from neuraldbg.causal import api
from neuraldbg.causal.nodes.schedule import POSTNORM_DEEP, SCHEDULE_MIN_STEPS, WARMUP_START, warmup_state
from neuraldbg.trace import LayerInfo
from tiny import make_trace


def test_warmup_state_by_the_first_rate_against_the_peak():
    assert warmup_state(0.0, 1e-3, 100) == "present"                   # transformers' linear warm-up
    assert warmup_state(WARMUP_START * 1e-3, 1e-3, 100) == "present"   # a 4-step LambdaLR ramp
    assert warmup_state(0.5e-3, 1e-3, 100) == "absent"                 # a 2-step ramp is none
    assert warmup_state(1e-3, 1e-3, SCHEDULE_MIN_STEPS) == "absent"
    assert warmup_state(1e-3, 1e-3, SCHEDULE_MIN_STEPS - 1) is None     # too few steps to see a ramp
    assert warmup_state(None, 1e-3, 100) is None and warmup_state(0.0, 0.0, 100) is None


def postnorm_layers(blocks):
    out = []
    for i in range(blocks):
        for n, t in (("self_attn", "MultiheadAttention"), ("norm1", "LayerNorm"), ("linear1", "Linear"),
                     ("linear2", "Linear"), ("norm2", "LayerNorm")):
            out.append(LayerInfo(f"encoder.layers.{i}.{n}", t, len(out), 4))
    return out


def reading(blocks, **sigs):
    tr = make_trace(layers=postnorm_layers(blocks), losses=[1.4] * 20, family="transformer", sigs=sigs)
    ev = api.evidence(tr)
    return ev.observed.get("warmup"), ev.unobserved.get("warmup")


def test_read_on_a_deep_post_norm_stack_only():
    no_ramp = {"lr_first": 3e-3, "lr_peak": 3e-3, "lr_checked": 20, "lr_warmup_steps": 0}
    ramp = {"lr_first": 0.0, "lr_peak": 3e-3, "lr_checked": 20, "lr_warmup_steps": 10}
    assert reading(POSTNORM_DEEP, **no_ramp)[0] == "absent"
    assert reading(12, **ramp)[0] == "present"
    state, why = reading(POSTNORM_DEEP - 1, **no_ramp)
    assert state is None and "post-norm" in why


def test_unknown_without_a_rate_or_on_a_resumed_run():
    assert reading(12)[0] is None
    assert reading(12, lr_first=3e-3, lr_peak=3e-3, lr_checked=20, started_trained="resumed")[0] is None
