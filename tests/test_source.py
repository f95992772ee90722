"""The code version benchmark records and fitted priors carry (neuraldbg/source.py)."""
from pathlib import Path

import neuraldbg
from neuraldbg.source import code_version, python_files, source_hash


def test_the_hash_ignores_order_and_sees_every_edit_rename_addition_and_removal():
    files = [("neuraldbg/a.py", b"x = 1\n"), ("models/b.py", b"y = 2\n")]
    h = source_hash(files)
    assert h == source_hash(list(reversed(files))) and len(h) == 12
    assert source_hash([files[0], ("models/b.py", b"y = 3\n")]) != h            # an edit
    assert source_hash([files[0], ("models/c.py", b"y = 2\n")]) != h            # a rename
    assert source_hash(files + [("benchmarks/c.py", b"")]) != h                  # an added file
    assert source_hash(files[:1]) != h                                           # a removed one
    # a path and a content cannot trade bytes: the path ends before the content's hash
    assert source_hash([("ab", b"c")]) != source_hash([("a", b"bc")])


def test_python_files_reads_the_source_folders_that_exist_without_caches(tmp_path):
    (tmp_path / "neuraldbg" / "sub").mkdir(parents=True)
    (tmp_path / "neuraldbg" / "sub" / "m.py").write_text("a = 1\n")
    (tmp_path / "neuraldbg" / "__pycache__").mkdir()
    (tmp_path / "neuraldbg" / "__pycache__" / "m.py").write_text("stale\n")
    (tmp_path / "neuraldbg" / "priors.json").write_text("{}")  # data: never counted
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x.py").write_text("b = 2\n")
    assert python_files(tmp_path) == [("neuraldbg/sub/m.py", b"a = 1\n")]  # models/, benchmarks/ absent


def test_code_version_is_the_hash_of_this_checkout():
    base = Path(neuraldbg.__file__).resolve().parent.parent
    assert (base / "pyproject.toml").is_file()  # the tests run from a checkout
    files = python_files(base)
    rels = {rel for rel, _ in files}
    assert "neuraldbg/source.py" in rels and "benchmarks/harness.py" in rels and "models/__init__.py" in rels
    assert code_version() == source_hash(files)
