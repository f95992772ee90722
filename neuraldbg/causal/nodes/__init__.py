"""Every node of the network and every signature, declared together, one module per topic.

Each module here may define ``NODES`` (latent and evidence nodes; an evidence node carries its
extractor), ``SIGNATURES`` (the measured quantities its extractors read, see
:class:`neuraldbg.trace.Signature`), ``PRECONDITIONS`` (what a root state needs of the run to
be possible at all, :class:`neuraldbg.causal.structure.Precondition`) and ``ORDER`` (where its
nodes stand among the others: the order readings are listed in; default 100). :func:`nodes`,
:func:`preconditions` and :func:`signature_table` collect them from every module of this
package: adding a node or a signature is one entry in one module (``docs/architecture.md``,
"adding a signature"). Pure Python: no torch, no pgmpy.
"""
from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType
from typing import Any, Mapping

from neuraldbg.trace import Signature

_MODULES: list[ModuleType] = []
_TABLE: dict[str, Signature] = {}


def modules() -> list[ModuleType]:
    """The node modules of this package, imported once, sorted by their ``ORDER``, then name."""
    if not _MODULES:
        names = [m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")]
        found = [importlib.import_module(f"{__name__}.{n}") for n in names]
        _MODULES.extend(sorted(found, key=lambda m: (getattr(m, "ORDER", 100), m.__name__)))
    return _MODULES


def nodes() -> tuple[Any, ...]:
    """Every declared node (latent and evidence), in module order then declaration order."""
    return tuple(n for m in modules() for n in getattr(m, "NODES", ()))


def preconditions() -> tuple[Any, ...]:
    """Every declared precondition of a root state (:class:`neuraldbg.causal.structure.Precondition`)."""
    return tuple(p for m in modules() for p in getattr(m, "PRECONDITIONS", ()))


def signature_table() -> Mapping[str, Signature]:
    """Every declared signature by name: the one table the monitor, the session schema, the
    merge of ranks and the readers check against."""
    if not _TABLE:
        table: dict[str, Signature] = {}
        for m in modules():
            for sig in getattr(m, "SIGNATURES", ()):
                if sig.name in table and table[sig.name] != sig:
                    raise ValueError(f"signature {sig.name!r} is declared twice ({m.__name__})")
                table[sig.name] = sig
        _TABLE.update(table)
    return _TABLE


#: names of older session files (versions 1 and 2 only), read under their current name; from
#: version 3 on ``step_ratio_peak`` is a signature of its own (the median layer's largest step)
RENAMED: dict[str, str] = {"step_ratio_peak": "step_ratio_median"}


def check_signature(name: str, value: Any) -> Any:
    """``value`` checked against the declaration of ``name`` (normalized); ``KeyError`` naming
    the declared signatures for an undeclared name, ``ValueError`` for a bad value."""
    sig = signature_table().get(name)
    if sig is None:
        raise KeyError(f"undeclared signature {name!r}: declare it in neuraldbg/causal/nodes/ "
                       f"(declared: {', '.join(sorted(signature_table()))})")
    return sig.check(value)
