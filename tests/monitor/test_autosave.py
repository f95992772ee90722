"""Autosave: the session on disk while training runs; a killed run keeps its diagnosis."""
import logging
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from neuraldbg import NeuralDbg, load_session
from neuraldbg.monitor.autosave import Autosave
from tests.tiny import batches, run

ROOT = Path(__file__).resolve().parents[2]


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def train(model, dbg=None, steps=30, on_step=None):
    return run(model, steps=steps, lr=0.1, data=batches(steps, n=8, seed=1), dbg=dbg, on_step=on_step).optimizer


def addon(dbg) -> Autosave:
    return dbg.addon(Autosave)


def test_every_checked_step_with_interval_0_and_the_final_file_matches_the_export(tmp_path):
    path = tmp_path / "auto" / "run.json"  # missing folders are created
    seen = []
    m = mlp()
    with NeuralDbg(m, autosave=path, autosave_interval=0) as dbg:
        assert load_session(path).trace().loss.n == 0  # written on entry
        train(m, dbg, steps=20, on_step=lambda s: (addon(dbg)._writer.wait(), seen.append(
            load_session(path).trace().last_step)))
    assert seen == sorted(seen) and seen[-1] >= 18 and len(set(seen)) >= 15  # saves follow training
    s = load_session(path)
    assert s.events == dbg.events and s.trace().loss == dbg.trace().loss and s.trace().last_step == 19
    assert s.priors.fingerprint == dbg.priors.fingerprint
    assert not addon(dbg)._writer._thread  # the writer thread is gone after exit
    assert not list(path.parent.glob(".*.tmp"))


def test_the_interval_bounds_the_number_of_saves(tmp_path):
    m = mlp()
    with NeuralDbg(m, autosave=tmp_path / "run.json", autosave_interval=3600) as dbg:
        train(m, dbg, steps=30)
    assert addon(dbg).saves == 2  # on entry and on exit
    m = mlp()
    with NeuralDbg(m, every=5, autosave=tmp_path / "run2.json", autosave_interval=0) as dbg:
        train(m, dbg, steps=30, on_step=lambda s: addon(dbg)._writer.wait())
    assert addon(dbg).saves == 2 + 6  # entry, exit, and checked steps 0, 5, ..., 25 only


def test_saved_on_exit_when_the_loop_raises(tmp_path):
    def fail_at_11(exc):
        def on_step(step):
            if step == 11:
                raise exc
        return on_step

    for exc in (RuntimeError("loop failed"), KeyboardInterrupt()):
        path = tmp_path / f"{type(exc).__name__}.json"
        m = mlp()
        with pytest.raises(type(exc)):
            with NeuralDbg(m, autosave=path, autosave_interval=3600) as dbg:
                train(m, dbg, steps=30, on_step=fail_at_11(exc))
        tr = load_session(path).trace()
        assert tr.loss.n == 12 and tr.last_step == 11


def test_training_is_bitwise_identical_with_autosave(tmp_path):
    ref = mlp()
    train(ref, None, steps=25)
    m = mlp()
    with NeuralDbg(m, autosave=tmp_path / "run.json", autosave_interval=0) as dbg:
        train(m, dbg, steps=25)
    for a, b in zip(ref.parameters(), m.parameters()):
        assert torch.equal(a, b)


def test_a_slow_disk_coalesces_saves_instead_of_slowing_training(tmp_path, monkeypatch):
    import neuraldbg.jsonio as J

    real = J.write_json_atomic
    gate = threading.Event()

    def slow(*a, **k):
        gate.wait(5)
        return real(*a, **k)

    m = mlp()
    dbg = NeuralDbg(m, autosave=tmp_path / "run.json", autosave_interval=0)
    with dbg:
        monkeypatch.setattr(J, "write_json_atomic", slow)  # after the entry save
        t0 = time.perf_counter()
        train(m, dbg, steps=30)
        assert time.perf_counter() - t0 < 4  # training never waited for the disk
        assert addon(dbg).saves <= 3  # entry, one in flight; the rest coalesced
        gate.set()
    assert load_session(tmp_path / "run.json").trace().last_step == 29


