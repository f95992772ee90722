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
    assert doc["schema"] == "neuraldbg.session" and doc["version"] == 6
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


def _copy(tmp_path, family="mlp"):
    """A user's copy of the shipped prior file, unchanged: a session embeds it (the pinned
    choice), as every session did up to version 4."""
    from neuraldbg.causal.priors import load_priors

    path = tmp_path / "copy.json"
    path.write_text(json.dumps(load_priors(family).to_dict()))
    return path


def _embedding(tmp_path, events=()):
    """The document of a session that embeds its priors (a copy of the shipped ones)."""
    return json.loads(open(export_trace(trace_of(events), tmp_path / "emb.json", priors=str(_copy(tmp_path)))).read())


def _short_run(**kw):
    import torch
    from torch import nn

    from neuraldbg import NeuralDbg

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randn(16, 2)
    with NeuralDbg(model, optimizer=opt, **kw) as dbg:
        for _ in range(5):
            opt.zero_grad()
            loss = (model(x) - y).square().mean()
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return dbg


def _same_posterior(a, b):
    assert a.p_healthy == b.p_healthy and a.nothing_observed == b.nothing_observed
    assert {k: dict(v) for k, v in a.items()} == {k: dict(v) for k, v in b.items()}


def test_a_default_session_refers_to_the_shipped_priors_and_answers_the_same_offline(tmp_path, capsys):
    from neuraldbg import cli
    from neuraldbg.causal.priors import load_priors

    dbg = _short_run()
    p = dbg.export_aquarium_package(tmp_path / "run.json")
    doc = json.loads(open(p).read())
    shipped = load_priors("mlp")
    assert doc["version"] == 6 and doc["priors"] == {"shipped": "mlp", "fingerprint": shipped.fingerprint}
    s = load_session(p)
    _same_posterior(s.posterior(), dbg.posterior())
    # it names the priors it used: the shipped file and its fingerprint
    assert s.priors.fingerprint == shipped.fingerprint and s.priors.shipped
    assert s.priors.source == f"mlp.json (shipped, {shipped.fingerprint[:12]})"
    assert cli.main(["explain", p]) == 0
    assert f"priors mlp.json (shipped, {shipped.fingerprint[:12]})\n" in capsys.readouterr().out
    # written again, it still refers to them; the shipped file passed explicitly is referred to
    again = json.loads(open(s.export_aquarium_package(tmp_path / "again.json")).read())
    assert again["priors"] == doc["priors"]
    assert json.loads(open(export_trace(trace_of([]), tmp_path / "x.json", priors=shipped)).read())["priors"] == \
        doc["priors"]


def test_user_supplied_priors_are_embedded_and_answer_the_same_offline(tmp_path):
    from neuraldbg.causal.priors import as_priors, load_priors, validate

    tuned = _tuned(tmp_path)
    dbg = _short_run(priors=str(tuned))
    p = dbg.export_aquarium_package(tmp_path / "run.json")
    doc = json.loads(open(p).read())
    assert set(doc["priors"]) == {"source", "fingerprint", "content"} and doc["priors"]["source"] == str(tuned)
    tuned.unlink()  # another machine
    s = load_session(p)
    _same_posterior(s.posterior(), dbg.posterior())
    assert s.priors.fingerprint == dbg.priors.fingerprint and s.priors.source == f"{tuned} (embedded)"
    # a user's copy of the shipped file is embedded too (a later version's shipped file must not
    # replace it), and so are a Priors built from it and another family's shipped priors
    shipped = load_priors("mlp")
    for priors in (str(_copy(tmp_path)), validate(shipped.to_dict(), source="mine"), load_priors("rnn")):
        doc = json.loads(open(export_trace(trace_of([]), tmp_path / "e.json", priors=priors)).read())
        assert "content" in doc["priors"], priors
        assert load_session(tmp_path / "e.json").priors.fingerprint == as_priors(priors, "mlp").fingerprint


