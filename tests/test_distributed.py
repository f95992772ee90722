"""DistributedDataParallel: one NeuralDbg per rank, per-rank exports merged into one session.

Two gloo processes on CPU (torch.multiprocessing spawn) run three scenarios in one process
group, to pay the start-up once: healthy, NaN input on rank 1 only, learning rate too high.
"""
import dataclasses
import pickle
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional as F

from neuraldbg import NeuralDbg, load_session, merge_sessions
from neuraldbg.distributed import merge_events
from neuraldbg.events.base import DATA, GRADIENT, OPTIMIZER, make_event

WORLD = 2
STEPS = 32
NAN_STEP = 20
SCENARIOS = {"healthy": 1e-2, "nan_rank1": 1e-2, "lr_high": 30.0}  # Adam learning rates


def _worker(rank, port, out_dir):
    import os

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        for name, lr in SCENARIOS.items():
            torch.manual_seed(0)  # the same initial weights on every rank, as DDP expects
            model = nn.parallel.DistributedDataParallel(
                nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3)))
            opt = torch.optim.Adam(model.parameters(), lr=lr)
            gen = torch.Generator().manual_seed(100 + rank)  # each rank its own shard of data
            with NeuralDbg(model, optimizer=opt) as dbg:
                for step in range(STEPS):
                    x = torch.randn(16, 8, generator=gen)
                    y = x[:, :3].argmax(dim=1)
                    if name == "nan_rank1" and rank == 1 and step == NAN_STEP:
                        x[0, 0] = float("nan")
                    opt.zero_grad()
                    loss = F.cross_entropy(model(x), y)
                    loss.backward()
                    dbg.record_loss(loss)
                    opt.step()
            dbg.export_aquarium_package(f"{out_dir}/{name}_rank{rank}.json")
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    mp.spawn(_worker, args=(_free_port(), str(out)), nprocs=WORLD, join=True)
    return {name: [str(out / f"{name}_rank{r}.json") for r in range(WORLD)] for name in SCENARIOS}


def test_each_rank_records_rank_and_world_size(runs):
    for r, path in enumerate(runs["lr_high"]):
        s = load_session(path)
        assert s.doc["rank"] == r and s.doc["world_size"] == WORLD
        assert s.events and all(e.rank == r for e in s.events)


def test_healthy_run_has_no_events_on_any_rank(runs):
    for path in runs["healthy"]:
        assert load_session(path).events == []
    merged = merge_sessions(runs["healthy"])
    assert merged.events == [] and merged.trace().world_size == WORLD


def test_nan_input_on_one_rank_is_kept_with_that_rank(runs):
    merged = merge_sessions(runs["nan_rank1"])
    data = [e for e in merged.events if e.type == DATA]
    first = data[0]
    assert (first.kind, first.rank, first.step, first.layer) == ("nan", 1, NAN_STEP, "0")
    assert first.measured["at_input"] == 1.0
    # rank 0 only gets NaN weights through the gradient all-reduce: born inside, a step later
    assert all(e.rank == 0 and e.measured["at_input"] == 0.0 for e in data[1:])
    assert merged.trace().signatures.as_dict()["merged_ranks"] == (0, 1)
    top = merged.get_causal_hypotheses()[0]
    assert (top.cause, top.state, top.onset_step) == ("data", "corrupted", NAN_STEP)
    onset = [e for e in top.evidence if e.step == top.onset_step and e.type == DATA]
    assert onset and onset[0].rank == 1  # the evidence at the onset names the rank
    assert top.origin_rank == 1 and "on rank 1" in str(top)


def test_lr_too_high_gives_the_same_events_on_all_ranks(runs):
    per_rank = [{(e.type, e.kind, e.layer) for e in load_session(p).events} for p in runs["lr_high"]]
    assert per_rank[0] and per_rank[0] & per_rank[1]
    merged = merge_sessions(runs["lr_high"])
    shared = [e for e in merged.events if e.rank is None]
    assert shared, "events every rank saw are deduplicated to rank None"
    assert len(merged.events) < sum(len(load_session(p).events) for p in runs["lr_high"])
    tops = [(h.cause, h.state) for h in (load_session(p).get_causal_hypotheses()[0] for p in runs["lr_high"])]
    top = merged.get_causal_hypotheses()[0]
    assert tops == [("learning_rate", "too_high")] * WORLD and (top.cause, top.state) == tops[0]


