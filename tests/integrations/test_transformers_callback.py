"""The Hugging Face Trainer callback against the real library: the tiny task's MLP behind a
forward that returns ``loss`` (what the Trainer expects), 50 optimizer steps, compared with the
plain monitored loop on the same model and optimizer (tiny_task.py)."""
from __future__ import annotations

import logging

import pytest
import torch
from torch.nn import functional as F

transformers = pytest.importorskip("transformers", reason="the transformers extra is not installed")
pytest.importorskip("accelerate", reason="the Trainer needs accelerate")

from neuraldbg import load_session  # noqa: E402
from neuraldbg.integrations import common  # noqa: E402
from neuraldbg.integrations import transformers as integration  # noqa: E402
from neuraldbg.integrations.common import SESSION_FILE  # noqa: E402
from tiny_task import LR, LR_TOO_HIGH, STEPS, batches, make_model, optimizer, plain_run, top_cause  # noqa: E402


class Tiny(torch.nn.Module):
    """The tiny MLP with a Trainer-style forward; ``with_loss=False`` returns logits only."""

    def __init__(self, seed=0, with_loss=True, fail_at=None):
        super().__init__()
        self.net = make_model(seed)
        self.with_loss, self.fail_at, self.calls = with_loss, fail_at, 0

    def forward(self, x, labels=None):
        self.calls += 1
        if self.fail_at is not None and self.calls > self.fail_at:
            raise RuntimeError("injected failure in forward")
        logits = self.net(x)
        if not self.with_loss:
            return {"logits": logits}
        return {"loss": F.cross_entropy(logits, labels), "logits": logits}


