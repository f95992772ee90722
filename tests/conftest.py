import pytest
import torch


def pytest_configure(config):
    # CI has 2 cores shared by the suite; one thread keeps timings stable and tests fast
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def deterministic_cadence(monkeypatch):
    """The default cadence (``every="auto"``) picks its interval from the run's own step times,
    so a test that trains past its dense start would read other steps on a slower machine. Every
    test's monitor times its steps on a clock that reads the step being started instead (one
    millisecond per step, no time in host transfers): a check then costs nothing extra and the interval is 1 after the
    dense start and the probe -- the same steps on every machine. ``tests/monitor/test_cadence.py``
    drives the schedule with clocks of its own (set after this one), and the benchmark measures
    the real one."""
    from neuraldbg.monitor import cadence, transfer

    starting = [0]
    start = cadence.AutoSchedule.start

    def noting_start(self, step):
        starting[0] = step
        return start(self, step)

    monkeypatch.setattr(cadence.AutoSchedule, "start", noting_start)
    monkeypatch.setattr(cadence, "perf_counter", lambda: starting[0] * 1e-3)
    # the host transfers' time, which the cadence counts apart, is real time: none on this clock
    monkeypatch.setattr(transfer, "perf_counter", lambda: 0.0)
