"""Prior files: the nine shipped families load; bad files fail with clear errors."""
import copy
import json
import math
import os

import pytest

from neuraldbg.causal.priors import SCHEMA_VERSION, PriorError, Priors, load_priors, read, validate
from neuraldbg.causal.structure import ROOTS, default_network
from neuraldbg.vocab import FAMILIES


def good() -> dict:
    return copy.deepcopy(load_priors("mlp").to_dict())


def write(tmp_path, doc, name="p.json"):
    p = tmp_path / name
    p.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return str(p)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_ships_a_valid_file_with_reasoning(family):
    pri = load_priors(family)
    assert isinstance(pri, Priors) and pri.family == family
    assert set(pri.roots) == set(ROOTS)
    for var, states in ROOTS.items():
        assert list(pri.roots[var]) == list(states)
        assert math.fsum(pri.roots[var].values()) == pytest.approx(1.0, abs=1e-12)
        assert pri.roots[var]["ok"] >= 0.8  # most runs are fine: abnormal priors stay small
        assert pri.reasoning.get(var), f"{family}: no reasoning for {var}"
    assert pri.schema_version == SCHEMA_VERSION and pri.temperature == 1.0
    assert 0.5 < pri.p_healthy() < 0.9
    prov = pri.provenance
    assert prov["method"] in ("hand-set", "fitted")
    if prov["method"] == "fitted":  # fitted to benchmark runs, with the hand-set tables kept
        assert prov["fitted_on"]["records"] > 0 and "cpds" in prov["base"]


def test_families_list_matches_api_md():
    assert FAMILIES == ("mlp", "cnn", "transformer", "gan", "lora", "diffusion", "rnn", "gnn", "rl")


def test_default_family_and_unknown_family():
    assert load_priors().family == "mlp"
    with pytest.raises(PriorError, match="unknown family 'vit'; valid: mlp, cnn, transformer"):
        load_priors("vit")


def test_loading_is_cached_and_path_cache_follows_edits(tmp_path):
    assert load_priors("cnn") is load_priors("cnn")
    path = write(tmp_path, good())
    a = load_priors(path=path)
    assert load_priors(path=path) is a
    doc = good()
    doc["roots"]["data"] = {"ok": 0.7, "corrupted": 0.1, "shifted": 0.2}
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)  # different size: a new cache key even within one mtime tick
    b = load_priors(path=path)
    assert b.roots["data"]["ok"] == pytest.approx(0.7) and b.fingerprint != a.fingerprint


def test_round_trip_and_fingerprint():
    pri = load_priors("transformer")
    again = validate(pri.to_dict(), source="x")
    assert again.roots == pri.roots and again.fingerprint == pri.fingerprint


