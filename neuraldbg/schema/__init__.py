"""One schema for the files NeuralDBG reads: exported sessions and prior files.

Everything that comes from outside is checked here, once, at load: types, ranges and
required keys of every field, size and nesting limits, and for prior files that every CPD
column sums to 1 and no state is impossible under every parent configuration. A violation
raises a ``ValueError`` subclass (:class:`SessionFormatError`, :class:`PriorError`) whose
message reads ``FILE: FIELD: what is wrong; valid: ...`` with ``FIELD`` a JSON path such as
``events[3].layer``. The checkers return normalized plain data (non-finite spellings decoded,
defaults filled in), so readers build their records without further checks.

:mod:`.base` holds the limits, the errors, the typed field checks and the guarded JSON
reader; :mod:`.session` the session schema; :mod:`.priors` the prior-file schema. Pure
Python (no torch, numpy or pgmpy) and no import of the causal engine: the network's node
declarations are handed in by :mod:`neuraldbg.causal.priors`. The formats are documented in
``docs/session_format.md`` and ``docs/priors.md``.
"""
from __future__ import annotations

from neuraldbg.schema.base import (FILE_SUM_TOL, MAX_BYTES, MAX_DEPTH, MAX_INT, PRIOR_SCHEMA_VERSION, SESSION_SCHEMA,
                                   SESSION_VERSIONS, Checker, PriorError, SchemaError, SessionFormatError, join,
                                   read_json, show, too_deep)
from neuraldbg.schema.priors import PRIOR_KEYS, check_priors, network_mismatch
from neuraldbg.schema.session import check_session

__all__ = ["FILE_SUM_TOL", "MAX_BYTES", "MAX_DEPTH", "MAX_INT", "PRIOR_KEYS", "PRIOR_SCHEMA_VERSION",
           "SESSION_SCHEMA", "SESSION_VERSIONS", "Checker", "PriorError", "SchemaError", "SessionFormatError",
           "check_priors", "check_session", "join", "network_mismatch", "read_json", "show", "too_deep"]
