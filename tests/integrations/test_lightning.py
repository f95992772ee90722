"""The Lightning callback against the real library: a tiny MLP, 50 steps, compared with the
plain monitored loop on the same model, data and optimizer (tiny_task.py)."""
from __future__ import annotations

import logging

import pytest
import torch
from torch.nn import functional as F

L = pytest.importorskip("lightning.pytorch", reason="the lightning extra is not installed")

from neuraldbg import load_session  # noqa: E402
from neuraldbg.integrations import lightning as integration  # noqa: E402
from neuraldbg.integrations.common import verdict_line  # noqa: E402
from tiny_task import LR, LR_TOO_HIGH, STEPS, batches, make_model, optimizer, plain_run, top_cause  # noqa: E402


def module_class(pl):
    """A LightningModule class of package ``pl`` around the tiny task's MLP."""
    class Tiny(pl.LightningModule):
        def __init__(self, lr, seed=0, fail_at=None):
            super().__init__()
            self.net = make_model(seed)
            self.lr, self.fail_at = lr, fail_at

        def training_step(self, batch, batch_idx):
            if self.fail_at is not None and batch_idx == self.fail_at:
                raise RuntimeError("injected failure in training_step")
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return optimizer(self.parameters(), self.lr)
    return Tiny


def fit(lr, *, callback=None, accumulate=1, pl=L, fail_at=None):
    """Fit for STEPS optimizer steps on the tiny task's batches, in order; returns the module."""
    module = module_class(pl)(lr, fail_at=fail_at)
    trainer = pl.Trainer(max_steps=STEPS, accumulate_grad_batches=accumulate, callbacks=[callback] if callback else [],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=1, num_sanity_val_steps=0)
    loader = torch.utils.data.DataLoader(batches(STEPS * accumulate), batch_size=None)
    trainer.fit(module, loader)
    return module


def warnings_of(caplog):
    return [r for r in caplog.records if r.name == "neuraldbg" and r.levelno >= logging.WARNING]


def test_healthy_run_stays_quiet_like_the_plain_loop(caplog):
    caplog.set_level(logging.INFO, logger="neuraldbg")
    cb = integration.NeuralDbgCallback()
    fit(LR, callback=cb)
    assert warnings_of(caplog) == []
    assert cb.diagnosis is not None and cb.diagnosis.healthy and cb.dbg.events == []
    assert top_cause(plain_run(LR)) is None
    assert any("no failure found" in r.getMessage() for r in caplog.records if r.name == "neuraldbg")
    tr = cb.dbg.trace()
    assert (tr.first_step, tr.last_step, tr.loss.n) == (0, STEPS - 1, STEPS)


def test_lr_x1000_diagnosed_like_the_plain_loop(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="neuraldbg")
    path = tmp_path / "run.json"
    cb = integration.NeuralDbgCallback(export=str(path))
    fit(LR * 1000, callback=cb)
    plain = plain_run(LR * 1000)
    assert top_cause(plain) == ("learning_rate", "too_high")
    assert top_cause(cb.dbg) == top_cause(plain)
    assert cb.diagnosis.hypotheses[0].cause == "learning_rate"
    logged = [r.getMessage() for r in warnings_of(caplog)]
    assert any(LR_TOO_HIGH.search(m) for m in logged)
    assert cb.diagnosis.session_path == str(path)
    assert top_cause(load_session(path)) == ("learning_rate", "too_high")


def test_same_losses_as_the_plain_loop_and_accumulation_is_one_step(tmp_path):
    """With accumulate_grad_batches=2 the monitor counts optimizer steps and records the
    un-normalized micro-batch loss, exactly as the plain loop does."""
    cb = integration.NeuralDbgCallback()
    fit(LR, callback=cb, accumulate=2)
    plain = plain_run(LR, accum=2)
    a, b = cb.dbg.trace(), plain.trace()
    assert (a.last_step, a.loss.n) == (b.last_step, b.loss.n) == (STEPS - 1, STEPS)
    assert [s for s, _ in a.loss.history] == [s for s, _ in b.loss.history]
    assert [v for _, v in a.loss.history] == pytest.approx([v for _, v in b.loss.history], rel=1e-5)


