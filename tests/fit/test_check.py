"""Whether a prior file was fitted on what this code records (neuraldbg/fit/check.py)."""
import pytest

import neuraldbg.fit as T
from neuraldbg import cli
from neuraldbg.causal.priors import load_priors
from neuraldbg.fit.check import CURRENT, HAND_SET, MISSING, STALE, check_family, check_priors
from neuraldbg.session import export_trace
from tests.fit.runs import runs_dir, trace_of


def fitted(d):
    return T.tune(d, "mlp", ess=4, folds=0, max_iter=2, engine="numpy").priors


def test_a_file_is_current_against_the_folder_it_was_fitted_on(tmp_path):
    d = runs_dir(tmp_path, seeds=2)
    [c] = check_priors(d, ["mlp"], priors={"mlp": fitted(d)})
    assert c.status == CURRENT and c.ok and c.fitted == c.found == 4


def test_a_file_reads_stale_once_the_evidence_of_its_runs_changes(tmp_path):
    """Regression: shipped priors had gone stale against the extraction, and nothing said so."""
    d = runs_dir(tmp_path, seeds=2)
    pri = fitted(d)
    # the code now records seed 1's NaN-batch run differently (here: nothing fires)
    export_trace(trace_of("healthy", 1, "mlp"), d / "sessions" / "mlp__data_nan__1.json")
    [c] = check_priors(d, ["mlp"], priors={"mlp": pri})
    assert c.status == STALE and not c.ok and "make priors" in c.detail


def test_a_folder_without_every_fitted_run_cannot_confirm_it(tmp_path):
    pri = fitted(runs_dir(tmp_path, seeds=3))
    [c] = check_priors(runs_dir(tmp_path / "fewer", seeds=2), ["mlp"], priors={"mlp": pri})
    assert c.status == MISSING and (c.fitted, c.found) == (6, 4) and not c.ok


def test_hand_set_tables_have_nothing_to_check():
    c = check_family("mlp", T.hand_set_base(load_priors("mlp")), [])
    assert c.status == HAND_SET and c.ok


def test_the_command_fails_unless_every_file_is_current_and_names_valid_families(tmp_path, capsys):
    d = runs_dir(tmp_path, seeds=2)
    # the shipped mlp file was fitted on the zoo's runs, which this folder does not hold
    assert cli.main(["check-priors", "--runs", str(d), "--family", "mlp"]) == 1
    assert "runs missing" in capsys.readouterr().out
    assert cli.main(["check-priors", "--runs", str(d), "--family", "vit"]) == 1
    assert "valid: mlp" in capsys.readouterr().err
    with pytest.raises(ValueError, match="valid: mlp"):
        check_priors(d, ["vit"])
