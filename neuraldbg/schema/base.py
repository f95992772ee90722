"""The schema's common parts: limits, errors, typed field checks, and the guarded JSON reader."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

MAX_BYTES = 1 << 30
#: Deepest nesting of arrays and objects accepted (a session needs 7 levels).
MAX_DEPTH = 64
#: Largest magnitude of an integer field (steps, counts): exactly representable as a float.
MAX_INT = 2 ** 53

SESSION_SCHEMA = "neuraldbg.session"
#: Session schema versions this version reads (1: priors named by path; 2: priors embedded;
#: 3: declared signatures, each with the step it was measured by, under ``signatures``; 4: ``gaps``
#: and ``internal_errors``; 5: the family's shipped priors referred to by fingerprint, not embedded;
#: 6: the monitor's ``cadence``, which steps it checked).
SESSION_VERSIONS = (1, 2, 3, 4, 5, 6)
#: Prior-file schema this version reads and writes (2: the file records the fingerprint of the
#: network it was written for; version 1 files record none and are refused).
PRIOR_SCHEMA_VERSION = 2
#: Tolerance on probability sums in a prior file; the values are then renormalized exactly.
FILE_SUM_TOL = 1e-6

NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class SchemaError(ValueError):
    """A file is not valid; ``file`` and ``field`` (a JSON path) say where, when known."""

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.file, self.field = file, field


class SessionFormatError(SchemaError):
    """A session file (or document) is not a valid NeuralDBG session."""


class PriorError(SchemaError):
    """A prior file is missing, unreadable or invalid."""


class Checker:
    """Typed field checks that raise ``error`` naming ``file`` and the field's JSON path."""

    def __init__(self, file: str, error: type[SchemaError] = SessionFormatError, prefix: str = "") -> None:
        self.file, self.error, self.prefix = file, error, prefix

    def fail(self, path: str, msg: str) -> SchemaError:
        """The error for field ``path`` (relative to ``prefix``)."""
        full = path if not self.prefix else self.prefix if not path else \
            self.prefix + path if path.startswith("[") else f"{self.prefix}.{path}"
        return self.error(f"{self.file}: {full}: {msg}" if full else f"{self.file}: {msg}",
                          file=self.file, field=full or None)

    def obj(self, x: Any, path: str, required: tuple = (), optional: tuple = ()) -> dict:
        """``x`` must be an object holding every ``required`` key and no key outside both lists."""
        if not isinstance(x, dict):
            raise self.fail(path, f"expected an object, got {show(x)}")
        missing = [k for k in required if k not in x]
        if missing:
            raise self.fail(path, f"missing required field {missing[0]!r}; required: {', '.join(required)}")
        if required or optional:
            unknown = sorted(k for k in x if k not in required and k not in optional)
            if unknown:
                raise self.fail(path, f"unknown field {unknown[0]!r}; valid: {', '.join(required + optional)}")
        return x

    def array(self, x: Any, path: str, length: int | None = None) -> list:
        """``x`` must be an array (of ``length`` items when given)."""
        if not isinstance(x, list):
            raise self.fail(path, f"expected an array, got {show(x)}")
        if length is not None and len(x) != length:
            raise self.fail(path, f"expected an array of {length} items, got {len(x)}")
        return x

    def integer(self, x: Any, path: str, lo: int = -MAX_INT, hi: int = MAX_INT, null: bool = False) -> int | None:
        """An integer in ``[lo, hi]`` (never a bool or a float such as 3.7 or 3.0)."""
        if x is None and null:
            return None
        if type(x) is not int:
            raise self.fail(path, f"expected an integer{' or null' if null else ''}, got {show(x)}")
        if not lo <= x <= hi:
            raise self.fail(path, f"{show(x)} is out of range; valid: {lo} to {hi}")
        return x

    def number(self, x: Any, path: str, finite: bool = False, null: bool = False) -> float | None:
        """A number as a float; ``"nan"``, ``"inf"`` and ``"-inf"`` are read unless ``finite``."""
        if x is None and null:
            return None
        if isinstance(x, str) and x in NONFINITE and not finite:
            return NONFINITE[x]
        if type(x) is int:
            try:
                x = float(x)
            except OverflowError:
                raise self.fail(path, f"{show(x)} is too large for a number") from None
        if type(x) is not float:
            what = "a finite number" if finite else 'a number (or "nan", "inf", "-inf")'
            raise self.fail(path, f"expected {what}{' or null' if null else ''}, got {show(x)}")
        if finite and not math.isfinite(x):
            raise self.fail(path, f"expected a finite number, got {x!r}")
        return x

    def string(self, x: Any, path: str, choices: tuple | None = None, null: bool = False) -> str | None:
        """A string (one of ``choices`` when given)."""
        if x is None and null:
            return None
        if not isinstance(x, str):
            raise self.fail(path, f"expected a string{' or null' if null else ''}, got {show(x)}")
        if choices is not None and x not in choices:
            raise self.fail(path, f"{show(x)} is not valid; valid: {', '.join(choices)}")
        return x

    def scalar(self, x: Any, path: str) -> Any:
        """A JSON scalar (number, string, bool or null); numbers decoded like :meth:`number`."""
        if x is None or isinstance(x, bool):
            return x
        if isinstance(x, str):
            return NONFINITE.get(x, x)
        return self.number(x, path)