def test_merged_session_round_trips_and_answers_queries(runs, tmp_path):
    merged = merge_sessions(runs["nan_rank1"])
    path = merged.export_aquarium_package(tmp_path / "merged.json")
    back = load_session(path)
    key = lambda evs: [(e.type, e.kind, e.layer, e.step, e.end_step, e.count, e.rank) for e in evs]  # noqa: E731
    assert key(back.events) == key(merged.events)  # (values hold NaN losses: compare the records' identity)
    assert back.doc["world_size"] == WORLD and back.doc["rank"] is None


# ---- merge rules, without processes -------------------------------------------------------

def ev(type_, kind, layer, step, rank, **values):
    return make_event(type_, kind, layer, step, 1.0, values, rank=rank)


def test_merge_events_dedupes_simultaneous_and_keeps_local():
    r0 = [ev(GRADIENT, "exploding", "fc", 10, 0), ev(OPTIMIZER, "spike", None, 30, 0)]
    r1 = [ev(GRADIENT, "exploding", "fc", 11, 1), ev(DATA, "nan", "fc", 5, 1, at_input=1.0)]
    out = merge_events({0: r0, 1: r1})
    assert [(e.kind, e.rank, e.step) for e in out] == [("nan", 1, 5), ("exploding", None, 10), ("spike", 0, 30)]


def test_merge_events_tolerance_and_data_origin():
    r0 = [ev(GRADIENT, "vanishing", "fc", 10, 0), ev(DATA, "nan", "fc", 6, 0, at_input=0.0)]
    r1 = [ev(GRADIENT, "vanishing", "fc", 20, 1), ev(DATA, "nan", "fc", 5, 1, at_input=1.0)]
    out = merge_events({0: r0, 1: r1}, tolerance=2)
    assert all(e.rank is not None for e in out) and len(out) == 4


def test_merge_sessions_rejects_bad_input(runs):
    with pytest.raises(ValueError, match="at least one"):
        merge_sessions([])
    with pytest.raises(ValueError, match="duplicate ranks"):
        merge_sessions([runs["healthy"][0], runs["healthy"][0]])
    with pytest.raises(TypeError, match="expects session paths"):
        merge_sessions([42])


def test_the_merge_keeps_every_ranks_signatures_by_their_declared_rule():
    """Regression: the merge kept the lead rank's signatures only, so a reference loss or a
    step size measured on rank 1 alone was lost, and rank 0's values stood for the job."""
    from neuraldbg.distributed import merge_traces
    from neuraldbg.trace import LayerInfo
    from tests.tiny import make_trace

    layers = (LayerInfo("fc", "Linear", 0, 10),)
    r0 = make_trace([], layers, [1.0] * 20, sigs={"every": 1, "step_ratio_median": 0.01, "step_ratio_max": 0.02,
                                                  "lr_peak": 0.1}, rank=0, world_size=2)
    r1 = make_trace([], layers, [1.0] * 20, sigs={"every": 1, "step_ratio_median": 0.03, "step_ratio_max": 0.09,
                                                  "lr_peak": 0.1, "reference_first": 0.9, "reference_tail": 1.1,
                                                  "reference_n": 8}, rank=1, world_size=2)
    sigs = merge_traces([r0, r1]).signatures.as_dict()
    assert sigs["step_ratio_median"] == pytest.approx(0.02)      # median over the ranks
    assert sigs["step_ratio_max"] == 0.09                        # the fastest rank
    assert sigs["reference_tail"] == 1.1 and sigs["reference_n"] == 8  # only rank 1 measured it
    assert sigs["every"] == 1 and sigs["merged_ranks"] == (0, 1)


