"""The reference loss on fine-tunes, ours and nobody's (``python -m benchmarks.retention``).

For each run: the ``retention`` evidence the reference gives (with the share of its margin to
chance given up), ``P(healthy)`` before and after ``verify``, and what the learning-rate test
did: the training loss' relative change over the window's late part, the reference's, and
their ratio (reference gain per unit of training loss lost; ``docs/verification.md``).

* ``zoo lora`` -- the zoo's LoRA fine-tune onto a sub-language of its pre-training language,
  healthy and at 50x its learning rate (``lora_forgetting``), with its task-A reference.
* ``eco lora_gpt2`` -- the ecosystem's PEFT GPT-2, given a reference the suite itself does not
  pass: a held-out batch of its sibling pre-training chain. The fine-tune's chain has other
  successors for every token, so any rate that learns it overwrites the reference: forgetting
  that no learning rate causes, the case the trade rule must not blame on the rate.

Nothing here is fitted; the figures are the ones quoted in ``docs/verification.md``.
"""
from __future__ import annotations

import argparse
import math
from typing import Any

#: (suite, arch, injection, seeds) of the default sweep
RUNS = (("zoo", "lora", "healthy", range(5)), ("zoo", "lora", "lora_forgetting", range(5)),
        ("eco", "lora_gpt2", "healthy", range(4)), ("eco", "lora_gpt2", "lr_x100", (0, 3)))
#: reference records per run (every this many steps)
EVERY = 10


def _eco_reference(seed: int):
    """A held-out batch of the sibling chain the ecosystem's PEFT GPT-2 was pre-trained on."""
    from benchmarks.ecosystem import data, hf, lora

    src = data.MarkovTokens(seed + lora.SIBLING, vocab=hf.VOCAB, seq_len=hf.SEQ)
    src.gen.manual_seed(99)  # another stream of the same chain than pre-training drew
    ids = src.batch(64)
    return lambda model: model(input_ids=ids, labels=ids).loss


def measure(suite: str, arch: str, injection: str, seed: int) -> dict[str, Any]:
    """One monitored run with its reference, verified; the row described in the module docstring."""
    from neuraldbg.causal import api
    from neuraldbg.causal.nodes.causes import REFERENCE_FIRST, REFERENCE_TAIL, retention_fraction
    from neuraldbg.causal.nodes.run import chance_loss

    monitor: dict[str, Any] = {"snapshots": True, "reference_every": EVERY}
    if suite == "zoo":
        import models

        r = models.run(arch, injection, seed, monitor=monitor)
    else:
        from benchmarks import ecosystem as eco

        r = eco.run(arch, injection, seed, monitor={**monitor, "reference": _eco_reference(seed)})
    trace = r.dbg.trace()
    sigs = trace.signatures
    first, tail = sigs.number(REFERENCE_FIRST), sigs.number(REFERENCE_TAIL)
    frac = (retention_fraction(first, tail, chance_loss(sigs))
            if first is not None and tail is not None else None)
    v = r.dbg.verify(r.replay)
    test = next((t for t in v.tests if t.label == "learning_rate/too_high"), None)
    gain = test.reference_gain if test is not None else None
    imp = test.improvement if test is not None else None
    cost = -min(imp, 0.0) if imp is not None else None
    return {"suite": suite, "arch": arch, "injection": injection, "seed": seed,
            "retention": api.evidence(trace).observed.get("retention"), "fraction": frac,
            "p_healthy": v.posterior_before.p_healthy, "p_healthy_after": v.posterior.p_healthy,
            "lr_test": test.outcome if test is not None else None, "loss_change": imp, "reference_gain": gain,
            "ratio": gain / cost if gain is not None and cost else (math.inf if gain is not None else None)}


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "inf" if math.isinf(v) else f"{v:.3f}"
    return "" if v is None else str(v)


def main(argv: list[str] | None = None) -> int:
    """Run the sweep and print one markdown row per run."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.retention", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="seed 0 of each run only")
    args = p.parse_args(argv)
    from tqdm import tqdm

    todo = [(s, a, i, seed) for s, a, i, seeds in RUNS for seed in (list(seeds)[:1] if args.quick else seeds)]
    rows = [measure(*run) for run in tqdm(todo, desc="retention", unit="run")]
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |")
    print("| " + " | ".join("---" for _ in cols) + " |")
    for row in rows:
        print("| " + " | ".join(_fmt(row[c]) for c in cols) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
