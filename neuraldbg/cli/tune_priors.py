"""``neuraldbg tune-priors``: fit a family's prior file to the runs of a benchmark folder
(:func:`neuraldbg.fit.tune`), write it and print the held-out check."""
from __future__ import annotations

import argparse
from typing import Any

from neuraldbg.cli import UserError, fail, wrote


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``neuraldbg tune-priors`` subcommand (registered by ``neuraldbg/cli/__init__.py``)."""
    from neuraldbg.fit import DEFAULT_ESS, DEFAULT_FOLDS

    p = sub.add_parser(
        "tune-priors", help="fit a family's prior file to benchmark runs",
        description="Fit the causal network's CPDs of one family to the runs of a benchmark output "
                    "directory (records.csv + sessions/), check hand-set vs fitted on held-out folds "
                    "(by seed), and write a prior file usable as NeuralDbg(priors=FILE). See docs/priors.md.")
    p.add_argument("--family", required=True, help="architecture family to fit (mlp, cnn, ...)")
    p.add_argument("--runs", required=True, metavar="DIR", help="benchmark output directory")
    p.add_argument("--out", required=True, metavar="FILE", help="prior file to write (JSON)")
    p.add_argument("--ess", type=float, default=DEFAULT_ESS,
                   help=f"equivalent sample size of the hand-set tables, per parent configuration "
                        f"(default {DEFAULT_ESS:g})")
    p.add_argument("--folds", type=int, default=DEFAULT_FOLDS,
                   help=f"held-out folds, grouped by seed; 0 skips the check and the temperature "
                        f"(default {DEFAULT_FOLDS})")
    p.add_argument("--base", metavar="FILE", default=None,
                   help="prior file to start from and shrink toward (default: the family's shipped file)")
    p.add_argument("--no-temperature", action="store_true", help="keep temperature 1 instead of fitting it")
    p.add_argument("--temperature-criterion", choices=("prior_mix", "benchmark"), default="prior_mix",
                   help="held-out log loss the temperature minimizes: on the runs reweighted to the root "
                        "priors' label mix (default), or on the benchmark's own mix")
    p.add_argument("--seed", type=int, default=0, help="seed of the fold assignment (default 0)")
    p.add_argument("--allow-stale", action="store_true",
                   help="fit runs recorded by other code than this checkout's (refused by default: their "
                        "sessions hold the events the monitor recorded then)")
    p.set_defaults(func=run_tune)
    return p


def run_tune(args: argparse.Namespace) -> int:
    """Fit, write the prior file, print a summary; 1 when the runs or settings are unusable."""
    from neuraldbg.causal.priors import PriorError
    from neuraldbg.fit import TuneError, tune
    from neuraldbg.jsonio import new_folders
    from neuraldbg.vocab import FAMILIES

    if args.family not in FAMILIES:
        return fail(UserError(f"unknown family {args.family!r}; valid: {', '.join(FAMILIES)}"), args)
    if args.folds == 1 or args.folds < 0:
        return fail(UserError(f"--folds must be 0 or >= 2, got {args.folds}"), args)
    try:
        res = tune(args.runs, args.family, ess=args.ess, folds=args.folds, base=args.base,
                   temperature=not args.no_temperature, seed=args.seed,
                   criterion=args.temperature_criterion, allow_stale=args.allow_stale)
        created = new_folders(args.out)
        path = res.write(args.out)
    except (TuneError, PriorError, OSError) as exc:
        return fail(exc, args)
    fo = res.data["provenance"]["fitted_on"]
    print(f"Fitted {args.family} on {fo['records']} runs ({len(fo['architectures'])} architectures, "
          f"seeds {fo['seeds']}): EM {res.fit.iterations} iterations, "
          f"train log-likelihood {res.fit.log_likelihood_start:.2f} -> {res.fit.log_likelihood:.2f}")
    if res.heldout:
        h = res.heldout
        print(f"Held-out ({h['folds']} folds by {h['grouping']}), temperature {res.data['temperature']:g}:")
        print(f"  {'':16s} {'log loss':>9s} {'Brier':>7s} {'ECE':>7s} {'top-1':>7s} {'mix log loss':>13s}")
        for name in ("hand_set", "fitted", "fitted_tempered"):
            m = h[name]
            print(f"  {name:16s} " + " ".join(f"{m[k]:{w}.3f}" if m.get(k) is not None else f"{'-':>{w}s}"
                                              for k, w in (("log_loss", 9), ("brier", 7), ("ece", 7), ("top1", 7),
                                                          ("mix_log_loss", 13))))
    else:
        print("No held-out check (--folds 0 or too few runs).")
    print(wrote(path, created))
    return 0