class LossOutside(transformers.Trainer):
    """A custom compute_loss: the model's output carries no loss."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        out = model(inputs["x"])
        loss = F.cross_entropy(out["logits"], inputs["labels"])
        return (loss, out) if return_outputs else loss


def samples(n_batches):
    return [{"x": x[i], "labels": y[i]} for x, y in batches(n_batches) for i in range(len(y))]


def train(lr, tmp_path, *, callback=None, accum=1, model=None, trainer_cls=transformers.Trainer, **extra):
    model = model if model is not None else Tiny()
    opt = optimizer(model.parameters(), lr)
    const = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    kwargs = dict(output_dir=str(tmp_path / "out"), max_steps=STEPS, per_device_train_batch_size=32,
                  gradient_accumulation_steps=accum, use_cpu=True, report_to=[], save_strategy="no",
                  logging_strategy="no", disable_tqdm=True, max_grad_norm=0.0, seed=0)
    kwargs.update(extra)
    args = transformers.TrainingArguments(**kwargs)
    trainer = trainer_cls(model=model, args=args, train_dataset=samples(STEPS * accum), optimizers=(opt, const),
                          callbacks=[callback] if callback else [])
    trainer.train()
    return model


def warnings_of(caplog):
    return [r for r in caplog.records if r.name == "neuraldbg" and r.levelno >= logging.WARNING]


def test_healthy_run_stays_quiet_like_the_plain_loop(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="neuraldbg")
    cb = integration.NeuralDbgCallback()
    train(LR, tmp_path, callback=cb)
    assert warnings_of(caplog) == []
    assert cb.diagnosis.healthy and cb.dbg.events == []
    assert top_cause(plain_run(LR)) is None
    tr = cb.dbg.trace()
    assert (tr.first_step, tr.last_step, tr.loss.n) == (0, STEPS - 1, STEPS)


def test_lr_x1000_diagnosed_like_the_plain_loop_and_session_next_to_checkpoints(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="neuraldbg")
    cb = integration.NeuralDbgCallback(export=True)
    train(LR * 1000, tmp_path, callback=cb)
    assert top_cause(plain_run(LR * 1000)) == ("learning_rate", "too_high")
    assert top_cause(cb.dbg) == ("learning_rate", "too_high")
    assert any(LR_TOO_HIGH.search(r.getMessage()) for r in warnings_of(caplog))
    path = tmp_path / "out" / SESSION_FILE
    assert cb.diagnosis.session_path == str(path)
    assert top_cause(load_session(path)) == ("learning_rate", "too_high")


def test_gradient_accumulation_is_one_step_per_optimizer_step(tmp_path):
    cb = integration.NeuralDbgCallback()
    train(LR, tmp_path, callback=cb, accum=2)
    tr = cb.dbg.trace()
    # 100 micro-batch forwards, 50 optimizer steps: one monitor step each, losses averaged in it
    assert (tr.last_step, tr.loss.n) == (STEPS - 1, STEPS)
    assert cb.diagnosis.healthy


def test_loss_from_on_log_when_the_model_returns_none(tmp_path):
    cb = integration.NeuralDbgCallback()
    train(LR * 1000, tmp_path, callback=cb, model=Tiny(with_loss=False), trainer_cls=LossOutside,
          logging_strategy="steps", logging_steps=5)
    tr = cb.dbg.trace()
    assert tr.loss.n == STEPS // 5  # one logged (averaged) loss every 5 steps
    assert top_cause(cb.dbg) == ("learning_rate", "too_high")


def test_training_is_bitwise_unchanged(tmp_path):
    a = train(LR, tmp_path, callback=integration.NeuralDbgCallback())
    b = train(LR, tmp_path)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)


def test_a_crashed_train_is_closed_by_the_context_manager(tmp_path):
    cb = integration.NeuralDbgCallback()
    model = Tiny(fail_at=20)
    with pytest.raises(RuntimeError, match="injected failure"):
        with cb:
            train(LR, tmp_path, callback=cb, model=model)
    assert not cb.dbg.active and not model._forward_hooks
    tr = cb.dbg.trace()
    # steps 0-19 trained; step 20's input was seen (a pre-forward hook) before forward raised
    assert cb.diagnosis is not None and (tr.loss.n, tr.last_step) == (20, 20)
    assert cb.close() is cb.diagnosis  # idempotent


def test_bad_arguments_name_the_valid_ones():
    with pytest.raises(TypeError, match="valid: .*every"):
        integration.NeuralDbgCallback(evry=2)
    with pytest.raises(TypeError, match="takes them from the trainer"):
        integration.NeuralDbgCallback(model=None)
    with pytest.raises(TypeError, match=r"verbose must be True .* or False .*got int"):
        integration.NeuralDbgCallback(verbose=0)
    assert isinstance(integration.NeuralDbgCallback(), transformers.TrainerCallback)


# ---- the verdict, printed: a train() with no logging set up still says how it went -------------

def verdict_lines(capsys):
    """The lines printed to stdout that start with ``neuraldbg: ``."""
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith("neuraldbg: ")]


def test_a_healthy_train_prints_one_verdict_line_past_the_progress_bar(tmp_path, capsys):
    cb = integration.NeuralDbgCallback()
    train(LR, tmp_path, callback=cb, disable_tqdm=False)  # a user's default: the bar is still open then
    assert cb.diagnosis.healthy
    assert verdict_lines(capsys) == [f"neuraldbg: no failure found (P(healthy) = {cb.diagnosis.p_healthy:.3f})"]


def test_a_failing_train_prints_its_cause_and_fix_and_the_session(tmp_path, capsys):
    cb = integration.NeuralDbgCallback(export=True)
    train(LR * 1000, tmp_path, callback=cb)
    (line,) = verdict_lines(capsys)
    top = cb.diagnosis.hypotheses[0]
    assert top.cause == "learning_rate" and not cb.diagnosis.healthy
    assert line.startswith(f"neuraldbg: {top.description.rstrip('.')}; fix: ")
    assert line.endswith(f"; session at {tmp_path / 'out' / SESSION_FILE}")


def test_verbose_false_prints_nothing_and_survives_the_checkpoint(tmp_path, capsys):
    cb = integration.NeuralDbgCallback(verbose=False)
    train(LR * 1000, tmp_path, callback=cb)
    assert cb.diagnosis is not None and not cb.diagnosis.healthy
    assert verdict_lines(capsys) == []  # (the Trainer's own PrinterCallback still echoes every log dict)
    # the Trainer rebuilds a restored callback from these arguments
    assert cb.state()["args"] == {"export": None, "verbose": False}
    assert repr(cb) == "NeuralDbgCallback(export=None, verbose=False, **{})"


def test_a_crash_under_the_context_manager_prints_the_verdict_too(tmp_path, capsys):
    cb = integration.NeuralDbgCallback()
    with pytest.raises(RuntimeError, match="injected failure"):
        with cb:
            train(LR, tmp_path, callback=cb, model=Tiny(fail_at=20))
    assert verdict_lines(capsys) == [f"neuraldbg: {common.verdict_line(cb.diagnosis)}"]


# ---- train(resume_from_checkpoint=...): the restored weights are not an initialization ---------

def resumable(lr_after, tmp_path, steps, callback=None):
    """A Trainer on the tiny task whose learning rate is LR for the first STEPS steps and
    ``lr_after`` from there on (a LambdaLR: its factor is code, not checkpoint state), saving a
    checkpoint at step STEPS."""
    model = Tiny()
    opt = optimizer(model.parameters(), LR)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 if step < STEPS else lr_after / LR)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=steps, per_device_train_batch_size=32, use_cpu=True,
        report_to=[], save_strategy="steps", save_steps=STEPS, logging_strategy="no", disable_tqdm=True,
        max_grad_norm=0.0, seed=0)
    return transformers.Trainer(model=model, args=args, train_dataset=samples(2 * STEPS), optimizers=(opt, sched),
                                callbacks=[callback] if callback else [])


def resumed(lr_after, tmp_path):
    """Train STEPS healthy steps to a checkpoint, then resume it for STEPS more under the callback."""
    resumable(lr_after, tmp_path, STEPS).train()
    cb = integration.NeuralDbgCallback()
    checkpoint = tmp_path / "out" / f"checkpoint-{STEPS}"
    resumable(lr_after, tmp_path, 2 * STEPS, cb).train(resume_from_checkpoint=str(checkpoint))
    return cb


def test_a_resumed_train_does_not_blame_the_initialization(tmp_path):
    cb = resumed(LR * 1000, tmp_path)
    post = cb.dbg.posterior()
    assert cb.dbg.trace().first_step == STEPS
    assert 1 - post["initialization"]["ok"] < 0.5
    assert top_cause(cb.dbg) == ("learning_rate", "too_high")
    assert all(h.cause != "initialization" for h in cb.dbg.get_causal_hypotheses())
    cov = cb.dbg.coverage()["init_scale"]
    assert not cov.observed and cov.reason == f"not at initialization: resumed from a checkpoint at step {STEPS}"


def test_a_healthy_resumed_train_stays_quiet(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="neuraldbg")
    cb = resumed(LR, tmp_path)
    post = cb.dbg.posterior()
    assert post.is_healthy and post.p_healthy >= 0.5 and cb.diagnosis.healthy
    assert warnings_of(caplog) == []
    assert "resumed from a checkpoint" in cb.dbg.coverage()["init_scale"].reason


# ---- the callback's state rides in trainer_state.json: a resumed train is diagnosed as one run ---

def monitored_resume(lr_after, tmp_path, **resume_args):
    """STEPS healthy steps under a callback to a checkpoint, then resumed for STEPS more under a
    new callback; returns the resumed Trainer's callback and the checkpoint's folder."""
    resumable(lr_after, tmp_path, STEPS, integration.NeuralDbgCallback()).train()
    checkpoint = tmp_path / "out" / f"checkpoint-{STEPS}"
    cb = integration.NeuralDbgCallback()
    trainer = resumable(lr_after, tmp_path, 2 * STEPS, cb)
    for name, value in resume_args.items():
        setattr(trainer.args, name, value)
    trainer.train(resume_from_checkpoint=str(checkpoint))
    mine = [c for c in trainer.callback_handler.callbacks if type(c).__name__ == "NeuralDbgCallback"]
    return mine[0], checkpoint


def test_the_monitor_state_is_in_trainer_state_json(tmp_path):
    import json

    resumable(LR, tmp_path, STEPS, integration.NeuralDbgCallback()).train()
    saved = json.loads((tmp_path / "out" / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
    state = saved["stateful_callbacks"]["NeuralDbgCallback"]
    assert state["args"] == {"export": None, "verbose": True}
    resume_state = state["attributes"]["resume_state"]
    assert resume_state["version"] == 1 and resume_state["started_at_init"] is True
    doc = resume_state["session"]
    assert doc["steps"] == {"first": 0, "last": STEPS - 1} and doc["loss"]["n"] == STEPS
    assert "init_scale_log10" in doc["signatures"]


def test_a_resumed_train_is_diagnosed_over_the_whole_run(tmp_path, caplog):
    cb, _ = monitored_resume(LR, tmp_path)
    tr = cb.dbg.trace()
    assert (tr.first_step, tr.last_step, tr.loss.n) == (0, 2 * STEPS - 1, 2 * STEPS)
    assert cb.dbg.coverage()["init_scale"].observed  # the first part started at initialization
    assert cb.dbg.settings.at_init == f"resumed from a checkpoint at step {STEPS}"
    assert cb.diagnosis.healthy and cb.dbg.posterior().is_healthy


def test_a_resumed_train_with_a_too_high_learning_rate_names_it(tmp_path):
    cb, _ = monitored_resume(LR * 1000, tmp_path)
    assert cb.dbg.trace().first_step == 0 and cb.dbg.trace().loss.n == 2 * STEPS
    assert top_cause(cb.dbg) == ("learning_rate", "too_high")
    assert all(h.cause != "initialization" for h in cb.dbg.get_causal_hypotheses())


def test_the_trainer_restoring_stateful_callbacks_itself_gives_the_same(tmp_path):
    """With ``restore_callback_states_from_checkpoint`` the Trainer replaces the callback by
    one built from the saved arguments, the state set as an attribute."""
    cb, _ = monitored_resume(LR * 1000, tmp_path, restore_callback_states_from_checkpoint=True)
    tr = cb.dbg.trace()
    assert (tr.first_step, tr.loss.n) == (0, 2 * STEPS)
    assert top_cause(cb.dbg) == ("learning_rate", "too_high")


def test_the_trainers_own_warm_up_schedule_is_read(tmp_path):
    from neuraldbg.causal.nodes.run import LR_PEAK
    from neuraldbg.causal.nodes.schedule import LR_FIRST, LR_LAST, LR_WARMUP_STEPS

    cb = integration.NeuralDbgCallback()
    model = Tiny()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=STEPS, per_device_train_batch_size=32, use_cpu=True,
        report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True, seed=0, learning_rate=1e-3,
        warmup_steps=10, lr_scheduler_type="linear")
    transformers.Trainer(model=model, args=args, train_dataset=samples(STEPS), callbacks=[cb]).train()
    sigs = cb.dbg.trace().signatures
    # transformers' linear warm-up starts at 0 and peaks at step 10, then decays linearly to 0
    assert sigs.number(LR_FIRST) == 0.0 and sigs.number(LR_WARMUP_STEPS) == 10
    assert sigs.number(LR_PEAK) == pytest.approx(1e-3) and sigs.number(LR_LAST) < 1e-4