# ---- the live merge, with an in-memory store ----------------------------------------------

class _Store:
    """The part of a torch.distributed store the live merge uses."""

    def __init__(self):
        self.d = {}

    def set(self, k, v):
        self.d[k] = v if isinstance(v, bytes) else str(v).encode()

    def check(self, keys):
        return all(k in self.d for k in keys)

    def get(self, k):
        return self.d[k]

    def delete_key(self, k):
        return self.d.pop(k, None) is not None


def _trace(rank, steps=10, world=2):
    from neuraldbg.trace import LayerInfo
    from tests.tiny import make_trace

    return make_trace([ev(GRADIENT, "exploding", "fc", 3, rank)], (LayerInfo("fc", "Linear", 0, 10),),
                      [1.0] * steps, sigs={"every": 1}, rank=rank, world_size=world)


def test_live_merge_gathers_on_rank_0_like_merge_traces():
    from neuraldbg.distributed import merge_traces
    from neuraldbg.monitor.livemerge import LiveMerge

    store = _Store()
    r0, r1 = LiveMerge(store, 0, 2, 5.0), LiveMerge(store, 1, 2, 5.0)
    r1.prefix = r0.prefix  # the same monitor of each rank (one process plays both here)
    assert r1.finish(_trace(1)) is None  # published, no wait
    merged = r0.finish(_trace(0))
    assert merged == merge_traces([_trace(0), _trace(1)])
    assert store.d == {}  # rank 0 took what it read


def test_live_merge_names_a_silent_rank_from_its_last_autosave(tmp_path, caplog):
    import time

    from neuraldbg.monitor.livemerge import LiveMerge
    from neuraldbg.session import export_trace

    store = _Store()
    path = export_trace(_trace(1, steps=7), tmp_path / "rank1.json")
    r0 = LiveMerge(store, 0, 2, 0.2)
    store.set(r0.prefix + "entered/1", b"1")  # what LiveMerge.start announces on rank 1
    store.set(r0.prefix + "autosave/1", str(path).encode())
    t0 = time.monotonic()
    merged = r0.finish(_trace(0))
    assert time.monotonic() - t0 < 5  # the bounded wait, not a hang
    note = merged.signatures.as_dict()["unobserved_ranks"]
    assert note.startswith("rank 1 from step 6 on") and "rank1.json" in note
    assert merged.signatures.as_dict()["merged_ranks"] == (0, 1)
    assert "no trace from rank 1" in caplog.text
    bare_store = _Store()
    bare = LiveMerge(bare_store, 0, 2, 0.1)
    bare_store.set(bare.prefix + "entered/1", b"1")
    merged = bare.finish(_trace(0))  # entered, no autosave: unobserved from its start
    assert merged.signatures.as_dict()["unobserved_ranks"].startswith("rank 1 from its start on (no trace")


def test_live_merge_does_not_wait_out_the_timeout_for_a_rank_without_a_monitor():
    """Only rank 0 runs a monitor: rank 1 never announced one, so rank 0 names it after the
    entry grace instead of waiting the whole ``merge_timeout``."""
    import time

    from neuraldbg.monitor.livemerge import ENTRY_GRACE, LiveMerge

    t0 = time.monotonic()
    merged = LiveMerge(_Store(), 0, 2, 30.0).finish(_trace(0))
    assert time.monotonic() - t0 < ENTRY_GRACE + 1.0
    assert merged.signatures.as_dict()["unobserved_ranks"] == "rank 1 from its start on (it entered no monitor)"


