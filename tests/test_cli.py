"""``neuraldbg explain SESSION.json``: offline ranked hypotheses and chains of an exported run."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from neuraldbg import cli
from neuraldbg.cli import explain as explain_command
from neuraldbg.events.base import DATA, GRADIENT, OPTIMIZER, make_event
from neuraldbg.session import export_trace
from neuraldbg.trace import Trace
from tests.traces import loss_summary, small_layers

ROOT = Path(__file__).resolve().parents[1]


def nan_session(tmp_path) -> str:
    ev = (make_event(DATA, "nan", "fc1", 30, 6.0, {"at_input": 1.0}, end_step=59),
          make_event(OPTIMIZER, "divergence", None, 30, 6.0, {"nonfinite": 1.0}, end_step=59))
    losses = [0.7 * 0.97 ** i for i in range(30)] + [float("nan")] * 30
    tr = Trace(events=ev, layers=small_layers(), family="mlp", first_step=0, last_step=59, loss=loss_summary(losses))
    return export_trace(tr, tmp_path / "nan.json")


def shift_session(tmp_path) -> str:
    """Inputs x1000 from step 30: a shift at the input, a loss spike and exploding gradients."""
    ev = (make_event(GRADIENT, "exploding", "fc1", 30, 6.0, {"grad_rms": 6.5}, end_step=33),
          make_event(GRADIENT, "exploding", "fc2", 30, 6.0, {"grad_rms": 11.0}, end_step=33),
          make_event(OPTIMIZER, "spike", None, 30, 27.0, {"robust_z": 27.0}, end_step=33),
          make_event(DATA, "shift", "fc1", 30, 25.0, {"scale_ratio": 982.0}, end_step=59))
    losses = [0.7 * 0.97 ** i for i in range(30)] + [30.0 - 0.1 * i for i in range(30)]
    tr = Trace(events=ev, layers=small_layers(), family="mlp", first_step=0, last_step=59, loss=loss_summary(losses))
    return export_trace(tr, tmp_path / "shift.json")



def healthy_session(tmp_path) -> str:
    tr = Trace(events=(), layers=small_layers(), family="cnn", first_step=0, last_step=59,
               loss=loss_summary([0.7 * 0.97 ** i for i in range(60)]))
    return export_trace(tr, tmp_path / "ok.json")


def test_explain_prints_ranked_hypotheses_and_chain(tmp_path, capsys):
    assert cli.main(["explain", shift_session(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"data shifted \(p = (0\.9\d|1\.00)\)", out) and "first seen in layer `fc1` at step 30." in out
    assert "fix: Normalize inputs" in out
    assert re.search(r"exploding_gradients: data shifted \(p = (0\.9\d|1\.00)\)", out)
    assert "-> shift in fc1 at step 30" in out
    assert "P(healthy) = 0.0" in out and "Posterior:" in out


def test_explain_nan_batch_session(tmp_path, capsys):
    assert cli.main(["explain", nan_session(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "data corrupted (p = 1.00): data anomaly first seen in layer `fc1` at step 30." in out
    assert "fix: Drop or repair the NaN/Inf batch at step 30" in out
    assert "data_anomaly: data corrupted (p = 1.00) -> nan in fc1 at step 30" in out
    assert re.search(r"P\(healthy\) = 0\.00\d: not healthy", out) and "Posterior:" in out


def test_explain_healthy_session_reports_nothing(tmp_path, capsys):
    assert cli.main(["explain", healthy_session(tmp_path), "--couplings", "--evidence"]) == 0
    out = capsys.readouterr().out
    assert "No hypothesis above the reporting floor (0.20)." in out
    assert re.search(r"P\(healthy\) = 0\.\d+: healthy\n", out)
    assert "family cnn" in out and "No coupled failures." in out
    assert "loss_pattern  decreasing" in out


def test_explain_json(tmp_path, capsys):
    assert cli.main(["explain", shift_session(tmp_path), "--json", "--evidence"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["hypotheses"][0]["cause"] == "data" and doc["hypotheses"][0]["onset_step"] == 30
    assert doc["healthy"] is False and doc["p_healthy"] < 0.5
    assert doc["evidence"]["data_shift"] == "input"
    assert set(doc["posterior"]) == {"learning_rate", "initialization", "data", "architecture", "training_loop",
                                     "numerics", "unexplained"}
    assert doc["chains"][0]["first_layer"] == "fc1"


def test_explain_several_sessions_and_failure_type(tmp_path, capsys):
    a, b = shift_session(tmp_path), healthy_session(tmp_path)
    assert cli.main(["explain", a, b, "-f", "exploding_gradients", "--json"]) == 0
    docs = json.loads(capsys.readouterr().out)
    assert len(docs) == 2
    assert docs[0]["hypotheses"][0]["cause"] == "data"
    assert {h["failure_type"] for h in docs[0]["hypotheses"]} == {"exploding_gradients"}
    assert docs[1]["hypotheses"] == [] and "no exploding_gradients event" in docs[1]["chains"][0]["reason"]


def test_explain_with_family_and_priors_overrides(tmp_path, capsys):
    from neuraldbg.causal.priors import load_priors

    doc = load_priors("rnn").to_dict()
    pri = tmp_path / "tuned.json"
    pri.write_text(json.dumps(doc))
    s = shift_session(tmp_path)
    assert cli.main(["explain", s, "--priors", str(pri)]) == 0
    assert f"priors {pri}" in capsys.readouterr().out
    assert cli.main(["explain", s, "--family", "gan"]) == 0
    assert "priors gan (shipped)" in capsys.readouterr().out


@pytest.mark.parametrize("args,message", [
    (["explain", "/no/such/session.json"], "no session file"),
    (["explain", "{bad}"], "no session file"),
    (["explain", "SESSION", "--family", "vit"], "unknown family 'vit'"),
    (["explain", "SESSION", "--priors", "/no/priors.json"], "prior file not found"),
    (["explain", "SESSION", "--floor", "2"], "--floor must be within"),
])
def test_user_errors_exit_1_with_one_line(tmp_path, capsys, args, message):
    s = shift_session(tmp_path)
    args = [s if a == "SESSION" else a for a in args]
    assert cli.main(args) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_not_a_session(tmp_path, capsys):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"schema": "something-else"}))
    assert cli.main(["explain", str(p)]) == 1
    assert "not a NeuralDBG session" in capsys.readouterr().err


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        cli.main(["explain"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        cli.main(["explain", "x.json", "-f", "gradient_explosion"])
    err = capsys.readouterr().err
    assert "invalid choice" in err
    assert err.strip().splitlines()[-1].startswith("neuraldbg: error: argument -f/--failure-type: invalid choice")


def test_subcommands_register_their_own_parser():
    assert "explain" in cli.COMMANDS
    parser = cli.build_parser()
    args = parser.parse_args(["explain", "a.json", "--json"])
    assert args.func is explain_command.run_explain and args.sessions == ["a.json"]


def test_module_entry_point_runs_offline(tmp_path):
    s = shift_session(tmp_path)
    out = subprocess.run([sys.executable, "-m", "neuraldbg.cli", "explain", s], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "data shifted" in out.stdout


def _rank_session(tmp_path, rank, nan_input):
    ev = [make_event(OPTIMIZER, "divergence", None, 20, 6.0, {"nonfinite": 1.0}, end_step=39, rank=rank)]
    if nan_input:
        ev.insert(0, make_event(DATA, "nan", "fc1", 20, 6.0, {"at_input": 1.0}, end_step=39, rank=rank))
    else:
        ev.insert(0, make_event(DATA, "nan", "fc1", 21, 6.0, {"at_input": 0.0}, end_step=39, rank=rank))
    losses = [0.7 * 0.97 ** i for i in range(20)] + [float("nan")] * 20
    tr = Trace(events=tuple(ev), layers=small_layers(), family="mlp", first_step=0, last_step=39,
               loss=loss_summary(losses), rank=rank, world_size=2)
    return export_trace(tr, tmp_path / f"rank{rank}.json")


def test_explain_merge_names_the_rank_where_nan_entered(tmp_path, capsys):
    paths = [_rank_session(tmp_path, 0, False), _rank_session(tmp_path, 1, True)]
    assert cli.main(["explain", "--merge", *paths]) == 0
    out = capsys.readouterr().out
    assert out.count("Session ") == 1  # one merged report, not one per file
    assert "data corrupted" in out and "at step 20 on rank 1." in out


def test_explain_merge_with_a_bad_file_fails_cleanly(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert cli.main(["explain", "--merge", _rank_session(tmp_path, 0, True), str(bad)]) == 1
    assert "not valid JSON" in capsys.readouterr().err


# ---- one line for the user's errors, a traceback for ours ---------------------------------------

def _one_error_line(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("neuraldbg: error: "), err
    return lines[0]


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d.update(loss=[1]), "loss: expected an object"),
    (lambda d: d["events"][0].update(step=3.7), "events[0].step: expected an integer"),
    (lambda d: d["events"][0].update(layer=["fc1"]), "events[0].layer: expected a string or null"),
    (lambda d: d.update(priors=3), "priors: expected an object"),
])
def test_bad_sessions_are_one_line_with_the_field(tmp_path, capsys, mutate, message):
    doc = json.loads(Path(nan_session(tmp_path)).read_text())
    mutate(doc)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    assert cli.main(["explain", str(bad)]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert f"{bad}: {message}" in line


def test_unreadable_and_deep_files_are_one_line(tmp_path, capsys, monkeypatch):
    import neuraldbg.session as S

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    assert cli.main(["explain", str(deep)]) == 1
    assert "nested deeper than" in _one_error_line(capsys.readouterr().err)
    assert cli.main(["explain", str(tmp_path)]) == 1
    assert "is a directory" in _one_error_line(capsys.readouterr().err)
    s = nan_session(tmp_path)

    def denied(path, *a, **k):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(S, "read_json", denied)
    assert cli.main(["explain", s]) == 1
    assert _one_error_line(capsys.readouterr().err) == f"neuraldbg: error: cannot read {s}: Permission denied"


def test_debug_shows_the_traceback(tmp_path, capsys):
    assert cli.main(["--debug", "explain", str(tmp_path / "none.json")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("neuraldbg: error: no session file")


def test_a_bug_of_ours_shows_the_traceback_and_asks_for_a_report(tmp_path, capsys, monkeypatch):
    def broken(args):
        raise KeyError("oops")

    monkeypatch.setattr(explain_command, "run_explain", broken)
    assert cli.main(["explain", nan_session(tmp_path)]) == cli.EXIT_BUG == 70
    err = capsys.readouterr().err
    assert "Traceback" in err and "KeyError: 'oops'" in err and "please report it" in err


def test_session_priors_are_named_and_never_a_path_followed(tmp_path, capsys, caplog):
    from neuraldbg.causal.priors import load_priors

    s = nan_session(tmp_path)
    assert cli.main(["explain", s]) == 0
    assert f"priors mlp.json (shipped, {load_priors('mlp').fingerprint[:12]})" in capsys.readouterr().out
    doc = json.loads(Path(s).read_text())
    doc["version"], doc["priors"] = 1, "/no/such/priors.json"  # an old session naming a path
    doc["meta"] = {k: v["value"] for k, v in doc.pop("signatures").items()}  # where versions 1-2 kept them
    del doc["gaps"], doc["internal_errors"]  # fields of version 4
    old = tmp_path / "v1.json"
    old.write_text(json.dumps(doc))
    with caplog.at_level("WARNING", logger="neuraldbg"):
        assert cli.main(["explain", str(old)]) == 0
    assert "priors mlp (shipped)" in capsys.readouterr().out and "is not opened" in caplog.text
    pri = tmp_path / "tuned.json"
    pri.write_text(json.dumps(load_priors("rnn").to_dict()))
    assert cli.main(["explain", str(old), "--priors", str(pri)]) == 0  # --priors is the override
    assert f"priors {pri}" in capsys.readouterr().out


def test_a_bad_session_among_several_is_reported_and_the_rest_explained(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert cli.main(["explain", str(bad), nan_session(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "not a NeuralDBG session" in _one_error_line(captured.err)
    assert "data corrupted" in captured.out


def test_the_installed_entry_point_prints_one_line_for_a_bad_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "neuraldbg.session", "version": 2, "loss": [1]}')
    out = subprocess.run([sys.executable, "-m", "neuraldbg.cli", "explain", str(bad)], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [f"neuraldbg: error: {bad}: missing required field "
                                               "'neuraldbg_version'; required: schema, version, neuraldbg_version, "
                                               "family, rank, world_size, steps, model, events, loss, config, priors, "
                                               "meta"]


# ---- the command line's manners: --version, pipes, flags in either place, one error format -------

def test_version_prints_and_exits_0(capsys):
    """Regression: ``neuraldbg --version`` was a usage error (exit code 2)."""
    import neuraldbg

    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"neuraldbg {neuraldbg.__version__}"


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(tmp_path):
    """Regression: ``neuraldbg explain run.json | head -4`` ended with
    ``neuraldbg: error: [Errno 32] Broken pipe``."""
    sessions = [shift_session(tmp_path)] * 200  # far more than a pipe buffer holds
    proc = subprocess.Popen([sys.executable, "-m", "neuraldbg.cli", "explain", *sessions], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = [proc.stdout.readline() for _ in range(4)]
    proc.stdout.close()  # what `head -4` does after four lines
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == cli.EXIT_PIPE == 141
    assert head[0].startswith(b"Session ") and err == ""


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_is_accepted_before_and_after_the_subcommand(tmp_path, capsys, where):
    missing = str(tmp_path / "none.json")
    argv = ["--debug", "explain", missing] if where == "before" else ["explain", missing, "--debug"]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("neuraldbg: error: no session file")
    assert cli.main(["explain", missing]) == 1
    assert "Traceback" not in capsys.readouterr().err  # off by default, in both places


def test_verbose_after_the_subcommand(tmp_path):
    args = cli.build_parser().parse_args(["explain", "a.json", "-v"])
    assert args.verbose and not args.debug
    args = cli.build_parser().parse_args(["-v", "explain", "a.json"])
    assert args.verbose and not args.debug


@pytest.mark.parametrize("argv, message", [
    (["report", "/no/such.json"], "no session file"),
    (["report", "SESSION", "--family", "vit"], "unknown family 'vit'"),
    (["report", "SESSION", "-o", "/proc/neuraldbg/report.html"], "cannot write /proc/neuraldbg/report.html"),
    (["tune-priors", "--family", "vit", "--runs", "x", "--out", "y"], "unknown family 'vit'"),
    (["tune-verification", "--runs", "/no/such/folder"], "/no/such/folder"),
])
def test_every_error_reads_the_same(tmp_path, capsys, argv, message):
    """Regression: ``neuraldbg report`` printed ``neuraldbg report: ...`` where every other
    error reads ``neuraldbg: error: ...``."""
    argv = [shift_session(tmp_path) if a == "SESSION" else a for a in argv]
    assert cli.main(argv) == 1
    assert message in _one_error_line(capsys.readouterr().err)


def test_writing_into_a_missing_folder_creates_it_and_says_so(tmp_path, capsys):
    """One rule for every writer (docs/api.md): missing parent folders are created; the command
    line names them instead of creating them silently."""
    out = tmp_path / "a" / "b" / "report.html"
    assert cli.main(["report", shift_session(tmp_path), "-o", str(out)]) == 0
    assert out.is_file()
    assert capsys.readouterr().out.strip() == f"Wrote {out} (created the folders {tmp_path / 'a'}, {out.parent})"
    again = tmp_path / "a" / "b" / "again.html"
    assert cli.main(["report", shift_session(tmp_path), "-o", str(again)]) == 0
    assert capsys.readouterr().out.strip() == f"Wrote {again}"
