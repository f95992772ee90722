"""The package's shape: the import layering of docs/architecture.md, no private access to the
monitor, torch-free pure parts, self-contained text."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "neuraldbg"


def _unit(module: str) -> str | None:
    """The layering unit of a ``neuraldbg`` module: its subpackage or top-level module."""
    parts = module.split(".")
    if parts[0] != "neuraldbg" or len(parts) < 2:
        return None
    return parts[1]


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at module level or inside functions (lazy imports count:
    they only postpone a circle to run time)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    me = _module_name(path)
    pkg = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def unit_graph() -> dict[str, set[str]]:
    """Edges between layering units of ``neuraldbg`` (the package root's lazy table excluded)."""
    graph: dict[str, set[str]] = {}
    for path in PKG.rglob("*.py"):
        if path == PKG / "__init__.py":
            continue  # PEP 562 table: it names every public module on purpose
        src = _unit(_module_name(path))
        for mod in _imports(path):
            dst = _unit(mod)
            # ``from neuraldbg import __version__`` names no unit; only real modules count
            if dst is not None and dst != src and ((PKG / dst).is_dir() or (PKG / f"{dst}.py").is_file()):
                graph.setdefault(src, set()).add(dst)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_cycle_finder_finds_a_planted_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}}) is None


def test_no_import_circle_between_subpackages():
    graph = unit_graph()
    assert "events" in graph and "causal" in graph  # the walk sees the package
    assert _cycle(graph) is None, f"import circle: {' -> '.join(_cycle(graph))}"


def allowed_imports() -> dict[str, set[str]]:
    """The table of docs/architecture.md: unit -> the units it may import."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    table: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0] not in ("unit", "---") and line.startswith("|"):
            table[cells[0]] = {u.strip() for u in cells[1].split(",") if u.strip()}
    return table


def test_imports_follow_the_layer_table_of_the_architecture_doc():
    table = allowed_imports()
    units = {p.stem if p.is_file() else p.name for p in PKG.iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())}
    assert units == set(table), f"units missing from / extra in the table: {sorted(units ^ set(table))}"
    assert _cycle(table) is None, f"the table itself has a cycle: {_cycle(table)}"
    extra = {u: sorted(dst - table[u]) for u, dst in unit_graph().items() if dst - table[u]}
    assert not extra, f"imports the layer table of docs/architecture.md does not allow: {extra}"


def test_the_layer_check_catches_a_forbidden_import(monkeypatch):
    graph = unit_graph()
    graph["vocab"] = {"monitor"}
    table = allowed_imports()
    assert {u: dst - table[u] for u, dst in graph.items() if dst - table[u]} == {"vocab": {"monitor"}}


PRIVATE = re.compile(r"\b(?:dbg|monitor|inner)\._(?!_)\w+")


def test_nothing_outside_the_monitor_reads_its_private_state():
    """Parts, verification, integrations and benchmarks go through ``dbg.settings``,
    ``dbg.addon(...)`` and the part context (neuraldbg/lifecycle.py), never ``dbg._x``."""
    assert PRIVATE.search("x = dbg._hooks") and not PRIVATE.search("dbg.__enter__()")
    hits = []
    for p in _py_files("neuraldbg", "models", "benchmarks", "tests"):
        rel = p.relative_to(ROOT).as_posix()
        if rel.startswith(("neuraldbg/monitor/", "tests/monitor/")) or p == Path(__file__):
            continue
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            if PRIVATE.search(line):
                hits.append(f"{rel}:{i}: {line.strip()}")
    assert not hits, "\n".join(hits)


def test_events_do_not_depend_on_the_monitor():
    assert "monitor" not in unit_graph().get("events", set())


def test_fitting_is_only_imported_by_the_command_line():
    users = sorted(u for u, dst in unit_graph().items() if "fit" in dst)
    assert users == ["cli"], users


BLOCK_TORCH = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'pgmpy'):
            raise ImportError('blocked: ' + name)
        return None
sys.meta_path.insert(0, Block())
"""


def test_pure_parts_import_without_torch_or_pgmpy():
    code = BLOCK_TORCH + (
        "import neuraldbg, neuraldbg.vocab, neuraldbg.causal.structure, neuraldbg.scoring, neuraldbg.jsonio\n"
        "import neuraldbg.causal.api, neuraldbg.session\n"
        "assert 'torch' not in sys.modules and 'pgmpy' not in sys.modules\n"
        "assert neuraldbg.vocab.ROOTS['learning_rate'][0] == 'ok'\n"
        "print('ok')\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_import_neuraldbg_is_lazy():
    code = ("import sys, neuraldbg\n"
            "assert 'torch' not in sys.modules, 'torch'\n"
            "assert 'pgmpy' not in sys.modules, 'pgmpy'\n"
            "assert neuraldbg.NeuralDbg.__name__ == 'NeuralDbg'\n"
            "assert 'torch' in sys.modules\n"
            "print('ok')\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_unknown_attribute_is_an_attribute_error():
    import neuraldbg

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        neuraldbg.nope  # noqa: B018
    assert set(neuraldbg.__all__) <= set(dir(neuraldbg))


def _py_files(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py"))


# the contract lives in docs/api.md; issue numbers belong to the tracker, not the code
FOREIGN = re.compile(r"(?<![\w/])API\.md|\.\./shared|\bissues? #?\d+", re.IGNORECASE)


def test_text_cites_only_the_repository():
    hits = []
    for p in _py_files("neuraldbg", "models", "benchmarks", "tests") + [ROOT / "Makefile", ROOT / "pyproject.toml"]:
        if p == Path(__file__):
            continue
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            if FOREIGN.search(line) and "upstream pgmpy" not in line:
                hits.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not hits, "\n".join(hits)


def test_contract_is_in_the_repository():
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    for name in ("NeuralDbg", "get_causal_hypotheses", "explain_failure", "trace_causal_chain",
                 "detect_coupled_failures", "export_aquarium_package", "save_session", "load_session",
                 "models.run", "records.csv", "post_<variable>_<state>"):
        assert name in text, name