def _rich_trace(rank, world=3):
    """A rank's trace holding every part the merge reads: events with values, layers with a
    role, a loss with a non-finite value, signatures with their steps, gaps, internal errors."""
    from neuraldbg.trace import LayerInfo, Signatures
    from tests.tiny import make_trace

    layers = (LayerInfo("fc1", "Linear", 0, 80), LayerInfo("norm", "LayerNorm", 1, 32, role="norm"),
              LayerInfo("fc2", "Linear", 2, 99))
    events = [ev(GRADIENT, "exploding", "fc1", 3, rank, grad_norm=12.5),
              ev(DATA, "nan", "fc1", 5 + 3 * rank, rank, at_input=1.0)]  # rank-local: 3 steps apart
    t = make_trace(events, layers, [2.0, 1.5, float("inf"), 1.25] * 3, rank=rank, world_size=world,
                   sigs={"every": 1, "step_ratio_median": 0.01 * (rank + 1), "lr_peak": 0.1},
                   sig_steps={"step_ratio_median": 4}, internal_errors=rank)
    sigs = Signatures(t.signatures.as_dict(), t.signatures.steps(), {"reference_tail": "no reference loss"})
    return dataclasses.replace(t, signatures=sigs)


def _live(store, world, timeout=5.0):
    """Every rank's live merge of one monitor (one process plays them all here)."""
    from neuraldbg.monitor.livemerge import LiveMerge

    merges = [LiveMerge(store, r, world, timeout) for r in range(world)]
    for m in merges[1:]:
        m.prefix = merges[0].prefix
    return merges


def test_a_trace_crosses_the_store_as_json_without_priors_and_merges_as_before(tmp_path):
    import json

    from neuraldbg.distributed import merge_traces
    from neuraldbg.session import load_session

    store = _Store()
    r0, r1, r2 = _live(store, 3)
    assert r1.finish(_rich_trace(1)) is None and r2.finish(_rich_trace(2)) is None
    raw = store.d[r1.prefix + "trace/1"]
    doc = json.loads(raw.decode("utf-8"))  # the session document, not a pickle
    assert doc["schema"] == "neuraldbg.session" and doc["priors"] is None and doc["rank"] == 1
    (tmp_path / "rank1.json").write_bytes(raw)  # a valid session file too, read with the shipped priors
    assert load_session(tmp_path / "rank1.json").trace() == _rich_trace(1)
    merged = r0.finish(_rich_trace(0))
    assert merged == merge_traces([_rich_trace(r) for r in range(3)])
    assert merged.signatures.as_dict()["merged_ranks"] == (0, 1, 2)
    assert "unobserved_ranks" not in merged.signatures.as_dict()
    assert store.d == {}


