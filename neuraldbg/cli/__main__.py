"""``python -m neuraldbg.cli``: the same command line as the ``neuraldbg`` script."""
import sys

from neuraldbg.cli import main

sys.exit(main())
