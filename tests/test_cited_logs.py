"""The logs behind the docs: every file a guide cites under docs/perf/ or docs/deploy/ exists, and every file
there is cited by a guide (README.md or docs/*.md), by its path, by a brace list of paths
(``host-{2,4}ranks.txt``) or by a folder it lies in (a path ending in ``/``)."""
from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import List, Set

ROOT = Path(__file__).resolve().parent.parent
KEPT = ("docs/perf", "docs/deploy")
_PATH = re.compile(r"(?<![\w/.-])(?:docs/)?(?:perf|deploy)/[A-Za-z0-9_.,{}*/+-]*[A-Za-z0-9_}/*]")


def guides() -> List[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _expand(ref: str) -> List[str]:
    """``a-{2,4}.txt`` -> ``a-2.txt``, ``a-4.txt`` (every brace group, as the shell does)."""
    parts = re.split(r"\{([^{}]*)\}", ref)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def cited() -> Set[str]:
    """Every docs/perf or docs/deploy path the guides name, repository-relative, braces expanded."""
    out: Set[str] = set()
    for guide in guides():
        for ref in _PATH.findall(guide.read_text()):
            ref = ref if ref.startswith("docs/") else "docs/" + ref
            out.update(_expand(ref.rstrip(".,")))
    return out


def kept_files() -> List[str]:
    return sorted(str(p.relative_to(ROOT)) for top in KEPT for p in (ROOT / top).rglob("*") if p.is_file())


def _exists(ref: str) -> bool:
    if "*" in ref:
        return any(ROOT.glob(ref))
    return (ROOT / ref).exists()


def test_every_cited_log_exists():
    missing = sorted(ref for ref in cited() if not _exists(ref))
    assert missing == [], f"guides cite {len(missing)} paths that do not exist"


def test_every_log_is_cited_by_a_guide():
    refs = cited()
    folders = tuple(r.rstrip("/") + "/" for r in refs if r.endswith("/") or (ROOT / r).is_dir())
    globs = [r for r in refs if "*" in r]
    orphans = [f for f in kept_files() if f not in refs and not f.startswith(folders)
               and not any(Path(f).match(g) for g in globs)]
    assert orphans == [], f"{len(orphans)} files under docs/perf or docs/deploy are cited by no guide"
