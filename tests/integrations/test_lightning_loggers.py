"""The Lightning callback and the trainer's own loggers, against the real library: the diagnosis
reaches a CSVLogger's file and TensorBoard while the run goes on, the session lands in the
versioned ``trainer.log_dir``, and a 2-rank DDP job prints the diagnosis once."""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

L = pytest.importorskip("lightning.pytorch", reason="the lightning extra is not installed")

from neuraldbg.integrations import lightning as integration  # noqa: E402
from neuraldbg.integrations.common import SESSION_FILE  # noqa: E402
from lightning_ddp_script import Tiny  # noqa: E402
from tiny_task import LR, LR_TOO_HIGH, STEPS, batches, optimizer  # noqa: E402

HERE = Path(__file__).resolve().parent
P_HEALTHY = "neuraldbg/p_healthy"
LR_HIGH = "neuraldbg/hypothesis/learning_rate=too_high"


def fit(lr, logger, callbacks):
    trainer = L.Trainer(max_steps=STEPS, callbacks=callbacks, logger=logger, log_every_n_steps=10,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu", devices=1, num_sanity_val_steps=0)
    trainer.fit(Tiny(lr), torch.utils.data.DataLoader(batches(STEPS), batch_size=None))
    return trainer


def test_csv_logger_gets_the_diagnosis_at_each_sync_and_the_session_goes_to_log_dir(tmp_path):
    cb = integration.NeuralDbgCallback(export=True, every=1)  # a sync every 16 steps
    logger = L.loggers.CSVLogger(str(tmp_path), name="runs")
    trainer = fit(LR * 1000, logger, [cb])
    log_dir = Path(trainer.log_dir)
    assert log_dir == tmp_path / "runs" / "version_0"
    with open(log_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {"train_loss", P_HEALTHY, LR_HIGH} <= set(rows[0])
    ours = [r for r in rows if r[P_HEALTHY]]
    # one row per statistics sync: every sync_every (16) checked steps, the step of the last one
    # synced; then the final diagnosis at the step the trainer reached
    assert [int(r["step"]) for r in ours] == [15, 31, 47, STEPS]
    assert float(ours[-1][LR_HIGH]) > 0.5 > float(ours[-1][P_HEALTHY])
    assert float(ours[-1][P_HEALTHY]) == cb.diagnosis.p_healthy
    assert cb.diagnosis.session_path == str(log_dir / SESSION_FILE)
    assert (log_dir / SESSION_FILE).is_file() and not (tmp_path / SESSION_FILE).exists()


class Blowup(Tiny):
    """Healthy until step 20, then a learning rate 1000x too high: the last sync (step 15) of a
    30-step fit saw a healthy run, the verdict does not."""

    def configure_optimizers(self):
        opt = optimizer(self.parameters(), self.lr)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 if step < 20 else 1000.0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def test_the_last_csv_row_is_the_final_diagnosis(tmp_path):
    """Regression: metrics.csv's one neuraldbg row (step 15, P(healthy) 0.93) was all a run
    diagnosed at P(healthy) 0.1 left in the logs."""
    cb = integration.NeuralDbgCallback()
    trainer = L.Trainer(max_steps=30, callbacks=[cb], logger=L.loggers.CSVLogger(str(tmp_path)), log_every_n_steps=10,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu", devices=1, num_sanity_val_steps=0)
    trainer.fit(Blowup(LR), torch.utils.data.DataLoader(batches(30), batch_size=None))
    with open(Path(trainer.log_dir) / "metrics.csv", newline="") as f:
        ours = [r for r in csv.DictReader(f) if r[P_HEALTHY]]
    assert [int(r["step"]) for r in ours] == [15, 30]
    assert float(ours[0][P_HEALTHY]) > 0.5 > cb.diagnosis.p_healthy  # the sync before the blow-up
    assert float(ours[-1][P_HEALTHY]) == cb.diagnosis.p_healthy
    assert float(ours[-1][LR_HIGH]) == cb.dbg.posterior()["learning_rate"]["too_high"] > 0.5


class ReadTensorBoardMidRun(L.Callback):
    """At step ``at`` (before the end), flush the trainer's writer and read its folder back."""

    def __init__(self, at):
        self.at, self.seen = at, None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.at and self.seen is None:
            from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

            trainer.logger.experiment.flush()
            ea = EventAccumulator(trainer.log_dir, size_guidance={"scalars": 0})
            ea.Reload()
            self.seen = {t: [(s.step, s.value) for s in ea.Scalars(t)] for t in ea.Tags()["scalars"]}


def test_tensorboard_scalars_appear_during_training_under_the_to_tensorboard_tags(tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    cb, reader = integration.NeuralDbgCallback(), ReadTensorBoardMidRun(at=40)
    trainer = fit(LR * 1000, L.loggers.TensorBoardLogger(str(tmp_path)), [cb, reader])
    assert reader.seen is not None, "the reader never ran"
    assert [s for s, _ in reader.seen[P_HEALTHY]] == [15, 31]  # the two syncs before step 40
    assert LR_HIGH in reader.seen and reader.seen[LR_HIGH][-1][1] > 0.5
    # after the fit, the last point is the verdict's, at the step the trainer reached
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(trainer.log_dir, size_guidance={"scalars": 0})
    ea.Reload()
    last = ea.Scalars(P_HEALTHY)[-1]
    assert last.step == STEPS and last.value == pytest.approx(cb.diagnosis.p_healthy, rel=1e-6)


def test_no_logger_no_metrics_and_export_goes_to_default_root_dir(tmp_path):
    cb = integration.NeuralDbgCallback(export=True)
    trainer = L.Trainer(max_steps=5, callbacks=[cb], logger=False, default_root_dir=str(tmp_path),
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Tiny(LR), torch.utils.data.DataLoader(batches(5), batch_size=None))
    assert cb.diagnosis.session_path == str(tmp_path / SESSION_FILE)


def test_two_ddp_ranks_print_the_diagnosis_once_and_both_measure(tmp_path):
    """Lightning DDP on CPU (gloo), launched the way Lightning launches it: the script runs
    again for rank 1. The diagnosis goes to stderr through a handler the script sets up."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parents[1])]),
           "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, str(HERE / "lightning_ddp_script.py"), str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    err = res.stderr
    assert err.count("neuraldbg: diagnosis (P(healthy)") == 1, err[-4000:]
    # the verdict line, printed by rank 0 alone
    printed = [line for line in res.stdout.splitlines() if line.startswith("neuraldbg: ")]
    assert len(printed) == 1 and "; fix: " in printed[0], res.stdout[-4000:]
    assert len(LR_TOO_HIGH.findall(err)) == 1
    # both ranks measured and exported their own session, next to the versioned logs
    sessions = sorted(p.name for p in tmp_path.rglob("neuraldbg_session.rank*.json"))
    assert sessions == ["neuraldbg_session.rank0.json", "neuraldbg_session.rank1.json"]
