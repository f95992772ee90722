"""``python -m benchmarks {run,report} ...``: dispatch to one parser per command."""
from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    """Parse the command and hand its arguments to that command's module."""
    from benchmarks import harness, log_to_stderr, report

    parser = argparse.ArgumentParser(prog="python -m benchmarks",
                                     description="NeuralDBG failure-injection benchmark")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{run,report}")
    commands = {
        "run": (harness, "run the zoo with injected failures and record the diagnoses"),
        "report": (report, "write DIR/REPORT.md and plots from stored records"),
    }
    for name, (module, help_) in commands.items():
        module.add_arguments(sub.add_parser(name, help=help_, description=help_))
    args = parser.parse_args(argv)
    log_to_stderr(logging.INFO if args.verbose else logging.WARNING)
    from benchmarks.executors import ExecutorError

    try:
        return commands[args.command][0].main(args)
    except (ValueError, FileNotFoundError, ExecutorError) as exc:  # bad arguments, folder or executor: a message
        if args.verbose:
            raise
        parser.exit(2, f"python -m benchmarks {args.command}: error: {exc}\n")


if __name__ == "__main__":
    sys.exit(main())