def test_a_failing_disk_is_logged_once_and_never_raises(tmp_path, caplog):
    path = tmp_path / "run.json"
    m = mlp()
    with caplog.at_level(logging.WARNING, logger="neuraldbg"):
        with NeuralDbg(m, autosave=path, autosave_interval=0) as dbg:
            path.unlink()
            path.mkdir()  # os.replace onto a directory fails from now on
            train(m, dbg, steps=10)
    assert caplog.text.count("autosave to") == 1 and dbg.trace().loss.n == 10


@pytest.mark.parametrize("autosave,interval,exc,message", [
    (3, 30.0, TypeError, "autosave must be a file path"),
    ("x.json", -1, ValueError, "autosave_interval must be"),
    ("x.json", float("nan"), ValueError, "autosave_interval must be"),
    ("x.json", "30", ValueError, "autosave_interval must be"),
    ("x.json", True, ValueError, "autosave_interval must be"),
    ("", 30.0, ValueError, "is a directory"),
    ("a_file/run.json", 30.0, ValueError, "a_file is not a directory"),
])
def test_bad_autosave_arguments_fail_at_construction(tmp_path, autosave, interval, exc, message):
    (tmp_path / "a_file").write_text("")
    target = tmp_path / autosave if isinstance(autosave, str) else autosave
    with pytest.raises(exc, match=message):
        NeuralDbg(mlp(), autosave=target, autosave_interval=interval)


def test_saved_files_follow_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        m = mlp()
        with NeuralDbg(m, autosave=tmp_path / "run.json", autosave_interval=0) as dbg:
            train(m, dbg, steps=3)
        dbg.export_aquarium_package(tmp_path / "export.json")
    finally:
        os.umask(old)
    assert (tmp_path / "run.json").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "export.json").stat().st_mode & 0o777 == 0o640


# ---- a run killed at random times ---------------------------------------------------------------

CHILD = textwrap.dedent("""
    import logging, sys, threading
    import torch
    from torch import nn
    from torch.nn import functional as F
    from neuraldbg import NeuralDbg

    lock = threading.Lock()

    def say(line):  # whole lines: the writer thread reports too
        with lock:
            sys.stdout.write(line + "\\n")
            sys.stdout.flush()

    class Saved(logging.Handler):  # the autosave writer logs each completed save
        def emit(self, record):
            msg = record.getMessage()
            if "autosaved" in msg:
                say("saved " + msg.rsplit(" ", 1)[1])

    log = logging.getLogger("neuraldbg")
    log.setLevel(logging.DEBUG)
    log.addHandler(Saved())
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with NeuralDbg(model, optimizer=opt, autosave=sys.argv[1], autosave_interval=0) as dbg:
        say("start")
        for step in range(100000):
            x = torch.randn(32, 32)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), x[:, :4].argmax(1))
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
            say(f"step {step}")
""")


@pytest.mark.slow
def test_sigkill_at_random_times_leaves_a_loadable_session_up_to_the_last_save(tmp_path):
    rng = random.Random(17)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    results = []
    for i in range(20):
        path = tmp_path / f"run{i}.json"
        proc = subprocess.Popen([sys.executable, str(script), str(path)], stdout=subprocess.PIPE, text=True,
                                env=env, cwd=tmp_path)
        head = [proc.stdout.readline().strip() for _ in range(2)]
        assert head == ["saved 0", "start"]  # the entry save is on disk before the loop starts
        time.sleep(rng.uniform(0.0, 1.5))
        os.kill(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        assert proc.returncode == -signal.SIGKILL
        saved = [0] + [int(ln.split()[1]) for ln in out.splitlines() if ln.startswith("saved")]
        steps = [int(ln.split()[1]) for ln in out.splitlines() if ln.startswith("step")]
        s = load_session(path)  # loads every time
        tr = s.trace()
        # the file holds the steps up to its save: every loss of steps 0..last_step, in order
        assert tr.loss.n == (tr.last_step + 1 if tr.loss.n else 0)
        assert tr.last_step >= saved[-1]  # at least the last save reported complete
        assert tr.last_step <= (steps[-1] if steps else 0) + 1
        s.posterior()
        results.append((tr.loss.n, saved[-1], steps[-1] if steps else None))
    assert sum(1 for n, _, _ in results if n > 0) >= 10  # most kills landed mid-training
    print("kills (steps in file, last reported save, last step printed):", results)