def test_training_is_bitwise_unchanged():
    with_cb = fit(LR, callback=integration.NeuralDbgCallback())
    without = fit(LR)
    for p, q in zip(with_cb.parameters(), without.parameters()):
        assert torch.equal(p, q)


def test_exception_in_fit_exits_the_monitor_and_diagnoses(capsys):
    cb = integration.NeuralDbgCallback()
    with pytest.raises(RuntimeError, match="injected failure"):
        fit(LR, callback=cb, fail_at=10)
    assert not cb.dbg.active  # every hook removed
    assert cb.diagnosis is not None and cb.dbg.trace().last_step == 9  # step 10 never got a forward
    assert verdict_lines(capsys) == [f"neuraldbg: {verdict_line(cb.diagnosis)}"]  # a crash is told too


def test_neuraldbg_kwargs_pass_through_and_bad_ones_name_the_valid():
    cb = integration.NeuralDbgCallback(every=5)
    fit(LR, callback=cb)
    assert cb.dbg.every == 5
    with pytest.raises(TypeError, match="valid: .*every"):
        integration.NeuralDbgCallback(evrey=5)
    with pytest.raises(TypeError, match="takes them from the trainer"):
        integration.NeuralDbgCallback(optimizer=None)
    with pytest.raises(TypeError, match="export must be"):
        integration.NeuralDbgCallback(export=3)


# ---- the verdict, printed: a fit with no logging set up still says how it went -----------------

def verdict_lines(capsys):
    """The lines printed to stdout that start with ``neuraldbg: ``."""
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith("neuraldbg: ")]


def test_a_healthy_fit_prints_one_verdict_line(capsys):
    cb = integration.NeuralDbgCallback()
    fit(LR, callback=cb)
    assert cb.diagnosis.healthy
    assert verdict_lines(capsys) == [f"neuraldbg: no failure found (P(healthy) = {cb.diagnosis.p_healthy:.3f})"]


def test_a_failing_fit_prints_its_cause_and_fix_and_the_session(tmp_path, capsys):
    path = tmp_path / "run.json"
    cb = integration.NeuralDbgCallback(export=path)
    fit(LR * 1000, callback=cb)
    (line,) = verdict_lines(capsys)
    top = cb.diagnosis.hypotheses[0]
    assert top.cause == "learning_rate" and not cb.diagnosis.healthy
    assert line.startswith(f"neuraldbg: {top.description.rstrip('.')}; fix: ")
    assert line.endswith(f"; session at {path}")


def test_verbose_false_prints_nothing(capsys):
    cb = integration.NeuralDbgCallback(verbose=False)
    fit(LR * 1000, callback=cb)
    assert cb.diagnosis is not None and not cb.diagnosis.healthy
    assert "neuraldbg" not in capsys.readouterr().out


def test_verbose_is_checked_like_the_other_arguments():
    with pytest.raises(TypeError, match=r"verbose must be True .* or False .*got str"):
        integration.NeuralDbgCallback(verbose="no")
    cb = integration.NeuralDbgCallback("run.json", False, every=2)
    assert (cb.export, cb.verbose, cb.neuraldbg_kwargs) == ("run.json", False, {"every": 2})
    assert repr(cb) == "NeuralDbgCallback(export='run.json', verbose=False, **{'every': 2})"


def test_both_import_paths():
    pl = pytest.importorskip("pytorch_lightning", reason="pytorch_lightning is not installed")
    cls = integration.NeuralDbgCallback  # both packages are imported now: the class fits both
    assert issubclass(cls, L.Callback) and issubclass(cls, pl.Callback)
    cb = cls()
    fit(LR * 1000, callback=cb, pl=pl)
    assert top_cause(cb.dbg) == ("learning_rate", "too_high")


