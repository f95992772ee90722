"""The one schema for session and prior files: every violation names the file and the field."""
import copy
import json
import os

import pytest

from neuraldbg import load_session
from neuraldbg.causal.priors import PriorError, load_priors, read
from neuraldbg.events.base import GRADIENT, OPTIMIZER, Event
from neuraldbg.schema import MAX_DEPTH, SchemaError, SessionFormatError, check_session, too_deep
from neuraldbg.session import export_trace
from neuraldbg.trace import LayerInfo, LossSummary, Trace
from tests.tiny import signatures


def trace():
    ev = (Event(GRADIENT, "vanishing", "fc1", 3, end_step=9, count=2, severity=1.5, values={"grad_rms": 1e-9}),
          Event(OPTIMIZER, "spike", None, 5, values={"robust_z": 30.0}))
    return Trace(events=ev, layers=(LayerInfo("fc1", "Linear", 0, 10), LayerInfo("fc2", "Linear", 1, 5)),
                 family="mlp", first_step=0, last_step=20,
                 loss=LossSummary(n=21, first=2.0, last=0.5, min=0.5, history=((0, 2.0), (20, 0.5))),
                 signatures=signatures({"every": 1, "lr": (0.1,)}))


@pytest.fixture
def doc(tmp_path):
    with open(export_trace(trace(), tmp_path / "base.json")) as f:
        return json.load(f)


def embedded(**content):
    """An embedded priors block (a session with a user's priors), its content updated."""
    return {"source": "mine.json", "fingerprint": "0" * 40, "content": {**load_priors("mlp").to_dict(), **content}}


def load_mutated(tmp_path, doc, mutate):
    d = copy.deepcopy(doc)
    mutate(d)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(d))
    return load_session(path)


# each defect the issue found: a raw AttributeError/OverflowError/TypeError, or a silent truncation
@pytest.mark.parametrize("mutate,field,message", [
    (lambda d: d.update(loss=[1.0]), "loss", "expected an object, got an array"),
    (lambda d: d.update(signatures=[1]), "signatures", "expected an object, got an array"),
    (lambda d: d["events"][0].update(count="inf"), "events[0].count", "expected an integer"),
    (lambda d: d["loss"].update(n_nonfinite="inf"), "loss.n_nonfinite", "expected an integer"),
    (lambda d: d["events"][1].update(layer=["fc1"]), "events[1].layer", "expected a string or null"),
    (lambda d: d.update(priors=3), "priors", "expected an object"),
    (lambda d: d["events"][0].update(step=3.7), "events[0].step", "expected an integer, got the number 3.7"),
    (lambda d: d["events"][0].update(step=3.0), "events[0].step", "expected an integer"),
    (lambda d: d["events"][0].update(count=0), "events[0].count", "out of range; valid: 1 to"),
    (lambda d: d["events"][0].update(end_step=1), "events[0].end_step", "out of range; valid: 3 to"),
    (lambda d: d["events"][0].update(kind="exploded"), "events[0].kind", "valid: vanishing, exploding"),
    (lambda d: d["events"][0]["values"].update(grad_rms="big"), "events[0].values.grad_rms", "expected a number"),
    (lambda d: d["events"][0].update(colour="red"), "events[0]", "unknown field 'colour'"),
    (lambda d: d["events"][0].pop("step"), "events[0]", "missing required field 'step'"),
    (lambda d: d["steps"].update(last=10 ** 30), "steps.last", "out of range"),
    (lambda d: d["steps"].update(first=30), "steps.last", "out of range; valid: 30 to"),
    (lambda d: d["model"]["layers"][1].update(name="fc1"), "model.layers[1].name", "listed twice"),
    (lambda d: d["model"]["layers"][0].update(n_params=-1), "model.layers[0].n_params", "out of range"),
    (lambda d: d["loss"].update(min="nan"), "loss.min", "expected a finite number"),
    (lambda d: d["loss"]["history"].append([3, 1.0, 2.0]), "loss.history[2]", "array of 2 items"),
    (lambda d: d["signatures"].update(every={"value": 0}), "signatures.every", "out of range"),
    (lambda d: d["signatures"].update(lr={"value": [{"a": 1}]}), "signatures.lr[0]", "expected a number"),
    (lambda d: d["signatures"].update(lr={"value": 0.1}), "signatures.lr", "must be a list of numbers"),
    (lambda d: d["signatures"].update(every=1), "signatures.every", "expected an object"),
    (lambda d: d["signatures"].update(every={"value": 1, "step": 0.5}), "signatures.every.step",
     "expected an integer"),
    (lambda d: d["signatures"].update(custom={"value": 1.0}), "signatures.custom", "undeclared signature 'custom'"),
    (lambda d: d.update(family="vit"), "family", "valid: mlp, cnn"),
    (lambda d: d.update(rank=-1), "rank", "out of range"),
    (lambda d: d.update(extra=1), "", "unknown field 'extra'"),
    (lambda d: d.pop("model"), "", "missing required field 'model'"),
    (lambda d: d.update(config={"explode_abs": "10"}), "config.explode_abs", "expected a number"),
    (lambda d: d.update(config={"explode_abs": -1.0}), "config", "explode_abs must be > 0"),
    (lambda d: d.update(config={"nonsense": 1}), "config", "unknown field 'nonsense'"),
    (lambda d: d["priors"].update(fingerprint="abc"), "priors.fingerprint", "40 lowercase hex digits"),
    (lambda d: d["priors"].update(shipped="vit"), "priors.shipped", "valid: mlp, cnn"),
    (lambda d: d["priors"].pop("fingerprint"), "priors", "missing required field 'fingerprint'"),
    (lambda d: d["priors"].update(content={}), "priors", "unknown field 'content'"),
    (lambda d: d.update(priors={"fingerprint": "0" * 40}), "priors", "expected a reference to the shipped priors"),
    (lambda d: d.update(priors=embedded(temperature=0)), "priors.content.temperature", "must be > 0"),
    (lambda d: d.update(priors=embedded(), version=4) or d["priors"].update(fingerprint="abc"),
     "priors.fingerprint", "40 lowercase hex digits"),
    (lambda d: d.update(version=4), "priors", "missing required field 'source'"),  # no reference before 5
])
def test_a_bad_field_is_a_value_error_naming_file_and_field(tmp_path, doc, mutate, field, message):
    with pytest.raises(SessionFormatError) as exc:
        load_mutated(tmp_path, doc, mutate)
    text = str(exc.value)
    assert text.startswith(f"{tmp_path / 'run.json'}: {field + ': ' if field else ''}"), text
    assert message in text
    assert exc.value.file == str(tmp_path / "run.json") and (exc.value.field or "") == field
    assert isinstance(exc.value, ValueError)


