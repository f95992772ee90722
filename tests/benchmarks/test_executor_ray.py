"""``run --executor ray`` on a local Ray of two CPUs against the process pool, on the same zoo runs:
the same records (timings aside) and sessions, resumable, and read alike by the prior fitter.

Slow (a Ray start takes seconds and spawns its daemons); needs the ``bench-ray`` extra:
``pip install -e '.[bench-ray]' && pytest -m slow tests/benchmarks/test_executor_ray.py``.
"""
from __future__ import annotations

import json
import os

import pandas as pd
import pytest

pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[bench-ray]'")

from benchmarks import executors as X  # noqa: E402
from benchmarks import harness as H  # noqa: E402
from benchmarks.__main__ import main as cli  # noqa: E402
from neuraldbg.fit.cases import inputs_hash, load_runs  # noqa: E402

pytestmark = pytest.mark.slow

RUN = ["run", "--arch", "mlp", "--quick", "--workers", "2", "--no-progress"]
#: Columns that measure time, the only ones allowed to differ between two executions.
TIMING = {"seconds", "seconds_bare", "harness_seconds"}


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    root = tmp_path_factory.mktemp("executors")
    for executor in ("ray", "pool"):
        assert cli([*RUN, "--executor", executor, "--out", str(root / executor)]) == 0
    return root / "ray", root / "pool"


def _csv(folder):
    return pd.read_csv(folder / "records.csv", keep_default_na=False)


def test_ray_records_equal_the_pools(both):
    ray, pool = both
    a, b = _csv(ray), _csv(pool)
    assert len(a) == 11 and (a["error"] == "").all(), a.loc[a["error"] != "", ["key", "error"]].to_string()
    assert list(a.columns) == list(b.columns) and list(a["key"]) == list(b["key"])
    diagnosis = [c for c in a.columns if c.startswith(("pred_", "post_"))] + ["p_healthy", "onset_step",
                                                                              "origin_layer"]
    assert len(diagnosis) > 15
    assert a[diagnosis].equals(b[diagnosis])
    assert [c for c in a.columns if not a[c].equals(b[c])] == [c for c in a.columns if c in TIMING]
    for key, session in zip(a["key"], a["session"]):
        assert session == f"sessions/{key}.json"
        assert json.loads((ray / session).read_text()) == json.loads((pool / session).read_text())
    meta = json.loads((ray / "run_meta.json").read_text())
    assert meta["history"][0]["executor"] == "local ray of 2 CPUs"


def test_ray_resume_skips_recorded_runs_and_retries_errors(both):
    ray, _ = both
    mtimes = {p: p.stat().st_mtime_ns for p in (ray / "records").glob("*.json")}
    assert cli([*RUN, "--executor", "ray", "--out", str(ray)]) == 0
    assert {p: p.stat().st_mtime_ns for p in (ray / "records").glob("*.json")} == mtimes
    # an errored record is run again on resume, and kept with --no-retry-errors
    path = ray / "records" / "mlp__data_nan__0.json"
    rec = H.read_record(path)
    H.store_run(ray, {**rec, "error": "RuntimeError: planted"}, None)
    assert cli([*RUN, "--executor", "ray", "--no-retry-errors", "--out", str(ray)]) == 0
    assert H.read_record(path)["error"] == "RuntimeError: planted"
    assert cli([*RUN, "--executor", "ray", "--out", str(ray)]) == 0
    again = H.read_record(path)
    assert again["error"] == "" and again["pred_cause"] == rec["pred_cause"] == "data"
    assert {p: p.stat().st_mtime_ns for p in (ray / "records").glob("*.json") if p != path} == \
        {p: t for p, t in mtimes.items() if p != path}


def test_prior_fitting_reads_a_ray_folder_as_a_pool_folder(both, tmp_path):
    from neuraldbg import cli as ndbg

    ray, pool = both
    runs = load_runs(ray)
    assert len(runs) == 11 and inputs_hash(runs) == inputs_hash(load_runs(pool))
    fitted = []
    for folder in (ray, pool):
        out = tmp_path / f"{folder.name}.json"
        assert ndbg.main(["tune-priors", "--family", "mlp", "--runs", str(folder), "--out", str(out),
                          "--folds", "0"]) == 0
        fitted.append(json.loads(out.read_text()))
    assert fitted[0]["provenance"]["fitted_on"]["sha256"] == fitted[1]["provenance"]["fitted_on"]["sha256"]
    assert fitted[0]["cpds"] == fitted[1]["cpds"]


def test_local_ray_is_new_and_its_tasks_run_at_the_priority_of_pool_workers(monkeypatch):
    import ray

    # without --address a Ray of its own is started, never the cluster RAY_ADDRESS names
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    assert X.RayExecutor(2, None)._connect(ray)  # started here, so shut down here
    try:
        def niceness():  # os.nice(0) reads it; Ray's own default for task workers is 15
            return os.nice(0)

        assert ray.get(ray.remote(num_cpus=1)(niceness).remote()) == os.nice(0)
    finally:
        ray.shutdown()
    assert X.NICENESS_ENV not in os.environ