def join(path: str, key: str | int) -> str:
    """``path`` extended by an object key or an array index, in JSON-path spelling."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if not key.isidentifier():
        return f"{path}[{json.dumps(key, ensure_ascii=False)}]"
    return f"{path}.{key}" if path else key


def show(x: Any) -> str:
    """A short description of a bad value for an error message."""
    kind = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null",
            int: "the integer", float: "the number"}.get(type(x), type(x).__name__)
    if isinstance(x, (dict, list)):
        return kind
    text = repr(x) if not isinstance(x, str) else json.dumps(x, ensure_ascii=False)
    text = text if len(text) <= 60 else text[:57] + "..."
    return text if x is None or isinstance(x, bool) else f"{kind} {text}"


# ---- reading -------------------------------------------------------------------------------

def read_json(path: str | os.PathLike, error: type[SchemaError] = SessionFormatError,
              what: str = "NeuralDBG session") -> Any:
    """Parse the JSON file at ``path`` within the size and depth limits.

    ``OSError`` (missing, unreadable file) propagates; anything that is not JSON, too large
    or nested too deep raises ``error`` naming the file.
    """
    p = Path(path)
    size = os.stat(p).st_size
    if size > MAX_BYTES:
        raise error(f"{p}: {size / 1e9:.2f} GB is too large for a {what} (at most {MAX_BYTES / 1e9:.2f} GB)",
                    file=str(p))
    with open(p, "rb") as f:
        raw = f.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:  # the file grew while we looked
        raise error(f"{p}: too large for a {what} (at most {MAX_BYTES / 1e9:.2f} GB)", file=str(p))
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise error(f"{p}: not UTF-8 text, so not a {what}", file=str(p)) from None
    try:
        doc = json.loads(text)
    except RecursionError:
        raise error(f"{p}: nested deeper than {MAX_DEPTH} levels, so not a {what}", file=str(p)) from None
    except ValueError as exc:  # JSONDecodeError, and integers beyond Python's digit limit
        raise error(f"{p}: not valid JSON (truncated, or not a {what}): {exc}", file=str(p)) from None
    if too_deep(doc):
        raise error(f"{p}: nested deeper than {MAX_DEPTH} levels, so not a {what}", file=str(p))
    return doc


def too_deep(doc: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``doc`` nests arrays/objects deeper than ``limit`` (iterative: no recursion)."""
    stack = [(doc, 1)]
    while stack:
        x, depth = stack.pop()
        items = x.values() if isinstance(x, dict) else x if isinstance(x, list) else None
        if items is None:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in items if isinstance(c, (dict, list)))
    return False
