"""``python -m models``: list the zoo, or train one run.

    python -m models                     # every architecture and its injections, with truth
    python -m models rl lora             # only these architectures
    python -m models --json              # the same as JSON
    python -m models run rl lr_too_high --seed 1 [--steps N] [--monitor]
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import models
from models.symptoms import check


def listing(archs: list[str]) -> list[dict]:
    """One dict per architecture: family, task, default steps and bound injections."""
    out = []
    for a in archs:
        spec = models.get_arch(a)
        out.append({
            "arch": a,
            "family": spec.family,
            "task": spec.task,
            "steps": spec.config().steps,
            "notes": spec.notes,
            "injections": [
                {"name": i.name, "truth": "/".join(i.truth) if i.truth else "",
                 "onset": i.onset, "layer": i.layer, "symptom": i.symptom,
                 "description": i.description}
                for i in models.injections(a)
            ],
        })
    return out


def print_listing(rows: list[dict]) -> None:
    """Human-readable listing."""
    for row in rows:
        print(f"{row['arch']}  [family {row['family']}, {row['steps']} steps]  {row['task']}")
        w = max(len(i["name"]) for i in row["injections"])
        for i in row["injections"]:
            truth = i["truth"] or "-"
            onset = "-" if i["onset"] is None else str(i["onset"])
            layer = i["layer"] or "-"
            print(f"    {i['name']:<{w}}  {truth:<26} onset {onset:>4}  layer {layer:<24} "
                  f"({i['symptom']})")
        print()


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "run":
        p = argparse.ArgumentParser(prog="python -m models run", description="train one run")
        p.add_argument("arch")
        p.add_argument("injection", nargs="?", default="healthy")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--steps", type=int, default=None)
        p.add_argument("--monitor", action="store_true", help="train inside NeuralDbg")
        a = p.parse_args(argv[1:])
        try:
            r = models.run(a.arch, a.injection, a.seed, steps=a.steps, monitor=a.monitor or None)
            h = r if a.injection == "healthy" else models.run(a.arch, seed=a.seed, steps=a.steps)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        k = max(1, r.steps // 10)
        curve = [sum(r.losses[i:i + k]) / len(r.losses[i:i + k]) for i in range(0, r.steps, k)]
        print(f"{r.arch}/{r.injection} seed {r.seed}: {r.steps} steps in {r.wall_time:.2f}s "
              f"(+{r.setup_time:.2f}s setup); truth {r.truth}, onset {r.onset}, layer {r.layer}")
        shown = " ".join(f"{v:.3g}" if math.isfinite(v) else "nan" for v in curve)
        print(f"loss (10 chunks): {shown}")
        for name, pts in r.signals.items():
            vals = [v for _, v in pts]
            print(f"{name}: {vals[0]:.3g} -> {vals[-1]:.3g}")
        ok, why = check(r, h)
        print(f"symptom {r.symptom}: {'shown' if ok else 'NOT shown'} ({why})")
        if r.dbg is not None:
            for hyp in r.dbg.get_causal_hypotheses()[:3]:
                print(f"  hypothesis: {hyp}")
        return 0
    p = argparse.ArgumentParser(prog="python -m models", description="list the model zoo")
    p.add_argument("archs", nargs="*", help="architectures to list (default: all)")
    p.add_argument("--json", action="store_true", help="print JSON")
    a = p.parse_args(argv)
    try:
        rows = listing(a.archs or models.architectures())
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(rows, indent=2))
    else:
        print_listing(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