class _Hostile:
    """A payload that creates ``marker`` when unpickled: what anyone with store access could send."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return os.mkdir, (self.marker,)


def _payloads(marker):
    import json

    from neuraldbg.monitor.livemerge import encode_trace

    wrong_shape = json.dumps({"schema": "neuraldbg.session", "version": 4, "family": "mlp"}).encode()
    return {"malformed": (b"{not json", "not JSON"),
            "non-UTF-8": (b"\xff\xfe{}", "not UTF-8 JSON"),
            "wrong schema": (wrong_shape, "not a valid session document"),
            "another rank's": (encode_trace(_rich_trace(2)), "it is the trace of rank 2"),
            "another family's": (encode_trace(dataclasses.replace(_rich_trace(1), family="cnn")),
                                 "it is of family 'cnn'"),
            "hostile pickle": (pickle.dumps(_Hostile(marker)), "not UTF-8 JSON (a pickle, which is never loaded)"),
            "hostile pickle, protocol 0": (pickle.dumps(_Hostile(marker), protocol=0), "not JSON")}


@pytest.mark.parametrize("kind", ["malformed", "non-UTF-8", "wrong schema", "another rank's", "another family's",
                                  "hostile pickle", "hostile pickle, protocol 0"])
def test_a_refused_payload_names_its_rank_unobserved_and_keeps_the_others(kind, tmp_path, caplog):
    """A payload that is not rank 1's trace of this job is logged, rank 1 is named unobserved,
    and ranks 0 and 2 are merged; nothing raises into the training loop."""
    import logging

    from neuraldbg.distributed import merge_traces

    marker = tmp_path / "marker"
    payload, why = _payloads(marker)[kind]
    store = _Store()
    r0, _, r2 = _live(store, 3, timeout=1.0)
    store.set(r0.prefix + "entered/1", b"1")
    store.set(r0.prefix + "trace/1", payload)
    r2.finish(_rich_trace(2))
    with caplog.at_level(logging.WARNING, logger="neuraldbg"):
        merged = r0.finish(_rich_trace(0))
    assert not marker.exists()
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("refused rank 1's trace in the process-group store" in m and why in m for m in warning), warning
    sigs = merged.signatures.as_dict()
    note = sigs["unobserved_ranks"]
    assert note.startswith(f"rank 1 from its start on (its trace in the store was refused: {why}"), note
    assert note.endswith("; no autosave)"), note
    assert sigs["merged_ranks"] == (0, 2)
    assert merged == dataclasses.replace(merge_traces([_rich_trace(0), _rich_trace(2)]),
                                         signatures=merged.signatures)
    assert [(e.kind, e.step) for e in merged.events if e.rank == 2] == [("nan", 11)]  # rank 2 local event kept


def test_a_hostile_payload_in_the_store_runs_no_code(tmp_path):
    """Rank 0 used to unpickle whatever the store held under a rank's key: a process able to
    write to the store ran code in rank 0. The payload is now read as JSON and refused."""
    marker = tmp_path / "marker"
    payload = pickle.dumps(_Hostile(marker))
    store = _Store()
    r0, _ = _live(store, 2, timeout=1.0)
    store.set(r0.prefix + "entered/1", b"1")
    store.set(r0.prefix + "trace/1", payload)
    merged = r0.finish(_rich_trace(0, world=2))
    assert not marker.exists()
    assert merged.signatures.as_dict()["unobserved_ranks"].startswith("rank 1 from its start on (its trace in the "
                                                                      "store was refused: not UTF-8 JSON (a pickle")
    pickle.loads(payload)  # what the old merge did with it
    assert marker.exists(), "the payload is hostile: unpickling it creates the marker"


def test_a_refused_rank_is_merged_from_its_last_autosave(tmp_path, caplog):
    from neuraldbg.session import export_trace

    path = export_trace(_rich_trace(1), tmp_path / "rank1.json")
    store = _Store()
    r0, _, r2 = _live(store, 3, timeout=1.0)
    store.set(r0.prefix + "entered/1", b"1")
    store.set(r0.prefix + "autosave/1", str(path).encode())
    store.set(r0.prefix + "trace/1", b"{not json")
    r2.finish(_rich_trace(2))
    merged = r0.finish(_rich_trace(0))
    sigs = merged.signatures.as_dict()
    assert sigs["merged_ranks"] == (0, 1, 2)
    assert sigs["unobserved_ranks"] == (f"rank 1 from step 11 on (its trace in the store was refused: not JSON; "
                                        f"its last autosave, {path}, is merged)")
    assert "refused rank 1's trace" in caplog.text
    # the autosave path came through the store as well: one that would not merge is refused too
    other = export_trace(dataclasses.replace(_rich_trace(1), family="cnn"), tmp_path / "other.json")
    r0, _, r2 = _live(store, 3, timeout=1.0)
    store.set(r0.prefix + "autosave/1", str(other).encode())
    store.set(r0.prefix + "trace/1", b"{not json")
    r2.finish(_rich_trace(2))
    sigs = r0.finish(_rich_trace(0)).signatures.as_dict()
    assert sigs["merged_ranks"] == (0, 2)
    assert sigs["unobserved_ranks"] == (f"rank 1 from its start on (its trace in the store was refused: not JSON; "
                                        f"its autosave {other} was refused: it is of family 'cnn', not 'mlp')")


def test_merge_timeout_is_validated():
    with pytest.raises(ValueError, match="merge_timeout"):
        NeuralDbg(nn.Linear(2, 2), merge_timeout=-1)
    with pytest.raises(ValueError, match="merge_timeout"):
        NeuralDbg(nn.Linear(2, 2), merge_timeout=float("inf"))
    assert NeuralDbg(nn.Linear(2, 2), merge_timeout=0).settings.merge_timeout == 0.0