def test_unicode_layer_names_and_nonfinite_values_are_kept(tmp_path, doc):
    def mutate(d):
        d["model"]["layers"][0]["name"] = d["events"][0]["layer"] = "encoder.\u00e9\u6f22\U0001f600"
        d["events"][0]["values"]["grad_rms"] = "-inf"
    s = load_mutated(tmp_path, doc, mutate)
    assert s.events[0].layer == "encoder.\u00e9\u6f22\U0001f600" and s.events[0].measured["grad_rms"] == float("-inf")
    assert s.trace().layer_index("encoder.\u00e9\u6f22\U0001f600") == 0
    s.get_causal_hypotheses()


def test_deep_nesting_and_huge_numbers_are_value_errors(tmp_path):
    p = tmp_path / "deep.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(SessionFormatError, match="nested deeper than 64 levels"):
        load_session(p)
    p.write_text(json.dumps({"a": json.loads("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))}))
    with pytest.raises(SessionFormatError, match="nested deeper"):
        load_session(p)
    assert not too_deep(json.loads("[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)))
    p.write_text('{"schema": "neuraldbg.session", "version": ' + "9" * 5000 + "}")
    with pytest.raises(SessionFormatError, match="not valid JSON"):
        load_session(p)
    p.write_bytes(b'{"schema": "\xff"}')
    with pytest.raises(SessionFormatError, match="not UTF-8"):
        load_session(p)


def test_files_over_the_size_limit_are_refused_unread(tmp_path):
    p = tmp_path / "huge.json"
    with open(p, "wb") as f:  # sparse: no gigabyte is written
        f.truncate((1 << 30) + 1)
    with pytest.raises(SessionFormatError, match="too large for a NeuralDBG session"):
        load_session(p)
    with pytest.raises(PriorError, match="too large for a prior file"):
        read(p)


def test_big_numbers_where_counts_belong(tmp_path, doc):
    with pytest.raises(SessionFormatError, match=r"events\[0\].values.grad_rms: .* too large"):
        load_mutated(tmp_path, doc, lambda d: d["events"][0]["values"].update(grad_rms=10 ** 400))
    with pytest.raises(SessionFormatError, match=r"loss.n: expected an integer, got the number inf"):
        load_mutated(tmp_path, doc, lambda d: d["loss"].update(n=float("inf")))


def test_check_session_on_a_dict_and_the_error_hierarchy():
    with pytest.raises(SessionFormatError, match="<dict> is not a NeuralDBG session"):
        check_session([], "<dict>")
    assert issubclass(SessionFormatError, SchemaError) and issubclass(PriorError, SchemaError)
    assert issubclass(SchemaError, ValueError)


# ---- prior files -----------------------------------------------------------------------------

def good_priors():
    return json.loads(json.dumps(load_priors("mlp").to_dict()))


def write_priors(tmp_path, doc):
    p = tmp_path / "p.json"
    p.write_text(json.dumps(doc))
    return str(p)


def test_a_cpd_row_that_is_zero_everywhere_is_refused_at_load(tmp_path):
    doc = good_priors()
    cpd = doc["cpds"]["exploding"]
    n = len(cpd["values"][0])
    cpd["values"] = [[1.0] * n, [0.0] * n, [0.0] * n]
    path = write_priors(tmp_path, doc)
    with pytest.raises(PriorError, match=r"p.json: cpds.exploding.values\[1\]: state 'later' has probability 0 "
                                         "under every parent configuration"):
        load_priors(path=path)


def test_a_state_possible_only_under_impossible_parents_is_refused(tmp_path):
    import numpy as np

    from neuraldbg.causal.cpd import default_cpds
    from neuraldbg.causal.structure import default_network

    doc = good_priors()
    net = default_network()
    if "instability" not in doc["cpds"]:  # hand-set in the shipped file: write the table out
        c = default_cpds(net)["instability"]
        doc["cpds"]["instability"] = {"parents": list(c.parents), "states": list(c.states),
                                      "values": c.values_2d.tolist()}
    inst = doc["cpds"]["instability"]
    cards = [len(net.states_of(p)) for p in inst["parents"]]
    at = inst["parents"].index("corruption")
    for j in range(len(inst["values"][0])):  # instability 'init' never while nothing is corrupted
        if np.unravel_index(j, cards)[at] == 0:  # pgmpy layout: the last parent varies fastest
            inst["values"][0][j] += inst["values"][2][j]
            inst["values"][2][j] = 0.0
    exp = doc["cpds"]["exploding"]  # parents: corruption, instability, numerics
    exp_cards = [len(net.states_of(p)) for p in exp["parents"]]
    for j in range(len(exp["values"][0])):  # exploding 'init' only with no corruption and instability 'init'
        if tuple(np.unravel_index(j, exp_cards))[:2] != (0, 2):
            exp["values"][0][j] += exp["values"][2][j]
            exp["values"][2][j] = 0.0
    # each row is non-zero somewhere, yet exploding 'init' can never happen
    with pytest.raises(PriorError, match="p.json: cpds.exploding: state 'init' of exploding has probability 0 "
                                         "under the priors"):
        load_priors(path=write_priors(tmp_path, doc))
    exp["values"][2][1 * 3 + 2], exp["values"][0][1 * 3 + 2] = 0.01, exp["values"][0][1 * 3 + 2] - 0.01
    assert load_priors(path=write_priors(tmp_path, doc))  # possible again: with corrupted values


def test_prior_errors_name_the_file_and_field(tmp_path):
    doc = good_priors()
    doc["cpds"]["exploding"]["values"][0][0] = "0.5"
    path = write_priors(tmp_path, doc)
    with pytest.raises(PriorError) as exc:
        load_priors(path=path)
    assert str(exc.value).startswith(f"{path}: cpds.exploding.values[0][0]: expected a finite number")
    assert exc.value.file == path and exc.value.field == "cpds.exploding.values[0][0]"
    os.chmod(path, 0)
    if os.geteuid() != 0:  # root reads anything
        with pytest.raises(PriorError, match="cannot read prior file"):
            load_priors(path=path)
