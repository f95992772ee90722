"""``dbg.to_tensorboard(writer)`` read back with TensorBoard's own EventAccumulator."""
from __future__ import annotations

import pytest

pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from torch.utils.tensorboard import SummaryWriter  # noqa: E402

from neuraldbg import load_session  # noqa: E402
from neuraldbg.examples import train_example  # noqa: E402
from tiny_task import LR_TOO_HIGH  # noqa: E402


def read(logdir):
    ea = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    return ea


def test_scalars_per_checked_step_and_the_diagnosis_as_text(tmp_path):
    run = train_example("mlp", "lr_too_high", seed=0, steps=60)
    dbg = run.dbg
    with SummaryWriter(str(tmp_path)) as writer:
        steps = dbg.to_tensorboard(writer)
    ea = read(tmp_path)
    tags = ea.Tags()["scalars"]
    assert "neuraldbg/p_healthy" in tags
    top = dbg.get_causal_hypotheses()[0]
    tag = f"neuraldbg/hypothesis/{top.cause}={top.state}"
    assert (top.cause, top.state) == ("learning_rate", "too_high") and tag in tags
    ph = ea.Scalars("neuraldbg/p_healthy")
    assert [s.step for s in ph] == steps
    tr = dbg.trace()
    # every checked step has a point: the run is short, so the loss history holds every step
    assert steps == list(range(tr.first_step, tr.last_step + 1))
    assert ph[-1].value == pytest.approx(dbg.posterior().p_healthy, abs=1e-6)
    assert ea.Scalars(tag)[-1].value == pytest.approx(top.probability, abs=1e-6)
    assert all(0.0 <= s.value <= 1.0 for s in ph)
    texts = [t for t in ea.Tags()["tensors"] if t.startswith("neuraldbg/diagnosis")]
    assert texts, ea.Tags()
    text = ea.Tensors(texts[0])[0].tensor_proto.string_val[0].decode()
    assert LR_TOO_HIGH.search(text) and "P(healthy)" in text


def test_a_healthy_session_stays_healthy_all_along(tmp_path):
    run = train_example("mlp", "healthy", seed=0, steps=60)
    path = run.dbg.export_aquarium_package(tmp_path / "run.json")
    with SummaryWriter(str(tmp_path / "tb")) as writer:
        load_session(path).to_tensorboard(writer)
    ph = read(tmp_path / "tb").Scalars("neuraldbg/p_healthy")
    assert len(ph) == 60
    assert min(s.value for s in ph) > 0.5


def test_bad_writer_and_top_are_refused():
    run = train_example("mlp", "healthy", seed=0, steps=5)
    with pytest.raises(TypeError, match="add_scalar"):
        run.dbg.to_tensorboard(object())
    with pytest.raises(ValueError, match="top"):
        run.dbg.to_tensorboard(SummaryWriter.__new__(SummaryWriter), top=-1)
