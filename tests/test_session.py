import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuraldbg import load_session
from neuraldbg.events.base import ACTIVATION, DATA, GRADIENT, OPTIMIZER, Event
from neuraldbg.session import export_trace
from neuraldbg.trace import LayerInfo, LossSummary, Trace

KINDS = [(GRADIENT, "vanishing"), (ACTIVATION, "saturated"), (OPTIMIZER, "divergence"), (DATA, "shift")]
LAYERS = (LayerInfo("fc1", "Linear", 0, 10), LayerInfo("act", "ReLU", 1, 0), LayerInfo("fc2", "Linear", 2, 5))


def trace_of(events):
    return Trace(events=tuple(events), layers=LAYERS, family="mlp", first_step=0, last_step=99,
                 loss=LossSummary(n=100, first=2.0, last=float("nan"), min=0.5, n_nonfinite=1,
                                  first_nonfinite_step=99, history=((0, 2.0), (99, float("nan")))))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.builds(
    lambda tk, layer, step, n, v: Event(tk[0], tk[1], None if tk[0] == OPTIMIZER else layer, step,
                                        end_step=step + n, count=n + 1, severity=v, values={"x": v}),
    st.sampled_from(KINDS), st.sampled_from(["fc1", "fc2"]), st.integers(0, 50), st.integers(0, 5),
    st.one_of(st.floats(allow_nan=False), st.just(float("inf")))), max_size=10))
def test_export_then_load_gives_equal_events(tmp_path_factory, events):
    path = tmp_path_factory.mktemp("s") / "session.json"
    export_trace(trace_of(events), path)
    s = load_session(path)
    assert s.events == list(events)
    assert s.trace().layers == LAYERS
    assert s.trace().loss.n_nonfinite == 1


def test_file_is_strict_json_and_versioned(tmp_path):
    p = export_trace(trace_of([]), tmp_path / "a.json")
    doc = json.loads(open(p).read())  # strict JSON: NaN is encoded as a string
    assert doc["schema"] == "neuraldbg.session" and doc["version"] == 4
    assert not list(tmp_path.glob(".*tmp"))  # no temp file left behind


