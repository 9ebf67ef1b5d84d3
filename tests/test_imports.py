"""The house's shape, read from the sources: hpccl's modules import each other without a circle, counting
imports made inside functions too (a lazy import that closes a circle hides an ordering dependency); the
native extensions (hpccl._hotpath, hpccl._netengine) are leaves.

The packages and the top modules stand in layers (docs/ARCHITECTURE.md): each imports only what stands in
a level below its own (LEVELS); hpccl/__init__.py, the public API, is imported only by the packages on top
of it (torch, cli). Every module belongs to a level, so a new flat module has to be placed.

The extensions' C sources (setup.py's lists) call each other one way: a file's calls and references to
what another file defines, and its includes, make a graph without a circle. No source file of the package
is longer than MAX_LINES."""
from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Set, Tuple

ROOT = Path(__file__).resolve().parent.parent / "hpccl"
EXTENSIONS = {"hpccl._hotpath", "hpccl._netengine"}
# top of the import order first; what shares a level does not import each other
LEVELS = [("hpccl.torch", "hpccl.cli"), ("hpccl.core",), ("hpccl.gpu",), ("hpccl.host", "hpccl.algorithms"),
          ("hpccl.runtime",), ("hpccl.transport",), ("hpccl.memory", "hpccl.observe"),
          ("hpccl.bootstrap", "hpccl.kernels", "hpccl.log", "hpccl.topology",
           "hpccl.envcheck"),  # python -m hpccl.envcheck stays a command
          ("hpccl.config", "hpccl.ops"), ("hpccl.errors", "hpccl.text")]
ON_API = {"hpccl.torch", "hpccl.cli"}  # may import hpccl itself
# imports against LEVELS that stay until their files' owners move them (each must still exist: a stale
# entry fails the test). hpccl/observe/check.py (HPCCL_CHECK) exchanges a call's signature over the host
# ring, algorithms.ring, a level above observe.
KNOWN_UPWARD: set = set()
MAX_LINES = 600
# files over MAX_LINES while their owners split them (each must still be over: a stale entry fails the test)
KNOWN_LONG: set = set()


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
    """'a -> b' for each import against LEVELS, and each module outside them (of ``mods``: by default, every
    module of the package)."""
    rank = {p: i for i, level in enumerate(LEVELS) for p in level}
    errors = []
    for mod in sorted(set(g) | (set(_modules()) if mods is None else mods)):
        if mod == "hpccl":
            continue
        pkg = _package(mod)
        if pkg not in rank:
            errors.append(f"{mod}: in no level of LEVELS")
            continue
        for t in sorted(g.get(mod, ())):
            if t == "hpccl":
                if pkg not in ON_API:
                    errors.append(f"{mod} -> hpccl (only {sorted(ON_API)} import the public API)")
            elif _package(t) != pkg and rank.get(_package(t), -1) <= rank[pkg]:
                errors.append(f"{mod} -> {t} (imports upward or sideways)")
    return errors


def test_packages_import_downward():
    known = {f"{a} -> {b} (imports upward or sideways)" for a, b in KNOWN_UPWARD}
    errors = layering_errors(graph())
    assert [e for e in errors if e not in known] == []
    assert known <= set(errors), f"no longer imported, drop from KNOWN_UPWARD: {sorted(known - set(errors))}"


def test_an_upward_import_is_found():
    """The check itself: an upward import, a top module importing a level above it, a module outside the
    levels, a sideways import within a level."""
    g = {"hpccl.transport.x": {"hpccl.gpu.y"}, "hpccl.ops": {"hpccl.memory"}, "hpccl.newthing": set(),
         "hpccl.gpu.y": {"hpccl.transport.x", "hpccl.errors"}, "hpccl.log": {"hpccl.text", "hpccl.config"},
         "hpccl.config": {"hpccl.log"}, "hpccl.memory.a": {"hpccl.observe.b"}}
    errs = layering_errors(g, set(g))
    assert errs == ["hpccl.config -> hpccl.log (imports upward or sideways)",
                    "hpccl.memory.a -> hpccl.observe.b (imports upward or sideways)",
                    "hpccl.newthing: in no level of LEVELS",
                    "hpccl.ops -> hpccl.memory (imports upward or sideways)",
                    "hpccl.transport.x -> hpccl.gpu.y (imports upward or sideways)"], errs


# ----- C: the extensions' sources ------------------------------------------------------------------------
# comments, string and character literals, preprocessor lines (includes are read before they go)
_C_NOISE = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|^[ \t]*#(?:\\\n|[^\n])*',
                      re.S | re.M)
_C_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)
_C_TOKEN = re.compile(r"[A-Za-z_]\w*|->|\S")
_C_IDENT = re.compile(r"[A-Za-z_]\w*$")


def _closing(toks: List[str], i: int) -> int:
    depth = 0
    for j in range(i, len(toks)):
        depth += (toks[j] == "{") - (toks[j] == "}")
        if depth == 0:
            return j
    raise AssertionError("unbalanced braces")


def _uses(toks: Iterable[str]) -> Set[str]:
    """Identifiers that may name another file's function or variable (not a member after . or ->)."""
    toks = list(toks)
    return {t for k, t in enumerate(toks) if _C_IDENT.match(t) and (k == 0 or toks[k - 1] not in (".", "->"))}


