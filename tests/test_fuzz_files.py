"""Fuzzing the files NeuralDBG reads: sessions, prior files, and the CLI on top of them.

A valid exported session (and a valid prior file) is mutated: fields dropped, retyped,
reordered and duplicated, numbers replaced by NaN/Inf/huge values, values nested deeply,
layer names made unicode, the text truncated. The property: loading either returns an object
on which every query answers, or raises ``ValueError``, never another exception and never
in more than 2 s. The CLI answers such a file with status 0, or 1 and one error line.

The seed is fixed (``derandomize``). ``NEURALDBG_FUZZ_EXAMPLES`` sets the examples per
property (200 by default; the long run uses 10000).
"""
import contextlib
import copy
import io
import json
import math
import os
import tempfile
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuraldbg import cli, load_session
from neuraldbg.causal import api
from neuraldbg.causal.priors import load_priors
from neuraldbg.events.base import ACTIVATION, DATA, FAILURE_TYPES, GRADIENT, OPTIMIZER, make_event
from neuraldbg.session import export_trace
from neuraldbg.trace import LayerInfo, LossSummary, Trace
from tests.tiny import signatures

EXAMPLES = int(os.environ.get("NEURALDBG_FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
LIMIT_S = 2.0
DEEP = "\u0000deep\u0000"


def rich_trace() -> Trace:
    """A trace with an event of every type, a non-finite loss and signatures of every kind."""
    layers = (LayerInfo("embed", "Embedding", 0, 640), LayerInfo("fc1", "Linear", 1, 2080),
              LayerInfo("act", "Tanh", 2, 0), LayerInfo("fc2", "Linear", 3, 130))
    ev = (make_event(DATA, "shift", "embed", 10, 25.0, {"scale_ratio": 982.0, "at_input": 1.0}, end_step=40),
          make_event(GRADIENT, "exploding", "fc1", 12, 6.0, {"grad_rms": float("inf")}, end_step=20, count=3),
          make_event(GRADIENT, "vanishing", "fc2", 30, 2.0, {"grad_rms": 1e-9}),
          make_event(ACTIVATION, "saturated", "act", 14, 0.9, {"saturated_frac": 0.9}, end_step=44),
          make_event(OPTIMIZER, "spike", None, 12, 27.0, {"robust_z": 27.0}, end_step=13),
          make_event(OPTIMIZER, "divergence", None, 40, 6.0, {"nonfinite": 1.0}, end_step=49),
          make_event(DATA, "nan", "fc1", 40, 6.0, {"at_input": 0.0}, end_step=49, rank=1))
    losses = [2.0 * 0.97 ** i for i in range(40)] + [float("nan")] * 10
    loss = LossSummary(n=50, first=2.0, last=float("nan"), min=min(losses[:40]), n_nonfinite=10,
                       first_nonfinite_step=40, history=tuple(enumerate(losses)))
    sigs = signatures({"every": 1, "init_scale_log10": 0.1, "init_scale_n": 3, "lr": (0.1, float("nan")),
                       "lr_peak": 0.1, "optimizer": "SGD", "out_features": 10, "step_ratio_max": 0.02,
                       "step_ratio_median": 0.01, "step_ratio_steps": 16}, steps={"step_ratio_median": 15})
    return Trace(events=ev, layers=layers, family="transformer", first_step=0, last_step=49, loss=loss,
                 rank=1, world_size=2, signatures=sigs)


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory() as d:
        yield d


@pytest.fixture(scope="module", params=["shipped", "embedded"])
def session_doc(workdir, request):
    """A session referring to the family's shipped priors (the default), or embedding a user's."""
    from neuraldbg.causal.priors import validate
    from neuraldbg.config import DetectorConfig

    priors = None if request.param == "shipped" else validate(load_priors("transformer").to_dict(), "mine.json")
    path = export_trace(rich_trace(), os.path.join(workdir, "base.json"), config=DetectorConfig().to_dict(),
                        priors=priors)
    with open(path) as f:
        doc = json.load(f)
    assert ("content" in doc["priors"]) == (request.param == "embedded")
    return doc


def prior_doc():
    return json.loads(json.dumps(load_priors("mlp").to_dict()))


# ---- mutations -------------------------------------------------------------------------------

SPECIAL = [float("nan"), float("inf"), float("-inf"), "nan", "inf", "-inf", 1e308, -1e308, 10 ** 30,
           -(10 ** 30), 2 ** 53 + 1, -1, 0, 1, 3.7, 3.0, -0.0, 5e-324, True, False, None, "", "x", [], {}]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6)


@st.composite
def mutation(draw):
    op = draw(st.sampled_from(["drop", "retype", "special", "duplicate", "reorder", "deep", "unicode",
                               "rename"]))
    return (op, draw(st.lists(st.integers(0, 10 ** 6), min_size=0, max_size=9)),
            draw(json_values), draw(st.sampled_from(SPECIAL)), draw(st.sampled_from([3, 63, 64, 70, 5000])),
            draw(st.text(min_size=0, max_size=6)))


def _walk(doc, choices):
    """(parent, key) of a node reached by following ``choices`` down from the root."""
    parent, key, node = None, None, doc
    for c in choices:
        if isinstance(node, dict) and node:
            k = sorted(node)[c % len(node)]
        elif isinstance(node, list) and node:
            k = c % len(node)
        else:
            break
        parent, key, node = node, k, node[k]
    return parent, key


def apply(doc, mut):
    op, choices, value, special, depth, text = mut
    parent, key = _walk(doc, choices)
    if parent is None:  # the root itself
        return value if op == "retype" else doc
    if op == "drop":
        del parent[key]
    elif op == "retype":
        parent[key] = value
    elif op == "special":
        parent[key] = special
    elif op == "duplicate":
        if isinstance(parent, list):
            parent.insert(key, copy.deepcopy(parent[key]))
        else:
            parent[key + "_copy"] = copy.deepcopy(parent[key])
    elif op == "reorder":
        node = parent[key]
        if isinstance(node, list):
            node.reverse()
        elif isinstance(node, dict):
            items = list(node.items())[::-1]
            node.clear()
            node.update(items)
    elif op == "deep":
        parent[key] = DEEP + str(depth)
    elif op == "unicode":
        parent[key] = text + "\u00e9\u6f22\U0001f600" + (parent[key] if isinstance(parent[key], str) else "")
    elif op == "rename":
        if isinstance(parent, dict):
            parent[text or "renamed"] = parent.pop(key)
        else:
            parent[key] = {text: parent[key]}
    return doc


def to_text(doc, ascii_only):
    text = json.dumps(doc, ensure_ascii=ascii_only)
    for n in (3, 63, 64, 70, 5000):  # deep nesting spliced in as text (json.dumps would recurse)
        text = text.replace(json.dumps(DEEP + str(n)), "[" * n + "1" + "]" * n)
    return text


@st.composite
def mutated_text(draw, base):
    doc = json.loads(json.dumps(base))  # a fresh copy: a JSON round trip is several times faster than deepcopy
    for mut in draw(st.lists(mutation(), min_size=1, max_size=3)):
        doc = apply(doc, mut)
    text = to_text(doc, draw(st.booleans()))
    cut = draw(st.sampled_from([None] * 8 + ["truncate", "garbage"]))
    if cut == "truncate":
        text = text[:draw(st.integers(0, len(text)))]
    elif cut == "garbage":
        i = draw(st.integers(0, len(text)))
        text = text[:i] + draw(st.text(max_size=4)) + text[i:]
    return text


def write(workdir, name, text):
    path = os.path.join(workdir, name)
    with open(path, "w", encoding="utf-8", errors="surrogatepass") as f:
        f.write(text)
    return path


def answer_every_query(s, workdir):
    assert all(e.count >= 1 and e.end_step >= e.step for e in s.events)
    s.events_frame()
    post = s.posterior()
    assert 0 <= post.p_healthy <= 1 and all(math.isclose(sum(d.values()), 1) for k, d in post.items()
                                            if k != "healthy")
    for h in s.get_causal_hypotheses():
        assert str(h) == h.description
    s.explain_failure()
    for ft in FAILURE_TYPES:
        s.explain_failure(ft)
        str(s.trace_causal_chain(ft))
    s.detect_coupled_failures()
    again = load_session(s.export_aquarium_package(os.path.join(workdir, "again.json")))
    assert again.events == s.events and again.priors.fingerprint == s.priors.fingerprint


# ---- properties ------------------------------------------------------------------------------

def test_fuzzed_sessions_load_and_answer_or_raise_value_error(workdir, session_doc):
    @FUZZ
    @given(mutated_text(session_doc))
    def prop(text):
        path = write(workdir, "fuzz.json", text)
        t0 = time.monotonic()
        try:
            s = load_session(path)
        except ValueError:
            pass
        else:
            answer_every_query(s, workdir)
        assert time.monotonic() - t0 < LIMIT_S

    prop()


def test_fuzzed_prior_files_load_and_answer_or_raise_value_error(workdir):
    trace = rich_trace()

    @FUZZ
    @given(mutated_text(prior_doc()))
    def prop(text):
        path = write(workdir, "priors.json", text)
        t0 = time.monotonic()
        try:
            pri = load_priors(path=path)
        except ValueError:
            pass
        else:
            post = api.posterior(trace, pri)
            assert 0 <= post.p_healthy <= 1
            api.hypotheses(trace, pri)
            for ft in FAILURE_TYPES:
                api.causal_chain(trace, ft, pri)
        assert time.monotonic() - t0 < LIMIT_S

    prop()


def test_fuzzed_sessions_through_the_cli_exit_0_or_1_with_one_line(workdir, session_doc):
    @FUZZ
    @given(mutated_text(session_doc))
    def prop(text):
        path = write(workdir, "cli.json", text)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(["explain", path])
        lines = err.getvalue().splitlines()
        errors = [ln for ln in lines if ln.startswith("neuraldbg: error: ")]
        assert "Traceback" not in err.getvalue()
        assert (rc, len(errors)) in ((0, 0), (1, 1)), err.getvalue()
        if rc == 0:
            assert "P(healthy)" in out.getvalue()

    prop()