def test_truncated_foreign_and_future_files_fail_clearly(tmp_path):
    p = export_trace(trace_of([]), tmp_path / "a.json")
    text = open(p).read()
    (tmp_path / "t.json").write_text(text[: len(text) // 2])
    with pytest.raises(ValueError, match="not valid JSON"):
        load_session(tmp_path / "t.json")
    (tmp_path / "f.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="not a NeuralDBG session"):
        load_session(tmp_path / "f.json")
    doc = json.loads(text)
    doc["version"] = 99
    (tmp_path / "v.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="version 99"):
        load_session(tmp_path / "v.json")
    with pytest.raises(FileNotFoundError):
        load_session(tmp_path / "missing.json")
    with pytest.raises(IsADirectoryError):
        load_session(tmp_path)


def test_events_frame_columns():
    from neuraldbg.session import events_frame

    df = events_frame([Event(DATA, "nan", "fc1", 30, values={"nan_count": 2})])
    assert list(df.columns[:8]) == ["type", "kind", "layer", "step", "end_step", "count", "severity", "rank"]
    assert df.loc[0, "value_nan_count"] == 2
    assert list(events_frame([]).columns)[:3] == ["type", "kind", "layer"]


# ---- priors travel inside the session -------------------------------------------------------

def _tuned(tmp_path, family="mlp", ok=0.6):
    from neuraldbg.causal.priors import load_priors

    doc = load_priors(family).to_dict()
    doc["roots"]["learning_rate"] = {"ok": ok, "too_high": (1 - ok) / 2, "too_low": (1 - ok) / 2}
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_session_embeds_its_priors_and_answers_the_same_without_the_file(tmp_path):
    from neuraldbg.causal.priors import load_priors

    tuned = _tuned(tmp_path)
    ev = [Event(OPTIMIZER, "divergence", None, 40, end_step=60, values={"nonfinite": 0.0})]
    p = export_trace(trace_of(ev), tmp_path / "s.json", priors=str(tuned))
    doc = json.loads(open(p).read())
    assert doc["priors"]["source"] == str(tuned) and doc["priors"]["content"]["roots"]["learning_rate"]["ok"] == 0.6
    before = load_session(p).posterior()
    tuned.unlink()  # another machine: the tuned file is not there
    s = load_session(p)
    assert s.priors.fingerprint != load_priors("mlp").fingerprint
    after = s.posterior()
    assert after["learning_rate"] == before["learning_rate"]
    assert s.priors.source == f"{tuned} (embedded)"
    # the shipped priors give another answer, so the embedded ones were really used
    shipped = load_session(p, priors=load_priors("mlp")).posterior()
    assert shipped["learning_rate"] != after["learning_rate"]


def test_a_version_1_session_naming_a_prior_path_never_opens_it(tmp_path, caplog, monkeypatch):
    p = export_trace(trace_of([]), tmp_path / "s.json")
    doc = json.loads(open(p).read())
    doc["version"], doc["priors"] = 1, str(_tuned(tmp_path))
    doc["meta"] = {k: v["value"] for k, v in doc.pop("signatures").items()}  # where versions 1-2 kept them
    del doc["gaps"], doc["internal_errors"]  # fields of version 4
    (tmp_path / "v1.json").write_text(json.dumps(doc))
    opened = []
    real_open = open

    def spy(file, *a, **k):
        opened.append(str(file))
        return real_open(file, *a, **k)

    monkeypatch.setattr("builtins.open", spy)
    with caplog.at_level("WARNING", logger="neuraldbg"):
        s = load_session(tmp_path / "v1.json")
        s.posterior()
    monkeypatch.undo()
    assert str(tmp_path / "tuned.json") not in opened
    assert "is not opened; using the shipped mlp priors" in caplog.text
    assert s.priors.source == "mlp.json"


def test_a_version_2_session_reads_its_meta_as_declared_signatures(tmp_path):
    """Versions 1-2 kept the signatures in a flat ``meta`` object, the step size under its old
    name ``step_ratio_peak``; they read as the declared signatures (without their steps)."""
    p = export_trace(trace_of([]), tmp_path / "s.json")
    doc = json.loads(open(p).read())
    doc["version"] = 2
    doc.pop("signatures"), doc.pop("gaps"), doc.pop("internal_errors")
    doc["meta"] = {"every": 1, "optimizer": "SGD", "lr": [0.1], "step_ratio_peak": 0.3, "init_scale_log10": 0.02}
    (tmp_path / "v2.json").write_text(json.dumps(doc))
    sigs = load_session(tmp_path / "v2.json").trace().signatures
    assert sigs.as_dict() == {"every": 1, "optimizer": "SGD", "lr": (0.1,), "step_ratio_median": 0.3,
                              "init_scale_log10": 0.02}
    assert sigs.steps() == {}
    doc["meta"]["step_ratio_peek"] = 1.0  # an undeclared name is refused, naming the field
    (tmp_path / "typo.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="meta.step_ratio_peek: undeclared signature"):
        load_session(tmp_path / "typo.json")


def test_gaps_and_internal_errors_round_trip_and_version_3_reads_without_them(tmp_path):
    from neuraldbg.trace import Signatures

    tr = dataclasses.replace(trace_of([]), internal_errors=2,
                             signatures=Signatures({"every": 1}, gaps={"step_ratio_median": "no optimizer found"}))
    p = export_trace(tr, tmp_path / "s.json")
    doc = json.loads(open(p).read())
    assert doc["gaps"] == {"step_ratio_median": "no optimizer found"} and doc["internal_errors"] == 2
    back = load_session(p)
    assert back.trace().signatures.gaps() == {"step_ratio_median": "no optimizer found"}
    cov = back.coverage()
    assert cov.internal_errors == 2 and cov["step_size"].reason == "no optimizer found" and cov["step_size"].gap
    assert not cov["step_size"].observed and "2 internal errors" in cov.summary()
    doc["gaps"]["step_ratio_peek"] = "x"  # a gap names a declared signature
    (tmp_path / "typo.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="gaps.step_ratio_peek: undeclared signature"):
        load_session(tmp_path / "typo.json")
    del doc["gaps"], doc["internal_errors"]
    doc["version"] = 3
    (tmp_path / "v3.json").write_text(json.dumps(doc))
    old = load_session(tmp_path / "v3.json")
    assert old.trace().internal_errors == 0 and old.trace().signatures.gaps() == {}


def test_edited_embedded_priors_are_refused(tmp_path):
    p = export_trace(trace_of([]), tmp_path / "s.json")
    doc = json.loads(open(p).read())
    doc["priors"]["content"]["roots"]["data"] = {"ok": 0.5, "corrupted": 0.25, "shifted": 0.25}
    (tmp_path / "e.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"e.json: priors.fingerprint: .* does not match"):
        load_session(tmp_path / "e.json")
    doc["priors"]["content"]["roots"]["data"] = {"ok": 1.5, "corrupted": 0.25, "shifted": 0.25}
    (tmp_path / "e.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"e.json: priors.content.roots.data.ok: probability 1.5"):
        load_session(tmp_path / "e.json")


def test_the_monitor_validates_priors_at_construction_and_embeds_them(tmp_path):
    import torch
    from torch import nn

    from neuraldbg import NeuralDbg
    from neuraldbg.causal.priors import PriorError

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with pytest.raises(PriorError, match="typo.json: prior file not found"):
        NeuralDbg(model, priors=tmp_path / "typo.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(PriorError, match="not valid JSON"):
        NeuralDbg(model, priors=bad)
    with pytest.raises(TypeError, match="priors must be a path"):
        NeuralDbg(model, priors=3)
    tuned = _tuned(tmp_path)
    dbg = NeuralDbg(model, priors=str(tuned))
    assert dbg.priors_path == str(tuned) and dbg.priors.roots["learning_rate"]["ok"] == pytest.approx(0.6)
    with dbg:
        for _ in range(3):
            dbg.record_loss(model(torch.randn(5, 4)).square().mean())
    s = load_session(dbg.export_aquarium_package(tmp_path / "run.json"))
    assert s.priors.fingerprint == dbg.priors.fingerprint


def test_a_session_from_an_older_network_loads_with_the_tables_that_still_fit(tmp_path, caplog):
    """Regression: a node that gained a parent (saturation <- initialization) made every
    session written before unreadable; now the outdated table alone is replaced."""
    ev = [Event(OPTIMIZER, "divergence", None, 40, end_step=60, values={"nonfinite": 0.0})]
    p = export_trace(trace_of(ev), tmp_path / "s.json")
    doc = json.loads(open(p).read())
    cpds = doc["priors"]["content"]["cpds"]
    assert "saturation" in cpds and "init_scale" in cpds
    cpds["saturation"]["parents"] = ["data", "instability", "signal_decay"]  # the older network
    doc["priors"]["content"]["network"] = "0" * 40  # ... whose fingerprint the file records
    (tmp_path / "old.json").write_text(json.dumps(doc))
    with caplog.at_level("WARNING", logger="neuraldbg"):
        s = load_session(tmp_path / "old.json")
        s.posterior()
    assert "the table of saturation no longer fit it" in caplog.text
    assert "saturation" not in s.priors.cpds and "init_scale" in s.priors.cpds
    # a table that is wrong in another way is still refused (as is one that differs under the
    # current network's own fingerprint)
    cpds["saturation"]["parents"] = sorted(cpds["saturation"]["parents"] + ["initialization"])
    cpds["init_scale"]["values"][0][0] = 7.0
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="init_scale"):
        load_session(tmp_path / "bad.json")
