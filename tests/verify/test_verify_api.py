"""dbg.verify(): its checks, its result, and the user's state left exactly as it was."""
from __future__ import annotations

import json
import math

import pytest
import torch

from neuraldbg import NeuralDbg
from neuraldbg.verify.types import Verification, VerifiedHypothesis
from neuraldbg.vocab import ROOTS
from verify_cases import train


def _bits(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().numpy().tobytes()  # NaN == NaN, bit for bit


def _state(model, opt):
    params = {n: _bits(p) for n, p in model.named_parameters()}
    grads = {n: None if p.grad is None else _bits(p.grad) for n, p in model.named_parameters()}
    sd = opt.state_dict()
    opt_state = {k: {kk: _bits(vv) if isinstance(vv, torch.Tensor) else vv for kk, vv in v.items()}
                 for k, v in sd["state"].items()}
    groups = [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]]
    modes = {n: m.training for n, m in model.named_modules()}
    return params, grads, opt_state, groups, modes, _bits(torch.get_rng_state())


@pytest.mark.parametrize("fault", [dict(lr=5.0), dict(gain=30.0), dict(nan_at=20)])
def test_model_and_optimizer_restored_bit_for_bit(fault):
    model, opt, dbg, replay = train(steps=40, **fault)
    before = _state(model, opt)
    v = dbg.verify(replay)
    assert v.extra_steps > 0  # it did replay, and change the live objects meanwhile
    assert _state(model, opt) == before
    assert dbg.verify(replay).posterior == v.posterior  # and a second call sees the same run


def test_state_restored_when_the_replay_raises():
    model, opt, dbg, replay = train(steps=30, lr=5.0)
    before = _state(model, opt)
    calls = []

    def broken(m, o, step):
        calls.append(step)
        if len(calls) == 3:
            raise RuntimeError("the user's step failed")
        return replay(m, o, step)

    with pytest.raises(RuntimeError, match="the user's step failed"):
        dbg.verify(broken)
    assert _state(model, opt) == before
    with pytest.raises(TypeError, match=r"must return the step's loss \(a float or a 0-d tensor\), got NoneType"):
        dbg.verify(lambda m, o, step: None)
    assert _state(model, opt) == before


def test_without_snapshots_the_error_says_how_to_enable_them():
    model, opt, dbg, replay = train(steps=10, snapshots=None)
    with pytest.raises(RuntimeError, match=r"snapshots=True\) \(or snapshots=K"):
        dbg.verify(replay)


def test_bad_calls_are_refused_clearly():
    model, opt, dbg, replay = train(steps=10)
    for kw, err, msg in [(dict(steps=0), ValueError, "steps must be an int >= 1"),
                         (dict(top=0), ValueError, "top must be an int >= 1"),
                         (dict(steps=2.5), ValueError, "steps must be an int >= 1")]:
        with pytest.raises(err, match=msg):
            dbg.verify(replay, **kw)
    with pytest.raises(TypeError, match=r"replay must be callable as replay\(model, optimizer, step\)"):
        dbg.verify("not a function")
    no_opt = NeuralDbg(model, snapshots=True)
    with no_opt:
        pass
    with pytest.raises(ValueError, match="verify needs the optimizer"):
        no_opt.verify(replay)
    live = NeuralDbg(model, optimizer=opt, snapshots=True)
    with live, pytest.raises(RuntimeError, match="after the `with NeuralDbg"):
        live.verify(replay)


def test_result_shape():
    model, opt, dbg, replay = train(steps=40, lr=5.0)
    v = dbg.verify(replay, steps=10, top=2)
    assert isinstance(v, Verification) and all(isinstance(h, VerifiedHypothesis) for h in v.hypotheses)
    probs = [h.probability for h in v.hypotheses]
    assert probs == sorted(probs, reverse=True)
    assert sum(t.outcome != "untestable" for t in v.tests) <= 2
    assert v.extra_steps == sum(t.steps for t in v.tests) and all(t.steps <= 10 for t in v.tests)
    for dist in v.posterior.values():
        assert sum(dist.values()) == pytest.approx(1.0)
    top = v.hypotheses[0]
    assert top.verified is True and top.test is not None and "Verified by replay" in str(top)
    assert top.probability_before == pytest.approx(v.posterior_before[top.cause][top.state])
    assert len(v.root_joint_before) == math.prod(len(s) for s in ROOTS.values())
    json.dumps(v.to_dict())  # plain data: JSON-ready
    assert "steps replayed" in str(v)