# ---- resuming from a checkpoint: the restored weights are not an initialization ----------------

def plain_sgd_class(pl):
    """The tiny module under plain SGD (no momentum: its optimizer holds no state to tell of a
    resume), whose learning rate on resuming is its own, not the checkpoint's (set in
    ``on_train_start``, after Lightning restored the optimizer)."""
    class PlainSGD(module_class(pl)):
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr)

        def on_train_start(self):
            for group in self.trainer.optimizers[0].param_groups:
                group["lr"] = self.lr
    return PlainSGD


def trainer_for(steps, tmp_path, callback=None, pl=L):
    return pl.Trainer(max_steps=steps, callbacks=[callback] if callback else [], logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      accelerator="cpu", devices=1, num_sanity_val_steps=0, default_root_dir=str(tmp_path))


def checkpoint(tmp_path, pl=L):
    """A checkpoint after STEPS healthy steps."""
    module = plain_sgd_class(pl)(LR)
    trainer = trainer_for(STEPS, tmp_path, pl=pl)
    trainer.fit(module, torch.utils.data.DataLoader(batches(STEPS), batch_size=None))
    path = tmp_path / "trained.ckpt"
    trainer.save_checkpoint(path)
    return path


def resume(path, lr, tmp_path, callback, pl=L):
    """``fit(..., ckpt_path=path)`` for STEPS more steps at ``lr``."""
    trainer = trainer_for(2 * STEPS, tmp_path, callback, pl=pl)
    trainer.fit(plain_sgd_class(pl)(lr), torch.utils.data.DataLoader(batches(2 * STEPS), batch_size=None),
                ckpt_path=str(path))
    return trainer


def init_faulty(post):
    """P(initialization is not ok)."""
    return 1 - post["initialization"]["ok"]


def test_resumed_run_blamed_the_initialization_at_p_1_00(tmp_path):
    """Regression: a run resumed with ``ckpt_path`` whose learning rate is too high was diagnosed
    initialization/too_large at p = 1.00, its restored weights measured as if initial."""
    path = checkpoint(tmp_path)
    cb = integration.NeuralDbgCallback()
    resume(path, LR * 1000, tmp_path, cb)
    post = cb.dbg.posterior()
    assert cb.dbg.trace().first_step == STEPS  # the monitor starts where the checkpoint left off
    assert init_faulty(post) < 0.5
    assert top_cause(cb.dbg) == ("learning_rate", "too_high")
    assert all(h.cause != "initialization" for h in cb.dbg.get_causal_hypotheses())
    cov = cb.dbg.coverage()["init_scale"]
    assert not cov.observed
    assert cov.reason.startswith(f"not at initialization: resumed from a checkpoint at step {STEPS}")


def test_healthy_resume_stays_quiet(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="neuraldbg")
    path = checkpoint(tmp_path)
    cb = integration.NeuralDbgCallback()
    resume(path, LR, tmp_path, cb)
    post = cb.dbg.posterior()
    assert post.is_healthy and post.p_healthy >= 0.5 and cb.diagnosis.healthy
    assert warnings_of(caplog) == []
    assert all(h.cause != "initialization" for h in cb.dbg.get_causal_hypotheses())
    assert "resumed from a checkpoint" in cb.dbg.coverage()["init_scale"].reason


def test_an_explicit_at_init_wins_over_the_resume(tmp_path):
    path = checkpoint(tmp_path)
    cb = integration.NeuralDbgCallback(at_init=True)
    resume(path, LR, tmp_path, cb)
    assert cb.dbg.settings.at_init is True
    assert cb.dbg.coverage()["init_scale"].observed  # measured, as the user asked


# ---- the callback's state rides in the checkpoint: a resumed fit is diagnosed as one run --------