def test_a_reference_to_other_shipped_priors_loads_with_the_installed_ones_and_a_warning(tmp_path, caplog, capsys):
    """A session written by a version that shipped other priors: the trace is worth having,
    the writer's priors are nowhere to be had, so the installed ones answer, loudly."""
    from neuraldbg import cli
    from neuraldbg.causal.priors import load_priors

    dbg = _short_run()
    doc = json.loads(open(dbg.export_aquarium_package(tmp_path / "run.json")).read())
    doc["priors"]["fingerprint"], doc["neuraldbg_version"] = "ab" * 20, "0.0.1"
    (tmp_path / "old.json").write_text(json.dumps(doc))
    installed = load_priors("mlp").fingerprint
    with caplog.at_level("WARNING", logger="neuraldbg"):
        s = load_session(tmp_path / "old.json")
    [rec] = [r for r in caplog.records if "shipped mlp priors" in r.getMessage()]
    msg = rec.getMessage()
    assert rec.levelname == "WARNING" and str(tmp_path / "old.json") in msg and "ab" * 20 in msg
    assert installed in msg and "neuraldbg 0.0.1" in msg and "which are used instead" in msg
    assert s.priors.fingerprint == installed
    assert s.priors.source == f"mlp.json (shipped, {installed[:12]}; the session names {'ab' * 6})"
    _same_posterior(s.posterior(), dbg.posterior())
    assert cli.main(["explain", str(tmp_path / "old.json")]) == 0
    assert f"priors {s.priors.source}\n" in capsys.readouterr().out
    # an override takes its place, with nothing to warn about
    caplog.clear()
    with caplog.at_level("WARNING", logger="neuraldbg"):
        load_session(tmp_path / "old.json", priors=load_priors("mlp"))
    assert not caplog.records


def test_a_version_4_session_embedding_the_shipped_priors_loads_as_before(tmp_path):
    """Up to version 4 every session embedded its priors, the shipped ones included; such a
    session reads them from the file as before, and may not refer to shipped priors."""
    from neuraldbg.causal.priors import load_priors
    from neuraldbg.session import priors_block

    ev = [Event(OPTIMIZER, "divergence", None, 40, end_step=60, values={"nonfinite": 0.0})]
    doc = json.loads(open(export_trace(trace_of(ev), tmp_path / "s.json")).read())
    ref = doc["priors"]
    doc["version"], doc["priors"] = 4, priors_block(None, "mlp")  # what version 4 wrote
    assert doc["priors"]["source"] == "mlp.json" and "content" in doc["priors"]
    (tmp_path / "v4.json").write_text(json.dumps(doc))
    s = load_session(tmp_path / "v4.json")
    assert s.priors.source == "mlp.json (embedded)" and s.priors.fingerprint == load_priors("mlp").fingerprint
    _same_posterior(s.posterior(), load_session(tmp_path / "s.json").posterior())
    doc["priors"] = ref
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="bad.json: priors: missing required field 'source'"):
        load_session(tmp_path / "bad.json")
    doc["version"], doc["priors"] = 5, None  # a trace between ranks: the family's shipped priors
    (tmp_path / "null.json").write_text(json.dumps(doc))
    assert load_session(tmp_path / "null.json").priors is load_priors("mlp")


def test_a_default_cnn_session_stays_small(tmp_path):
    """Without the shipped priors copied in, a session is its trace: 200 steps of the zoo CNN
    come to about 13 KB (344 KB when it embedded them). A short run is trained here, its loss
    history then grown to the most a monitor keeps (512 points), so any run length is covered."""
    import models

    r = models.run("cnn", "healthy", 0, steps=10, monitor=True)
    p = r.dbg.export_aquarium_package(tmp_path / "cnn.json")
    doc = json.loads(open(p).read())
    assert doc["priors"]["shipped"] == "cnn"
    doc["loss"]["history"] = [[i, 1.2345678901234567 / (i + 1)] for i in range(512)]
    (tmp_path / "long.json").write_text(json.dumps(doc, indent=1))
    assert (tmp_path / "long.json").stat().st_size < 100_000
    _same_posterior(load_session(p).posterior(), r.dbg.posterior())


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
    doc = _embedding(tmp_path)
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
    p = export_trace(tr, tmp_path / "s.json", priors=str(_copy(tmp_path)))  # as version 3 did
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
    doc = _embedding(tmp_path)
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
    doc = _embedding(tmp_path, ev)
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
