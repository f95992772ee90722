"""``make demo``: a tiny MLP trained twice, healthy and with a broken setup, explained.

    python -m neuraldbg.demo [--arch mlp|cnn|transformer] [--fault SCENARIO] [--seed N]
"""
from __future__ import annotations

import argparse
import logging

import torch

from neuraldbg.examples import ARCHS, SCENARIOS, train_example


def describe(title: str, run) -> None:
    """Print a run's loss, its events and (when the causal engine answers) its diagnosis."""
    dbg = run.dbg
    print(f"\n=== {title}: loss {run.losses[0]:.3f} -> {run.losses[-1]:.3g} over {len(run.losses)} steps")
    events = dbg.events
    if not events:
        print("  no events")
    for e in events[:10]:
        print(f"  - {e}")
    if len(events) > 10:
        print(f"  ... and {len(events) - 10} more (dbg.events_frame() has them all)")
    try:
        post = dbg.posterior()
        print(f"  P(healthy) = {post.p_healthy:.2f}: {'healthy' if post.is_healthy else 'not healthy'}")
        for h in dbg.get_causal_hypotheses()[:3]:
            print(f"  * {h}")
            print(f"    fix: {h.suggested_fix}")
    except Exception as e:  # noqa: BLE001 - the demo still shows events without the engine
        logging.getLogger("neuraldbg").warning("causal diagnosis unavailable: %r", e)


def main(argv: list[str] | None = None) -> None:
    """Run the demo."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="mlp", choices=ARCHS)
    ap.add_argument("--fault", default="lr_too_high", choices=[s for s in SCENARIOS if s != "healthy"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=150)
    a = ap.parse_args(argv)
    from neuraldbg.cli import _log_to_stderr

    _log_to_stderr(logging.WARNING)
    torch.set_num_threads(1)
    print(f"NeuralDBG demo: a tiny {a.arch} on a generated task, seed {a.seed}")
    describe("healthy run", train_example(a.arch, "healthy", a.seed, a.steps))
    truth = SCENARIOS[a.fault]
    describe(f"broken run ({a.fault}; injected root cause {truth[0]}/{truth[1]})",
             train_example(a.arch, a.fault, a.seed, a.steps))


if __name__ == "__main__":
    main()
