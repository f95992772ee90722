"""FSDP2 (``fully_shard``): sharded parameters are measured, and the ranks' traces are merged live.

Two gloo ranks on CPU run tests/distributed/fsdp_script.py: under ``torchrun`` three scenarios in
one process group (healthy, learning rate far too high, a NaN batch on rank 1), and, launched
rank by rank, a run whose rank 1 SIGKILLs itself after an autosave. The ranks' stderr is kept in
the test's folder and shown when a run fails.
"""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from neuraldbg import load_session, merge_sessions

pytest.importorskip("torch.distributed.fsdp")
if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
    pytest.skip("needs torch.distributed with gloo", allow_module_level=True)
try:
    from torch.distributed.fsdp import fully_shard  # noqa: F401
except ImportError:  # pragma: no cover - torch before FSDP2
    pytest.skip("needs FSDP2 (torch.distributed.fsdp.fully_shard)", allow_module_level=True)

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
from fsdp_script import NAN_STEP, SCENARIOS  # noqa: E402

MERGE_TIMEOUT = 3.0  # the kill mode's merge_timeout (fsdp_script.py)


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _result(out: Path, name: str, rank: int) -> dict:
    return json.loads((out / f"{name}_result{rank}.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          "--master_port", str(_free_port()), str(HERE / "fsdp_script.py"), str(out), "scenarios"],
                         env=_env(), cwd=str(ROOT), capture_output=True, text=True, timeout=600)
    (out / "stderr.log").write_text(res.stderr)
    assert res.returncode == 0, res.stderr[-4000:]
    return out, res.stderr


def test_sharded_parameters_are_measured_and_training_is_bitwise_unchanged(runs):
    out, _ = runs
    for r in range(2):
        res = _result(out, "healthy", r)
        assert res["sharded"] and res["bitwise"]  # every parameter a DTensor; shards torch.equal
        sigs = load_session(out / f"healthy_rank{r}.json").trace().signatures.as_dict()
        assert sigs["unsupported_params"] == 0  # DTensor shards are read, not left out
        assert sigs["grad_steps"] > 0 and sigs["step_ratio_steps"] > 0 and sigs["init_scale_n"] == 3
        assert sigs["loop_checked"] > 0 and sigs["orphan_params"] == 0 and sigs["detached_params"] == 0


def test_no_internal_error_on_any_rank(runs):
    out, stderr = runs
    for name in SCENARIOS:
        for r in range(2):
            assert _result(out, name, r)["internal_errors"] == 0
            assert load_session(out / f"{name}_rank{r}.json").trace().internal_errors == 0
        assert _result(out, name, 0)["coverage_internal_errors"] == 0
    assert "internal error" not in stderr


def test_healthy_run_stays_quiet(runs):
    out, _ = runs
    res = _result(out, "healthy", 0)
    assert res["p_healthy"] >= 0.5, res


def test_learning_rate_too_high_is_named(runs):
    out, _ = runs
    res = _result(out, "lr_high", 0)
    assert res["hypotheses"] and res["hypotheses"][0][:2] == ["learning_rate", "too_high"], res
    assert res["p_healthy"] < 0.5


def test_nan_batch_on_rank_1_names_the_rank_and_the_layer(runs):
    out, _ = runs
    res = _result(out, "nan_rank1", 0)
    cause, state, onset, layer, rank = res["hypotheses"][0]
    assert (cause, state, onset, layer, rank) == ("data", "corrupted", NAN_STEP, "0", 1), res


def test_rank_0_answers_for_the_job_as_the_merge_of_the_per_rank_files(runs):
    out, _ = runs
    for name in SCENARIOS:
        res = _result(out, name, 0)
        assert res["merged"] and not _result(out, name, 1)["merged"]  # gathered on rank 0
        files = merge_sessions([out / f"{name}_rank{r}.json" for r in range(2)])
        live = load_session(out / f"{name}_live.json")
        assert live.trace().signatures.as_dict()["merged_ranks"] == (0, 1)
        key = lambda evs: [(e.type, e.kind, e.layer, e.step, e.end_step, e.count, e.rank) for e in evs]  # noqa: E731
        assert key(live.events) == key(files.events)
        assert files.posterior().p_healthy == pytest.approx(res["p_healthy"], rel=1e-9)
        assert [[h.cause, h.state, h.onset_step, h.origin_layer, h.origin_rank]
                for h in files.get_causal_hypotheses()] == res["hypotheses"]


def test_a_killed_rank_does_not_hang_the_merge_and_is_named_unobserved(tmp_path):
    env = _env()
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2")
    procs = []
    for r in range(2):
        err = open(tmp_path / f"stderr{r}.log", "w")
        procs.append((subprocess.Popen([sys.executable, str(HERE / "fsdp_script.py"), str(tmp_path), "kill"],
                                       env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, cwd=str(ROOT),
                                       stdout=subprocess.DEVNULL, stderr=err), err))
    try:
        codes = [p.wait(timeout=300) for p, _ in procs]
    finally:
        for p, err in procs:
            if p.poll() is None:
                p.kill()
            err.close()
    logs = "\n".join((tmp_path / f"stderr{r}.log").read_text()[-2000:] for r in range(2))
    assert codes == [0, -9], logs  # rank 1 killed itself; rank 0 finished
    res = _result(tmp_path, "kill", 0)
    assert res["error"], res  # its loop saw rank 1 go (the next collective failed)
    assert res["exit_seconds"] < MERGE_TIMEOUT + 10, res  # bounded: the merge's wait, not a hang
    last = load_session(tmp_path / "kill_rank1.json").trace().last_step  # rank 1's last autosave
    assert res["unobserved_ranks"].startswith(f"rank 1 from step {last} on"), res
    assert "unobserved: rank 1" in res["coverage"]
    assert res["internal_errors"] == 0
    assert "no trace from rank 1" in (tmp_path / "stderr0.log").read_text()
