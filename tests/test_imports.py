"""hpccl's modules import each other without a circle, counting imports made inside functions too (a lazy
import that closes a circle hides an ordering dependency): the dependency graph read from the sources is
acyclic. The native extensions (hpccl._hotpath, hpccl._netengine) are leaves."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Set

ROOT = Path(__file__).resolve().parent.parent / "hpccl"
EXTENSIONS = {"hpccl._hotpath", "hpccl._netengine"}


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
