"""A stand-in zoo and monitor so the harness and report are tested without training anything."""
from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks.metrics import ROOT_STATES
from neuraldbg.events.base import Event


@dataclass(frozen=True)
class FakeInjection:
    name: str
    truth: tuple[str, str] | None
    onset: int | None
    layer: str | None


INJECTIONS = [
    FakeInjection("healthy", None, None, None),
    FakeInjection("lr_too_high", ("learning_rate", "too_high"), 0, None),
    FakeInjection("data_nan", ("data", "corrupted"), 30, "fc1"),
    FakeInjection("broken", ("architecture", "unstable"), None, None),
]
EVENTS = {
    "healthy": [],
    "lr_too_high": [Event("optimizer_instability", "divergence", None, 3),
                    Event("gradient_health_transition", "exploding", "fc2", 4)],
    "data_nan": [Event("data_anomaly", "nan", "fc1", 30)],
}


class FakeDbg:
    """Answers the monitor queries the harness uses, with a posterior drawn from the seed."""

    family = "mlp"

    def __init__(self, injection: FakeInjection, seed: int):
        rng = np.random.default_rng(seed)
        self.events = EVENTS[injection.name]
        self._post = {v: dict.fromkeys(ss, 0.0) for v, ss in ROOT_STATES.items()}
        for v in self._post:
            self._post[v]["ok"] = 1.0
        if injection.truth:
            v, s = injection.truth
            p = float(rng.uniform(0.6, 0.95))
            self._post[v] = {st: (p if st == s else (1 - p if st == "ok" else 0.0)) for st in ROOT_STATES[v]}
            self._p_healthy = 1 - p
        else:
            self._p_healthy = float(rng.uniform(0.8, 0.99))
            self._post["learning_rate"] = {"ok": self._p_healthy, "too_high": 1 - self._p_healthy, "too_low": 0.0}
        self._inj = injection

    def posterior(self):
        d = {v: dict(ps) for v, ps in self._post.items()}
        d["healthy"] = {"yes": self._p_healthy, "no": 1 - self._p_healthy}
        return d

    def get_causal_hypotheses(self):
        if not self._inj.truth:
            return []
        v, s = self._inj.truth
        return [SimpleNamespace(cause=v, state=s, probability=self._post[v][s], failure_type="data_anomaly",
                                origin_layer=self._inj.layer, onset_step=self._inj.onset,
                                evidence=tuple(self.events))]

    def export_aquarium_package(self, path):
        with open(path, "w") as f:
            json.dump({"schema": 1, "events": [e.to_dict() for e in self.events],
                       "loss": {"first": 2.0, "last": 0.5, "n_nonfinite": 0}}, f)


class FakeZoo:
    """``models`` look-alike: two architectures, four injections (one raises)."""

    def __init__(self):
        self.calls = []

    def architectures(self):
        return ["toy_a", "toy_b"]

    def injections(self, arch):
        return list(INJECTIONS)

    def run(self, arch, injection, seed, steps=None, monitor=None):
        self.calls.append((arch, injection, seed, bool(monitor)))
        inj = next(i for i in INJECTIONS if i.name == injection)
        if injection == "broken":
            raise RuntimeError("injected harness failure")
        return SimpleNamespace(losses=[2.0, 1.0, 0.5], steps=steps or 3, wall_time=0.01 * (1.2 if monitor else 1.0),
                               truth=inj.truth, dbg=FakeDbg(inj, seed) if monitor else None)


@pytest.fixture
def fake_zoo(monkeypatch):
    """Install a :class:`FakeZoo` as the ``zoo`` suite (in-process runs only)."""
    zoo = FakeZoo()
    import benchmarks.harness as h
    import benchmarks.suites as s

    monkeypatch.setattr(s, "_zoo", lambda: zoo)
    monkeypatch.setattr(h, "_WARM", set())
    return zoo
