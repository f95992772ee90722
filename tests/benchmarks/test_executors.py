"""Executor dispatch and argument checks, and the Ray driver loop against an in-process stand-in
for ``ray`` (no Ray needed; test_executor_ray.py runs a real one)."""
from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest

from benchmarks import executors as X
from benchmarks import harness as H
from benchmarks.__main__ import main as cli


def test_dispatch_by_name_and_workers():
    assert isinstance(X.make_executor("pool", 0), X.InlineExecutor)  # --workers 0: in-process, as before
    assert isinstance(X.make_executor("inline"), X.InlineExecutor)
    pool = X.make_executor("pool", None)
    assert isinstance(pool, X.PoolExecutor) and pool.workers == X.usable_cores()
    assert X.make_executor("pool", 3).workers == 3


@pytest.mark.parametrize("kwargs, message", [
    ({"name": "dask"}, "unknown executor 'dask'; valid: pool, ray, inline"),
    ({"name": "pool", "address": "auto"}, "--address is the Ray cluster to run on; it needs --executor ray"),
    ({"name": "pool", "workers": -1}, "--workers must be >= 0, got -1"),
    ({"name": "inline", "workers": 2}, "--workers 2 needs --executor pool or ray"),
    ({"name": "ray", "workers": 0}, "with --executor ray give --workers N >= 1"),
])
def test_bad_combinations_name_what_is_valid(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        X.make_executor(**kwargs)


def test_cli_rejects_unknown_executor(fake_zoo, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cli(["run", "--executor", "dask", "--out", str(tmp_path / "o")])
    assert exc.value.code == 2
    assert "invalid choice: 'dask' (choose from 'pool', 'ray', 'inline')" in capsys.readouterr().err


def test_cli_address_without_ray_executor(fake_zoo, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cli(["run", "--address", "auto", "--out", str(tmp_path / "o")])
    assert exc.value.code == 2
    assert "--address is the Ray cluster to run on; it needs --executor ray, not 'pool'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_cli_ray_without_ray_installed_says_what_to_install(fake_zoo, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    for extra in ([], ["--address", "auto"]):
        with pytest.raises(SystemExit) as exc:
            cli(["run", "--executor", "ray", *extra, "--out", str(tmp_path / "o")])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert "--executor ray needs Ray, which is not installed: pip install -e '.[bench-ray]'" in err
    assert not (tmp_path / "o").exists()  # nothing planned or written


def test_detached_run_leaves_the_files_run_one_leaves(fake_zoo, tmp_path):
    spec = H.RunSpec("toy_a", "data_nan", 1, time_bare=True)
    rec = H.run_one(spec, tmp_path / "local")
    drec, session = H.run_detached(spec)
    H.store_run(tmp_path / "driver", drec, session)
    for folder in ("local", "driver"):
        assert sorted(p.relative_to(tmp_path / folder).as_posix() for p in (tmp_path / folder).rglob("*.json")) == [
            "records/toy_a__data_nan__1.json", "sessions/toy_a__data_nan__1.json"]
    assert (tmp_path / "driver" / drec["session"]).read_text() == (tmp_path / "local" / rec["session"]).read_text()
    a = json.loads((tmp_path / "local/records/toy_a__data_nan__1.json").read_text())
    b = json.loads((tmp_path / "driver/records/toy_a__data_nan__1.json").read_text())
    assert a.pop("harness_seconds") > 0 and b.pop("harness_seconds") > 0
    assert a == b
    # a run that fails before exporting returns no session, and its record still lands
    brec, bsession = H.run_detached(H.RunSpec("toy_a", "broken", 0))
    assert bsession is None and brec["error"].startswith("RuntimeError: injected harness failure")
    H.store_run(tmp_path / "driver", brec, bsession)
    assert H.read_record(tmp_path / "driver/records/toy_a__broken__0.json")["error"] == brec["error"]


class Ref:
    """An object ref: the task and its argument (hashable by identity, as Ray's are by id)."""

    def __init__(self, fn, spec):
        self.fn, self.spec = fn, spec


class FakeRay:
    """The part of the ``ray`` API the executor uses, run in this process when ``get`` is called."""

    class Crash(Exception):
        pass

    def __init__(self, crash: set[str] = frozenset()):
        self.crash, self.inits, self.shutdowns, self.in_flight, self.peak = crash, [], 0, 0, 0
        self.submitted: list[str] = []
        self._up = False

    def is_initialized(self):
        return self._up

    def init(self, **kwargs):
        self._up = True
        self.inits.append(kwargs)

    def shutdown(self):
        self._up = False
        self.shutdowns += 1

    def remote(self, **options):
        assert options == {"num_cpus": 1, "max_retries": X.RAY_TASK_RETRIES}

        def wrap(fn):
            def submit(spec):
                self.submitted.append(spec.key)
                self.in_flight += 1
                self.peak = max(self.peak, self.in_flight)
                return Ref(fn, spec)
            return SimpleNamespace(remote=submit)
        return wrap

    def wait(self, refs, num_returns):
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        self.in_flight -= 1
        if ref.spec.key in self.crash:
            raise self.Crash("worker died")
        return ref.fn(ref.spec)

    def cancel(self, ref):
        pass


def test_ray_driver_writes_every_record_and_session(fake_zoo, tmp_path, monkeypatch):
    fake = FakeRay(crash={"toy_b__healthy__0"})
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setattr(H, "init_worker", lambda: None)  # not in the test process
    specs = H.plan(fake_zoo, injections=["healthy", "data_nan", "broken"], seeds=1, healthy_seeds=1)
    df = H.run_suite(specs, tmp_path / "ray", workers=2, progress=False, executor="ray")
    assert fake.inits == [{"runtime_env": fake.inits[0]["runtime_env"], "logging_level": 30,
                           "include_dashboard": False, "address": "local", "num_cpus": 2}]
    assert [m.__name__ for m in fake.inits[0]["runtime_env"]["py_modules"]] == ["neuraldbg", "benchmarks", "models"]
    assert fake.shutdowns == 1 and fake.peak <= 2 and len(fake.submitted) == len(specs) == 6
    ref = H.run_suite(specs, tmp_path / "inline", progress=False, executor="inline")
    errors = dict(zip(df["key"], df["error"]))
    assert errors.pop("toy_b__healthy__0") == "Crash: worker died"  # a lost worker: an error record
    assert errors == {k: e for k, e in zip(ref["key"], ref["error"]) if k != "toy_b__healthy__0"}
    assert errors["toy_a__broken__0"].startswith("RuntimeError: injected harness failure")
    for key in ("toy_a__data_nan__0", "toy_a__healthy__0"):
        assert (tmp_path / "ray/sessions" / f"{key}.json").read_text() == \
            (tmp_path / "inline/sessions" / f"{key}.json").read_text()
    cols = ["pred_cause", "pred_state", "pred_prob", "p_healthy", "origin_layer", "onset_step"]
    ok = df["key"] != "toy_b__healthy__0"
    assert df.loc[ok, cols].equals(ref.loc[ok, cols])

    # resume: nothing left without retries (Ray is not even started), then only the errored runs
    H.run_suite(specs, tmp_path / "ray", workers=2, progress=False, executor="ray", retry_errors=False)
    assert len(fake.inits) == 1
    fake.crash, fake.submitted = set(), []
    H.run_suite(specs, tmp_path / "ray", workers=2, progress=False, executor="ray")
    assert sorted(fake.submitted) == ["toy_a__broken__0", "toy_b__broken__0", "toy_b__healthy__0"]
    assert H.read_record(tmp_path / "ray/records/toy_b__healthy__0.json")["error"] == ""


def test_ray_on_a_cluster_joins_the_address(fake_zoo, tmp_path, monkeypatch):
    fake = FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setattr(H, "init_worker", lambda: None)
    specs = H.plan(fake_zoo, archs=["toy_a"], injections=["healthy"], seeds=1, healthy_seeds=3)
    H.run_suite(specs, tmp_path, progress=False, executor="ray", address="head:6379")
    assert fake.inits[0]["address"] == "head:6379" and "num_cpus" not in fake.inits[0]
    assert fake.peak == 3  # no --workers: every run submitted, the cluster schedules them

    def refuse(**kwargs):
        raise ConnectionError("could not reach GCS")

    monkeypatch.setattr(fake, "init", refuse)
    (tmp_path / "records").joinpath("toy_a__healthy__0.json").unlink()
    with pytest.raises(X.ExecutorError, match=r"no Ray cluster at 'head:6379' \(could not reach GCS\); start one "
                                              r"with `ray start --head`"):
        H.run_suite(specs, tmp_path, progress=False, executor="ray", address="head:6379")
