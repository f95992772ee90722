"""The Trainer callback and the Trainer's own logging, against the real library: the diagnosis
in ``log_history`` and in what ``report_to`` integrations receive, TensorBoard scalars while the
run goes on, and a fix sentence that names the peak of a decayed schedule."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the transformers extra is not installed")
pytest.importorskip("accelerate", reason="the Trainer needs accelerate")

from neuraldbg.integrations import transformers as integration  # noqa: E402
from test_transformers_callback import Tiny, samples  # noqa: E402
from tiny_task import LR, LR_TOO_HIGH, STEPS, optimizer  # noqa: E402

P_HEALTHY = "neuraldbg/p_healthy"
LR_HIGH = "neuraldbg/hypothesis/learning_rate=too_high"


class Recorder(transformers.TrainerCallback):
    """A stand-in for a ``report_to`` integration: keeps every ``logs`` it is handed."""

    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs))


def trainer(tmp_path, callbacks, lr=LR * 1000, optimizers=None, schedule=lambda step: 1.0, steps=STEPS, **extra):
    model = Tiny()
    if optimizers is None:
        opt = optimizer(model.parameters(), lr)
        optimizers = (opt, torch.optim.lr_scheduler.LambdaLR(opt, schedule))
    kwargs = dict(output_dir=str(tmp_path / "out"), max_steps=steps, per_device_train_batch_size=32, use_cpu=True,
                  report_to=[], save_strategy="no", logging_strategy="steps", logging_steps=10, disable_tqdm=True,
                  seed=0)
    kwargs.update(extra)
    return transformers.Trainer(model=model, args=transformers.TrainingArguments(**kwargs),
                                train_dataset=samples(steps), optimizers=optimizers, callbacks=callbacks)


def test_log_history_and_every_integration_receive_the_diagnosis(tmp_path):
    recorder, cb = Recorder(), integration.NeuralDbgCallback()
    tr = trainer(tmp_path, [recorder, cb])  # an integration ahead of ours, as report_to puts them
    tr.train()
    history = [h for h in tr.state.log_history if "loss" in h]
    assert [h["step"] for h in history] == [10, 20, 30, 40, 50]
    # step 10 comes before the first statistics sync (16 checked steps); every later one has it
    assert P_HEALTHY not in history[0] and all(P_HEALTHY in h for h in history[1:])
    assert history[-1][LR_HIGH] > 0.5 > history[-1][P_HEALTHY]
    got = [g for g in recorder.logs if "loss" in g]
    assert [g.get(P_HEALTHY) for g in got] == [h.get(P_HEALTHY) for h in history]
    assert tr.callback_handler.callbacks[0] is cb  # it moved itself ahead of the integrations
    summary, final = tr.state.log_history[-2:]  # the train summary Trainer logs at the end, then ours
    assert "train_runtime" in summary and P_HEALTHY in summary
    assert set(final) == {P_HEALTHY, LR_HIGH, "step"} and final["step"] == STEPS
    assert final[P_HEALTHY] == cb.diagnosis.p_healthy
    assert recorder.logs[-1] == {k: v for k, v in final.items() if k != "step"}


def test_the_last_logged_entry_is_the_final_diagnosis(tmp_path):
    """Regression: the Trainer's last log (P(healthy) 0.92, the last sync's) disagreed with the
    verdict. Healthy until step 20, then a learning rate 1000x too high: the last sync of a
    30-step run (step 15) saw a healthy run, the verdict does not."""
    recorder, cb = Recorder(), integration.NeuralDbgCallback()
    tr = trainer(tmp_path, [recorder, cb], lr=LR, schedule=lambda step: 1.0 if step < 20 else 1000.0, steps=30)
    tr.train()
    ours = [h for h in tr.state.log_history if P_HEALTHY in h]
    assert [h["step"] for h in ours] == [20, 30, 30, 30]  # two logging steps, the summary, the final entry
    assert all(h[P_HEALTHY] > 0.5 for h in ours[:-1]) and cb.diagnosis.p_healthy < 0.5
    assert ours[-1][P_HEALTHY] == cb.diagnosis.p_healthy
    assert ours[-1][LR_HIGH] == cb.dbg.posterior()["learning_rate"]["too_high"] > 0.5
    # every integration got it too, last
    assert recorder.logs[-1][P_HEALTHY] == cb.diagnosis.p_healthy


def test_tensorboard_scalars_appear_during_training(tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    class ReadMidRun(transformers.TrainerCallback):
        seen = None

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 40 and self.seen is None:
                (tb,) = [c for c in tr.callback_handler.callbacks if type(c).__name__ == "TensorBoardCallback"]
                tb.tb_writer.flush()
                ea = EventAccumulator(tb.logging_dir, size_guidance={"scalars": 0})
                ea.Reload()
                self.seen = {t: [(s.step, s.value) for s in ea.Scalars(t)] for t in ea.Tags()["scalars"]}

    reader, cb = ReadMidRun(), integration.NeuralDbgCallback()
    tr = trainer(tmp_path, [cb, reader], report_to=["tensorboard"])
    tr.train()
    assert reader.seen is not None
    assert [s for s, _ in reader.seen[P_HEALTHY]] == [15, 31]  # each sync before step 40, under our tags
    assert reader.seen[LR_HIGH][-1][1] > 0.5
    # the logged numbers also reach the integration through logs (its own "train/" prefix)
    assert "train/" + P_HEALTHY in reader.seen
    # after the run, the last point of both is the verdict's, at the last step
    (tb,) = [c for c in tr.callback_handler.callbacks if type(c).__name__ == "TensorBoardCallback"]
    ea = EventAccumulator(tb.logging_dir, size_guidance={"scalars": 0})
    ea.Reload()
    for tag in (P_HEALTHY, "train/" + P_HEALTHY):
        last = ea.Scalars(tag)[-1]
        assert last.step == STEPS and last.value == pytest.approx(cb.diagnosis.p_healthy, rel=1e-6)


def test_the_fix_names_the_peak_of_a_decayed_schedule(tmp_path):
    """Learning rate 30 with the Trainer's default linear decay: the rate at the end is 0, the
    fix must start from the peak."""
    cb = integration.NeuralDbgCallback()
    trainer(tmp_path, [cb], optimizers=(None, None), learning_rate=30.0, lr_scheduler_type="linear",
            logging_strategy="no").train()
    top = cb.diagnosis.hypotheses[0]
    assert (top.cause, top.state) == ("learning_rate", "too_high")
    assert "(peak 30)" in top.suggested_fix and "currently 0" not in top.suggested_fix


def test_only_process_zero_logs_the_diagnosis(tmp_path, caplog, capsys):
    """A process other than the world's zero measures but says nothing above debug level, and
    prints nothing."""
    import logging

    class NotZero(transformers.TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            state.is_world_process_zero = False

    caplog.set_level(logging.DEBUG, logger="neuraldbg")
    cb = integration.NeuralDbgCallback()
    tr = trainer(tmp_path, [NotZero(), cb], logging_strategy="no")  # NotZero's on_train_begin runs first
    tr.train()
    assert cb.diagnosis.hypotheses[0].cause == "learning_rate"  # measured and diagnosed
    mine = [r for r in caplog.records if r.name == "neuraldbg" and LR_TOO_HIGH.search(r.getMessage())]
    assert mine and all(r.levelno == logging.DEBUG for r in mine)
    assert "neuraldbg: " not in capsys.readouterr().out


def test_two_processes_print_the_diagnosis_once_and_both_measure(tmp_path):
    """``torchrun`` with 2 CPU processes (gloo): the world's process zero logs the diagnosis,
    both measure and export their own session."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as sock:  # a free port on the loopback for the rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    here = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), str(here.parents[1])]), "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          "--master_addr", "127.0.0.1", "--master_port", str(port),
                          str(here / "transformers_ddp_script.py"), str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    assert res.stderr.count("neuraldbg: diagnosis (P(healthy)") == 1, res.stderr[-4000:]
    assert len(LR_TOO_HIGH.findall(res.stderr)) == 1
    # the verdict line, printed by process zero alone
    printed = [line for line in res.stdout.splitlines() if line.startswith("neuraldbg: ")]
    assert len(printed) == 1 and "; fix: " in printed[0], res.stdout[-4000:]
    sessions = sorted(p.name for p in tmp_path.glob("neuraldbg_session.rank*.json"))
    assert sessions == ["neuraldbg_session.rank0.json", "neuraldbg_session.rank1.json"]