def c_unit(text: str) -> Tuple[List[str], Dict[str, bool], Set[str]]:
    """One C source read at file scope: its quoted includes, what it defines (function or variable name ->
    file-local: static), and the identifiers its function bodies and initializers use. Prototypes, extern
    declarations, typedefs and enums define nothing."""
    includes = _C_INCLUDE.findall(text)
    toks = _C_TOKEN.findall(_C_NOISE.sub(" ", text))
    defined: Dict[str, bool] = {}
    used: Set[str] = set()
    head: List[str] = []
    i = 0
    while i < len(toks):
        t = toks[i]
        if t == "{":
            j = _closing(toks, i)
            if head and head[-1] == ")" and "=" not in head and head[0] not in ("typedef", "struct", "enum", "union"):
                defined[head[head.index("(") - 1]] = "static" in head  # a function's definition
                used |= _uses(toks[i + 1:j])
                head = []
            else:  # a struct, enum or initializer: the statement goes on to its ';'
                head += toks[i:j + 1]
            i = j + 1
            continue
        i += 1
        if t != ";":
            head.append(t)
            continue
        item, head = head, []
        if not item or item[0] in ("typedef", "enum", "extern") or (item[0] in ("struct", "union") and "{" in item[:3]):
            continue
        eq = item.index("=") if "=" in item else len(item)
        left = item[:eq]
        if "(" in left and left[left.index("(") - 1] != "*":
            continue  # a prototype
        used |= _uses(item[eq + 1:])
        depth, part = 0, []
        for x in left + [","]:  # each declarator's name: the last identifier before any [size]
            depth += (x in "([") - (x in ")]")
            if x == "," and depth == 0:
                names = [y for y in part[:part.index("[") if "[" in part else len(part)] if _C_IDENT.match(y)]
                if names:
                    defined[names[-1]] = "static" in left
                part = []
            else:
                part.append(x)
    return includes, defined, used


def c_graph(texts: Dict[str, str]) -> Dict[str, Set[str]]:
    """file -> the files it includes, and those defining what it uses (outside itself: a .c file's
    non-static functions and variables, anything a header defines), among ``texts`` (name -> source)."""
    units = {name: c_unit(text) for name, text in texts.items()}
    owners: Dict[str, Set[str]] = defaultdict(set)
    for name, (_inc, defined, _used) in units.items():
        for sym, local in defined.items():
            if not local or name.endswith(".h"):
                owners[sym].add(name)
    g: Dict[str, Set[str]] = defaultdict(set)
    for name, (inc, defined, used) in units.items():
        g[name] |= {h for h in inc if h in texts}
        for sym in used - set(defined):
            g[name] |= owners.get(sym, set()) - {name}
    return g


def _extension(listed: str) -> Dict[str, str]:
    """An extension's sources as setup.py lists them (``listed``: HOT_SOURCES or NET_SOURCES), and the
    headers they include, by file name."""
    tree = ast.parse((ROOT.parent / "setup.py").read_text())
    files = next([ROOT.parent / f for f in ast.literal_eval(n.value)] for n in tree.body
                 if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == listed for t in n.targets))
    texts: Dict[str, str] = {}
    while files:
        f = files.pop()
        if f.name not in texts and f.is_file():
            texts[f.name] = f.read_text()
            files += [f.parent / h for h in _C_INCLUDE.findall(texts[f.name])]
    return texts


def test_c_calls_go_one_way():
    for listed, known in (("HOT_SOURCES", ("_hotpath.c", "_hotcore.c")),
                          ("NET_SOURCES", ("_netcalls.c", "_netcore.c"))):
        g = c_graph(_extension(listed))
        assert known[1] in g[known[0]], f"{listed}: the graph misses a known call"  # the reading works
        assert cycles(g) == [], listed


def test_a_c_circle_is_found():
    """The check itself: two files that call each other make a circle, through a function or a variable (a
    method table, a type); a prototype, a static function of the same name and a member named like a
    function are no use."""
    a = "#include \"x.h\"\nint f(void);\nstatic int g(int v) { return v; }\nint h(void) { return g(1) + s.f; }\n"
    b = "static int g(int v) { return -v; }\nint f(void) { return g(2); }\nint k(void) { return h(); }\n"
    g = c_graph({"a.c": a, "b.c": b, "x.h": "int f(void);\n"})
    assert g["a.c"] == {"x.h"} and g["b.c"] == {"a.c"} and cycles(g) == []
    assert cycles(c_graph({"a.c": a.replace("s.f", "f()"), "b.c": b})) == [["a.c", "b.c", "a.c"]]
    table = "static PyMethodDef m[] = {{\"f\", (PyCFunction)f, 0, 0}};\nPyTypeObject T = {.tp_methods = m};\n"
    assert cycles(c_graph({"a.c": table, "b.c": "int f(void) { return check(&T); }\n"})) == [["a.c", "b.c", "a.c"]]


# ----- file length ---------------------------------------------------------------------------------------
def long_files(root: Path = ROOT) -> Dict[str, int]:
    """Python, C and CUDA sources of the package (and its kernels, cuda/ beside it) longer than MAX_LINES:
    path (from the repository) -> lines."""
    out = {}
    for p in sorted([*root.rglob("*"), *(root.parent / "cuda").glob("*")]):
        if p.suffix in (".py", ".c", ".h", ".cpp", ".cu", ".cuh") and p.is_file():
            n = len(p.read_text().splitlines())
            if n > MAX_LINES:
                out[p.relative_to(root.parent).as_posix()] = n
    return out


def test_no_file_over_the_line_limit():
    long = long_files()
    assert {p: n for p, n in long.items() if p not in KNOWN_LONG} == {}
    assert KNOWN_LONG <= set(long), f"now within {MAX_LINES} lines, drop from KNOWN_LONG: {KNOWN_LONG - set(long)}"