def _bad(mutate):
    doc = good()
    mutate(doc)
    return doc


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d.update(schema_version=3), "schema_version 3 is not supported; this neuraldbg reads schema_version 2"),
    (lambda d: d.update(network="0" * 40), "network: written for network 0000000000000000000000000000000000000000; "
                                           "this NeuralDBG diagnoses with network [0-9a-f]{40}"),
    (lambda d: d.pop("network"), "network: written for a network it does not record"),
    (lambda d: d.pop("schema_version"), "schema_version None"),
    (lambda d: d.update(family="vit"), "family 'vit' is not valid; valid: mlp"),
    (lambda d: d.update(root={}), r"unknown keys \['root'\]"),
    (lambda d: d.pop("roots"), "missing 'roots'"),
    (lambda d: d["roots"].pop("data"), r"missing \['data'\]"),
    (lambda d: d["roots"].update(optimizer={"ok": 1.0}), r"unknown \['optimizer'\]"),
    (lambda d: d["roots"]["learning_rate"].update(huge=0.0),
     r"roots.learning_rate: states .* valid: \['ok', 'too_high', 'too_low'\]"),
    (lambda d: d["roots"]["data"].pop("shifted"), r"roots.data: states"),
    (lambda d: d["roots"]["data"].update(ok=0.5), r"roots.data: probabilities sum to 0.59"),
    (lambda d: d["roots"]["architecture"].update(ok=1.0, unstable=0.0), "strictly between 0 and 1"),
    (lambda d: d["roots"]["architecture"].update(ok="0.9"), "expected a finite number"),
    (lambda d: d["roots"]["architecture"].update(ok=float("nan")), "expected a finite number"),
    (lambda d: d.update(temperature=0), "temperature must be > 0"),
    (lambda d: d.update(cpds={"optimizer": {"values": []}}), "no such non-root node"),
    (lambda d: d.update(cpds={"depth_risk": {"parents": ["data"], "values": [[1, 1]] * 3}}),
     r"parents \['data'\] must be \['architecture'\]"),
    (lambda d: d.update(cpds={"depth_risk": {"values": [[1.0, 1.0]]}}), "must be a 3 x 2 list"),
    (lambda d: d.update(cpds={"depth_risk": {"values": [[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]]}}),
     "column 0 sums to 1.5"),
    (lambda d: d.update(cpds={"depth_risk": {"values": [[1.5, 0.5], [-0.5, 0.5], [0.0, 0.0]]}}),
     "column 0 has a negative probability"),
    (lambda d: d.update(cpds={"depth_risk": {"states": ["a", "b", "c"], "values": [[1, 1], [0, 0], [0, 0]]}}),
     "states .* must be"),
    (lambda d: d.update(provenance="me"), "provenance must be an object"),
])
def test_bad_files_get_clear_errors(tmp_path, mutate, message):
    path = write(tmp_path, _bad(mutate))
    with pytest.raises(PriorError, match=message) as exc:
        load_priors(path=path)
    assert str(path) in str(exc.value)  # the error names the file


def test_unreadable_files(tmp_path):
    with pytest.raises(PriorError, match="not found"):
        load_priors(path=tmp_path / "none.json")
    with pytest.raises(PriorError, match="not valid JSON"):
        read(write(tmp_path, "{not json"))
    with pytest.raises(PriorError, match="top level"):
        read(write(tmp_path, "[1, 2]"))
    with pytest.raises(PriorError, match="expected 'cnn'"):
        read(write(tmp_path, good()), family="cnn")


def test_fitted_cpds_and_temperature_are_carried(tmp_path):
    doc = good()
    doc["temperature"] = 1.5
    doc["provenance"] = {"method": "bayesian-estimator", "runs": 120, "equivalent_sample_size": 10}
    doc["cpds"] = {"depth_risk": {"parents": ["architecture"], "states": ["low", "deep", "deep_saturating"],
                                  "values": [[0.9, 0.2], [0.07, 0.3], [0.03, 0.5 + 1e-9]]}}
    pri = load_priors(path=write(tmp_path, doc))
    assert pri.temperature == 1.5 and pri.provenance["runs"] == 120
    col = [pri.cpds["depth_risk"]["values"][i][1] for i in range(3)]
    assert math.fsum(col) == pytest.approx(1.0, abs=1e-15)  # renormalized within tolerance


def test_a_family_mismatch_on_a_path_only_warns(tmp_path, caplog):
    path = write(tmp_path, good())
    with caplog.at_level("WARNING", logger="neuraldbg"):
        assert load_priors(family="cnn", path=path).family == "mlp"
    assert "used for a 'cnn' run" in caplog.text


def test_shipped_files_are_package_data():
    import neuraldbg.priors as P

    here = os.path.dirname(P.__file__)
    # one prior file per family, plus the interventional likelihoods of neuraldbg/verify
    assert sorted(f[:-5] for f in os.listdir(here) if f.endswith(".json")) == sorted(FAMILIES + ("verification",))
    for fam in FAMILIES:
        with open(os.path.join(here, f"{fam}.json")) as f:
            assert json.load(f)["schema_version"] == SCHEMA_VERSION
    assert "depth_risk" in default_network().node_by_name
