"""The documentation site (issue 13): Sphinx builds it from docs/ with warnings as errors (the guides, the
README as the front page, the API reference from the docstrings, the generated configuration table, the
examples); then Debian's chromium, headless, loads every page and every internal link is checked against
the page it points to (the file exists, and so does the #anchor in the DOM the browser built)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urldefrag

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BROWSER = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"] if CHROMIUM else []


def _have_sphinx() -> bool:
    try:
        import myst_parser  # noqa: F401
        import sphinx  # noqa: F401
    except ImportError:
        return False
    return True


pytestmark = pytest.mark.skipif(not _have_sphinx(), reason="sphinx and myst-parser are not installed "
                                "(scripts/setup.sh installs hpccl[docs])")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                           str(ROOT / "docs"), str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-4000:]
    return out


def test_site_has_every_page_and_the_api(site):
    for page in ("index", "GPU", "ARCHITECTURE", "OBSERVABILITY", "PERFORMANCE", "RELIABILITY", "TORCH",
                 "DEPLOY", "NETWORK", "api", "examples", "_generated/config"):
        assert (site / f"{page}.html").is_file(), page
    api = (site / "api.html").read_text()
    for name in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "register",
                 "deregister", "stats", "shrink", "group"):
        assert f'id="hpccl.Communicator.{name}"' in api, name
    assert 'id="hpccl.errors.HpcclTimeoutError"' in api
    from hpccl import config
    table = (site / "_generated" / "config.html").read_text()
    for p in config.PARAMS:
        assert p in table, p


def _dom(url: str) -> str:
    proc = subprocess.run(BROWSER + ["--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "<html" in proc.stdout, (url, proc.stderr[-2000:])
    return proc.stdout


@pytest.mark.skipif(not CHROMIUM, reason="Debian's chromium is not installed (.ci/run installs it: "
                    "apt-get install chromium)")
def test_links_resolve_in_a_browser(site, tmp_path):
    from concurrent.futures import ThreadPoolExecutor
    pages = sorted(p for p in site.rglob("*.html") if "_sources" not in p.parts)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:  # one browser per page, in parallel
        doms = dict(zip(pages, pool.map(lambda p: _dom(p.as_uri()), pages)))
    ids = {p: set(re.findall(r'\sid="([^"]+)"', d)) for p, d in doms.items()}
    broken, checked, external = [], 0, 0
    for page, dom in doms.items():
        for href in re.findall(r'<a\s[^>]*href="([^"]*)"', dom):
            if href.startswith(("http://", "https://", "mailto:")):
                external += 1  # no internet here; internal links are what the build can break
                continue
            path, frag = urldefrag(unquote(href))
            target = page if not path else (page.parent / path).resolve()
            if path.startswith("file://"):
                target = Path(path[len("file://"):])
            checked += 1
            if not target.exists():
                broken.append(f"{page.name}: {href} (no file)")
            elif frag and target.suffix == ".html":
                if target not in ids:
                    ids[target] = set(re.findall(r'\sid="([^"]+)"', _dom(target.as_uri())))
                if frag not in ids[target]:
                    broken.append(f"{page.name}: {href} (no #{frag})")
    assert checked > 200, checked
    assert broken == [], broken[:20]
    shot = tmp_path / "front.png"
    proc = subprocess.run(BROWSER + ["--window-size=1280,1000", f"--screenshot={shot}", (site / "index.html").as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and shot.stat().st_size > 10_000, proc.stderr[-2000:]
