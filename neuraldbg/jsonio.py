"""JSON files written once, the same way everywhere: atomically, strict, umask-respecting.

JSON has no NaN or infinity; :func:`encode_nonfinite` spells them ``"nan"``, ``"inf"`` and
``"-inf"`` and :func:`decode_nonfinite` reads them back where numbers live.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

_NONFINITE = ("nan", "inf", "-inf")


def encode_nonfinite(x: Any) -> Any:
    """``x`` with every non-finite float replaced by its string spelling, recursively."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {k: encode_nonfinite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [encode_nonfinite(v) for v in x]
    return x


def decode_float(x: Any) -> Any:
    """One value: ``"nan"``/``"inf"``/``"-inf"`` back to floats, anything else unchanged."""
    if isinstance(x, str) and x in _NONFINITE:
        return float(x)
    return x


def decode_nonfinite(x: Any) -> Any:
    """Inverse of :func:`encode_nonfinite`, recursively (only where every string is a number)."""
    if isinstance(x, dict):
        return {k: decode_nonfinite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [decode_nonfinite(v) for v in x]
    return decode_float(x)


def _create_temp(folder: Path, name: str) -> tuple[int, str]:
    """A new, exclusive temp file next to ``name``. Created with mode 0666 so the kernel
    applies the umask, exactly as ``open()`` does; reading the umask (``os.umask`` can only be
    read by setting it) would race with files other threads create meanwhile."""
    for _ in range(100):
        tmp = os.path.join(folder, f".{name}.{os.getpid()}.{os.urandom(6).hex()}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary file name in {folder}")


def write_json_atomic(path: str | os.PathLike, obj: Any, *, indent: int | None = 1,
                      sort_keys: bool = False, fsync: bool = False) -> str:
    """Write ``obj`` as strict JSON to ``path`` atomically; return the path as a string.

    The text goes to a temporary file in the same folder, which then replaces ``path``, so a
    crash at any moment leaves either the old file or the new one, never half of one (a
    process killed mid-write may leave a ``.NAME.*.tmp`` file beside it). The file gets the
    mode ``open()`` would give it (0666 less the umask), not ``mkstemp``'s 0600. Parent
    folders are created. Non-finite floats raise ``ValueError``: encode them first.
    ``fsync`` also flushes the file to the disk before the rename (autosave: a machine that
    goes down right after a save still has it).
    """
    # dumps, not dump: only the one-shot encoder is C (and holds the GIL for less time)
    text = json.dumps(obj, indent=indent, sort_keys=sort_keys, allow_nan=False)
    return write_text_atomic(path, text + "\n", fsync=fsync)


def new_folders(path: str | os.PathLike) -> list[str]:
    """The parent folders of ``path`` that do not exist yet, outermost first: what a write to
    it creates. Every writer of the package creates them (one rule, ``docs/api.md``,
    "Autosave and files"); the command line names them."""
    out = []
    parent = Path(path).parent
    while not parent.exists() and parent != parent.parent:
        out.append(str(parent))
        parent = parent.parent
    return out[::-1]


def write_text_atomic(path: str | os.PathLike, text: str, *, fsync: bool = False) -> str:
    """Write ``text`` (UTF-8) to ``path`` atomically, with the mode ``open()`` would give it and
    parent folders created (see :func:`write_json_atomic`); return the path as a string."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temp(p.parent, p.name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return str(p)
