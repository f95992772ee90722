"""Which code produced a result: a short hash of the Python source a checkout runs.

Benchmark records carry it (the ``code`` column), so that resuming a benchmark output folder
runs again the records another version of the code made, and ``tune-priors`` refuses to fit
priors to sessions recorded by other code than the one that will read them: their events are
what the monitor recorded then, not what it records now (a detector's threshold moved, a
signature was added), and priors fitted to them are stale from the start.

Only Python source counts: the package, and the zoo and benchmark folders beside it in a
checkout (``models/``, ``benchmarks/``: the models trained and the faults injected). The prior
files are data that ``tune-priors`` writes; counting them would make a refit invalidate the
runs it was fitted on, and a session's evidence does not depend on them.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Iterable

#: the folders hashed: the package, then those of a checkout found beside it
SOURCE_FOLDERS = ("neuraldbg", "models", "benchmarks")
#: hex digits kept (48 bits: no two versions of one project collide in practice)
DIGITS = 12


def source_hash(files: Iterable[tuple[str, bytes]]) -> str:
    """The hash of ``(relative path, content)`` pairs, independent of their order: a file's
    move, rename, edit, addition or removal changes it."""
    h = hashlib.sha256()
    for rel, data in sorted(files):
        h.update(rel.encode())
        h.update(b"\0")
        h.update(hashlib.sha256(data).digest())
    return h.hexdigest()[:DIGITS]


def python_files(base: Path, folders: Iterable[str] = SOURCE_FOLDERS) -> list[tuple[str, bytes]]:
    """``(path relative to base, content)`` of every ``.py`` file under ``base/<folder>`` for the
    folders that exist (compiled caches left out)."""
    out = []
    for folder in folders:
        root = base / folder
        if not root.is_dir():
            continue
        for path in root.rglob("*.py"):
            if "__pycache__" not in path.parts:
                out.append((path.relative_to(base).as_posix(), path.read_bytes()))
    return out


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """The hash of the code this process runs (:func:`source_hash` of :func:`python_files`),
    computed once per process: in a checkout (a ``pyproject.toml`` beside the package) the
    package, the zoo and the benchmarks; in an installed package the package alone (a folder
    called ``models`` beside it in site-packages belongs to someone else)."""
    base = Path(__file__).resolve().parent.parent
    folders = SOURCE_FOLDERS if (base / "pyproject.toml").is_file() else SOURCE_FOLDERS[:1]
    return source_hash(python_files(base, folders))
