"""The monitor's view of ``torch.compile``: whether a hook runs while dynamo traces it, and the
hook guards that keep a graph traced without the monitor's hooks from being reused."""
from __future__ import annotations

import logging
import sys

import torch

log = logging.getLogger("neuraldbg")


def guard_compiled_hooks() -> None:
    """Make torch.compile guard on module hooks.

    By default dynamo does not guard on hooks, so a graph traced before our hooks existed (an
    earlier instance of the same class, say) is reused for the monitored module and every
    hook is silently skipped. The first monitor in a process that already loaded dynamo turns
    the hook guards on and drops the compiled graphs once (they recompile on next call, now
    guarded); later monitors find the guards on and do nothing. Without dynamo loaded there is
    nothing stale, and importing it would cost a second.
    """
    if "torch._dynamo" not in sys.modules:
        return
    try:
        dynamo = sys.modules["torch._dynamo"]
        if getattr(dynamo.config, "skip_nnmodule_hook_guards", False):
            dynamo.config.skip_nnmodule_hook_guards = False
            dynamo.reset()
            log.info("neuraldbg: turned on torch.compile hook guards and cleared compiled graphs once, "
                     "so graphs traced without the monitor's hooks are not reused")
    except Exception:  # noqa: BLE001 - a torch without this switch has no such cache issue
        pass


def _compiling() -> bool:
    try:
        return bool(torch.compiler.is_compiling())
    except Exception:  # noqa: BLE001 - old torch
        return False


#: torch.compiler.is_compiling, looked up once (it runs once per module per checked step)
is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or _compiling
