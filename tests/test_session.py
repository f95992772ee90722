import json

import pytest
from hypothesis import given, settings, strategies as st

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
    assert doc["schema"] == "neuraldbg.session" and doc["version"] == 1
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


def test_events_frame_columns():
    from neuraldbg.session import events_frame

    df = events_frame([Event(DATA, "nan", "fc1", 30, values={"nan_count": 2})])
    assert list(df.columns[:8]) == ["type", "kind", "layer", "step", "end_step", "count", "severity", "rank"]
    assert df.loc[0, "value_nan_count"] == 2
    assert list(events_frame([]).columns)[:3] == ["type", "kind", "layer"]