def monitored_checkpoint(tmp_path, pl=L):
    """A checkpoint after STEPS healthy steps under the callback, which saves its state there."""
    module = plain_sgd_class(pl)(LR)
    cb = integration.NeuralDbgCallback()
    trainer = trainer_for(STEPS, tmp_path, cb, pl=pl)
    trainer.fit(module, torch.utils.data.DataLoader(batches(STEPS), batch_size=None))
    path = tmp_path / "monitored.ckpt"
    trainer.save_checkpoint(path)
    return path


def test_the_monitor_state_is_in_the_checkpoint(tmp_path):
    path = monitored_checkpoint(tmp_path)
    state = torch.load(path, weights_only=False)["callbacks"]["NeuralDbgCallback"]
    assert state["version"] == 1 and state["started_at_init"] is True
    doc = state["session"]
    assert doc["steps"] == {"first": 0, "last": STEPS - 1} and doc["loss"]["n"] == STEPS
    assert "init_scale_log10" in doc["signatures"]
    import json
    json.dumps(state)  # JSON-safe: no tensors


def test_a_resumed_fit_is_diagnosed_over_the_whole_run(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="neuraldbg")
    path = monitored_checkpoint(tmp_path)
    caplog.clear()  # the first part alone (50 slow plain-SGD steps) may read as not learning yet
    cb = integration.NeuralDbgCallback()
    resume(path, LR, tmp_path, cb)
    tr = cb.dbg.trace()
    assert (tr.first_step, tr.last_step, tr.loss.n) == (0, 2 * STEPS - 1, 2 * STEPS)
    assert tr.loss.history[0][0] == 0 and tr.loss.history[-1][0] == 2 * STEPS - 1
    # the first part started at initialization: its scale stays the run's evidence
    assert cb.dbg.coverage()["init_scale"].observed
    assert cb.dbg.settings.at_init == f"resumed from a checkpoint at step {STEPS} ({path})"
    assert cb.diagnosis.healthy and warnings_of(caplog) == []
    assert cb.resume_state is None  # consumed: a later fit without a checkpoint starts afresh


def test_a_resumed_fit_with_a_too_high_learning_rate_names_it(tmp_path):
    path = monitored_checkpoint(tmp_path)
    cb = integration.NeuralDbgCallback()
    resume(path, LR * 1000, tmp_path, cb)
    assert cb.dbg.trace().first_step == 0
    assert top_cause(cb.dbg) == ("learning_rate", "too_high")
    assert all(h.cause != "initialization" for h in cb.dbg.get_causal_hypotheses())


def test_a_state_of_another_version_is_ignored_with_a_warning(tmp_path, caplog):
    cb = integration.NeuralDbgCallback()
    cb.load_state_dict({"version": 99, "session": {}})
    assert cb.resume_state is None
    assert any("not one this version reads" in r.getMessage() for r in warnings_of(caplog))
    assert cb.state_dict() == {}  # no run yet: nothing to keep


def test_a_step_scheduler_with_warm_up_is_read():
    from neuraldbg.causal.nodes.run import LR_PEAK
    from neuraldbg.causal.nodes.schedule import LR_FIRST, LR_WARMUP_STEPS

    class Warm(module_class(L)):
        def configure_optimizers(self):
            opt = optimizer(self.parameters(), self.lr)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    cb = integration.NeuralDbgCallback()
    trainer = L.Trainer(max_steps=STEPS, callbacks=[cb], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1,
                        num_sanity_val_steps=0)
    trainer.fit(Warm(LR), torch.utils.data.DataLoader(batches(STEPS), batch_size=None))
    sigs = cb.dbg.trace().signatures
    assert sigs.number(LR_FIRST) == pytest.approx(LR / 5) and sigs.number(LR_WARMUP_STEPS) == 4
    assert sigs.number(LR_PEAK) == pytest.approx(LR)
