"""Re-stamp the shipped prior files for this version's network, between two refits.

``python -m neuraldbg.fit.restamp [FILE ...]`` (default: every shipped family file) records the
current network's fingerprint in each file, drops the fitted tables whose node is gone or has
other parents or states now (the hand-set ones stand in until ``make priors`` refits them, and
the file says so in ``provenance.restamped``), and adds hand-set priors for roots added since
(:data:`NEW_ROOTS`). A prior file for another network is refused at load (``docs/priors.md``):
this is how a developer who changed the network keeps the shipped ones loadable.
"""
from __future__ import annotations

import json
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from neuraldbg.causal.structure import Network, default_network
from neuraldbg.jsonio import write_text_atomic
from neuraldbg.vocab import FAMILIES

#: hand-set root priors of roots a file may lack, with their reasoning
NEW_ROOTS: dict[str, tuple[dict[str, float], str]] = {
    "training_loop": ({"ok": 0.9, "stale_gradients": 0.025, "params_not_in_optimizer": 0.025,
                       "graph_detached": 0.025, "loss_on_probabilities": 0.025},
                      "Loop bugs (zero_grad never called, an optimizer on part of the model, a no_grad/detach "
                      "cutting a module from the loss, a softmax in front of CrossEntropyLoss) are common in "
                      "hand-written loops; each has a direct signature, so the prior matters only where it is "
                      "unobserved."),
    "numerics": ({"ok": 0.97, "overflow": 0.015, "updates_lost": 0.015},
                 "Numbers that leave their precision (fp16 overflow, an Adam eps that rounds to zero, bf16 weights "
                 "whose updates round away) are a fault of low-precision and hand-tuned runs; each shows in its own "
                 "signature (the birthplace of the first non-finite value, the share of updates lost), and a "
                 "precondition rules each out where the run lacks it (a non-finite value the run made, 16-bit "
                 "weights), so the prior matters only where those are seen."),
    "unexplained": ({"ok": 0.97, "not_learning": 0.03},
                    "A leak: runs that do not learn for a reason outside the model (a bottleneck, a wrong loss). "
                    "Small, so that a stall goes to it only when no modeled cause explains it."),
}


def _fits(net: Network, name: str, spec: Any) -> bool:
    node = net.node_by_name.get(name)
    return node is not None and isinstance(spec, dict) and \
        list(spec.get("parents", node.parents)) == list(node.parents) and \
        list(spec.get("states", node.states)) == list(node.states)


def restamp(doc: dict[str, Any], network: Network | None = None) -> list[str]:
    """Fit ``doc`` (a prior file's content) to ``network`` in place; returns what was replaced."""
    net = network if network is not None else default_network()
    replaced = sorted(k for k, v in doc.get("cpds", {}).items() if not _fits(net, k, v))
    doc["cpds"] = {k: v for k, v in doc.get("cpds", {}).items() if _fits(net, k, v)}
    base = doc.get("provenance", {}).get("base")
    if isinstance(base, dict) and "cpds" in base:
        base["cpds"] = {k: v for k, v in base["cpds"].items() if _fits(net, k, v)}
    for var in net.roots:
        if var not in doc["roots"]:
            dist, why = NEW_ROOTS[var]
            doc["roots"][var] = dict(dist)
            doc.setdefault("reasoning", {})[var] = why
            replaced.append(f"root {var}")
    if doc.get("network") != net.fingerprint and replaced:
        doc.setdefault("provenance", {})["restamped"] = (
            f"network {net.fingerprint[:8]}: {', '.join(replaced)} replaced by the hand-set values until the next "
            "refit (make priors)")
    doc["network"] = net.fingerprint
    return replaced


def main(argv: list[str] | None = None) -> int:
    """Re-stamp the given prior files, or every shipped family file."""
    paths = [Path(p) for p in (sys.argv[1:] if argv is None else argv)] or \
        [Path(str(resources.files("neuraldbg.priors").joinpath(f"{f}.json"))) for f in FAMILIES]
    for p in paths:
        doc = json.loads(p.read_text(encoding="utf-8"))
        replaced = restamp(doc)
        write_text_atomic(p, json.dumps(doc, indent=1) + "\n")
        print(f"{p}: {', '.join(replaced) if replaced else 'fingerprint only'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
