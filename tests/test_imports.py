"""hpccl's modules import each other without a circle, counting imports made inside functions too (a lazy
import that closes a circle hides an ordering dependency): the dependency graph read from the sources is
acyclic. The native extensions (hpccl._hotpath, hpccl._netengine) are leaves.

The packages are layered (docs/ARCHITECTURE.md): each imports only the packages after it in ORDER and the
top modules (TOP), which import only each other; hpccl/__init__.py, the public API, is imported only by the
packages on top of it (torch, cli). Every module belongs to a package of ORDER or is a top module, so a new
flat module has to be placed."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Set

ROOT = Path(__file__).resolve().parent.parent / "hpccl"
EXTENSIONS = {"hpccl._hotpath", "hpccl._netengine"}
# top of the import order first; packages in one tuple do not import each other
ORDER = [("hpccl.torch", "hpccl.cli"), ("hpccl.core",), ("hpccl.gpu",), ("hpccl.host",), ("hpccl.observe",),
         ("hpccl.algorithms",), ("hpccl.runtime",), ("hpccl.transport",), ("hpccl.memory",),
         ("hpccl.topology", "hpccl.bootstrap")]
TOP = {"hpccl.config", "hpccl.errors", "hpccl.log", "hpccl.text", "hpccl.ops", "hpccl.kernels",
       "hpccl.envcheck"}  # python -m hpccl.envcheck stays a command
ON_API = {"hpccl.torch", "hpccl.cli"}  # may import hpccl itself


def _modules() -> Dict[str, Path]:
    mods = {}
    for p in ROOT.rglob("*.py"):
        name = ".".join(p.relative_to(ROOT.parent).with_suffix("").parts)
        mods[name[:-len(".__init__")] if name.endswith(".__init__") else name] = p
    return mods


def _targets(mods: Dict[str, Path], cur: str, node: ast.AST) -> List[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in mods]
    assert isinstance(node, ast.ImportFrom)
    pkg = cur if mods[cur].name == "__init__.py" else cur.rsplit(".", 1)[0]
    if node.level:
        parts = pkg.split(".")
        mod = ".".join(parts[:len(parts) - node.level + 1]) + (f".{node.module}" if node.module else "")
    else:
        mod = node.module or ""
    out = []
    for a in node.names:
        if f"{mod}.{a.name}" in mods or f"{mod}.{a.name}" in EXTENSIONS:
            out.append(f"{mod}.{a.name}")
        elif mod in mods:
            out.append(mod)
    return [t for t in out if t not in EXTENSIONS]


def graph() -> Dict[str, Set[str]]:
    """module -> the hpccl modules it imports anywhere in its source."""
    mods = _modules()
    g: Dict[str, Set[str]] = defaultdict(set)
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                g[name].update(t for t in _targets(mods, name, node) if t != name)
    return g


def cycles(g: Dict[str, Set[str]]) -> List[List[str]]:
    found, state, stack = [], {}, []

    def visit(u: str) -> None:
        state[u] = 1
        stack.append(u)
        for v in sorted(g.get(u, ())):
            if state.get(v) == 1:
                found.append(stack[stack.index(v):] + [v])
            elif not state.get(v):
                visit(v)
        stack.pop()
        state[u] = 2

    for u in sorted(g):
        if not state.get(u):
            visit(u)
    return found


def test_no_import_circle():
    g = graph()
    assert len(g) > 40, "the package's modules were not found"
    assert "hpccl.gpu.gpu_sync" in g["hpccl.gpu.cuda_comm"], "the graph misses a known import"
    assert cycles(g) == []


def test_a_circle_is_found():
    """The check itself: a made-up graph with a circle through a lazy import is reported."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def _package(mod: str) -> str:
    return ".".join(mod.split(".")[:2])


def layering_errors(g: Dict[str, Set[str]], mods: Optional[Set[str]] = None) -> List[str]:
    """'a -> b' for each import against the declared order, and each module outside it (of ``mods``: by
    default, every module of the package)."""
    rank = {p: i for i, level in enumerate(ORDER) for p in level}
    errors = []
    for mod in sorted(set(g) | (set(_modules()) if mods is None else mods)):
        if mod == "hpccl":
            continue
        if mod in TOP:
            errors += [f"{mod} -> {t} (a top module imports only top modules)" for t in sorted(g.get(mod, ()))
                       if t not in TOP]
            continue
        pkg = _package(mod)
        if pkg not in rank:
            errors.append(f"{mod}: not in a package of ORDER nor a top module")
            continue
        for t in sorted(g.get(mod, ())):
            if t in TOP or _package(t) == pkg:
                continue
            if t == "hpccl":
                if pkg not in ON_API:
                    errors.append(f"{mod} -> hpccl (only {sorted(ON_API)} import the public API)")
            elif rank.get(_package(t), -1) <= rank[pkg]:
                errors.append(f"{mod} -> {t} (imports upward or sideways)")
    return errors


def test_packages_import_downward():
    assert layering_errors(graph()) == []


def test_an_upward_import_is_found():
    """The check itself: an upward import, a top module importing a package, a module outside the order."""
    g = {"hpccl.transport.x": {"hpccl.gpu.y"}, "hpccl.ops": {"hpccl.memory"}, "hpccl.newthing": set(),
         "hpccl.gpu.y": {"hpccl.transport.x", "hpccl.errors"}}
    errs = layering_errors(g, set(g))
    assert errs == ["hpccl.newthing: not in a package of ORDER nor a top module",
                    "hpccl.ops -> hpccl.memory (a top module imports only top modules)",
                    "hpccl.transport.x -> hpccl.gpu.y (imports upward or sideways)"], errs
