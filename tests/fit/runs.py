"""A tiny benchmark output folder for the prior fitter's tests: records.csv and sessions/ of
healthy and NaN-batch runs (:func:`runs_dir`)."""
import csv

from neuraldbg.events.base import DATA, OPTIMIZER, make_event
from neuraldbg.session import export_trace
from neuraldbg.trace import Trace
from tests.traces import loss_summary, small_layers


def trace_of(kind, seed, family):
    decay = 0.97 + 0.001 * seed
    if kind == "healthy":
        return Trace(events=(), layers=small_layers(), family=family, first_step=0, last_step=59,
                     loss=loss_summary([0.7 * decay ** i for i in range(60)]))
    at = 20 + seed
    ev = (make_event(DATA, "nan", "fc1", at, 6.0, {"at_input": 1.0}, end_step=59),
          make_event(OPTIMIZER, "divergence", None, at, 6.0, {"nonfinite": 1.0}, end_step=59))
    return Trace(events=ev, layers=small_layers(), family=family, first_step=0, last_step=59,
                 loss=loss_summary([0.7 * decay ** i for i in range(at)] + [float("nan")] * (60 - at)))


def runs_dir(tmp_path, seeds=3, families=("mlp",), code=None):
    """A tiny benchmark output directory: records.csv + sessions/ (healthy and NaN-batch runs),
    recorded by this checkout's code (``code``: by that one; ``""``: not said)."""
    from neuraldbg.source import code_version

    code = code_version() if code is None else code
    d = tmp_path / "runs"
    rows = []
    for fam in families:
        for seed in range(seeds):
            for inj, cause, state in (("healthy", "", ""), ("data_nan", "data", "corrupted")):
                key = f"{fam}__{inj}__{seed}"
                export_trace(trace_of(inj, seed, fam), d / "sessions" / f"{key}.json")
                rows.append({"arch": fam, "family": fam, "injection": inj, "seed": seed, "true_cause": cause,
                             "true_state": state, "session": f"sessions/{key}.json", "error": "", "code": code})
    rows.append({"arch": "mlp", "family": "mlp", "injection": "lr_too_high", "seed": 0, "true_cause": "learning_rate",
                 "true_state": "too_high", "session": "", "error": "RuntimeError: boom", "code": code})
    with open(d / "records.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return d
