"""Sphinx configuration of hpccl's documentation site: the guides in docs/ (Markdown, through MyST), the
README as the front page, an API reference generated from the docstrings, the configuration table
generated from hpccl.config, and the examples. Built with warnings as errors (tests/test_docs.py):
    sphinx-build -W -b html docs build/site"""
from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

project = "hpccl"
author = "the hpccl developers"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["perf/**", "deploy/**", "_build", "_generated/README.md"]
myst_heading_anchors = 3
autodoc_member_order = "bysource"
autodoc_typehints = "description"
html_theme = "alabaster"
html_static_path: list = []
html_title = "hpccl"


def _config_table(app) -> None:
    """docs/_generated/config.md: every HPCCL_* parameter from the one registry, with default and meaning."""
    from hpccl import config
    out = HERE / "_generated"
    out.mkdir(exist_ok=True)
    rows = ["# Configuration (HPCCL_* variables)", "",
            "Generated from `hpccl.config` when the site is built; `hpccl-info` prints the values in effect.", "",
            "| variable | default | meaning |", "| --- | --- | --- |"]
    for p in config.PARAMS.values():
        default = "" if p.default == "" else f"`{p.default}`"
        rows.append(f"| `{p.name}` | {default} | {p.doc.replace('|', '/')} |")
    text = "\n".join(rows) + "\n"
    target = out / "config.md"
    if not target.exists() or target.read_text() != text:
        target.write_text(text)


def setup(app):
    os.environ.setdefault("HPCCL_NVTX", "0")
    app.connect("builder-inited", _config_table)
