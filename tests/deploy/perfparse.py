"""Parse nccl-tests style output (hpccl-perf) and find rows whose '#wrong' columns are not zero."""
from __future__ import annotations

from typing import Dict, List


def parse(text: str) -> List[Dict[str, str]]:
    """Data rows as dicts keyed by header names; '#wrong' columns are named wrong, wrong_1, ..."""
    header: List[str] = []
    rows: List[Dict[str, str]] = []
    for line in text.splitlines():
        # srun --label or rank prefixes like "0: " are dropped
        body = line.split(": ", 1)[1] if line[:1].isdigit() and ": " in line[:6] else line
        toks = body.strip().split()
        if not toks:
            continue
        if body.lstrip().startswith("#"):
            names = body.strip().lstrip("#").split()
            if any(t.lstrip("#") == "wrong" for t in names):
                header, seen = [], {}
                for t in names:
                    t = t.lstrip("#")
                    n = seen.get(t, 0)
                    seen[t] = n + 1
                    header.append(t if n == 0 else f"{t}_{n}")
            continue
        if header and toks[0].isdigit() and len(toks) == len(header):
            rows.append(dict(zip(header, toks)))
    return rows


def wrong_rows(rows: List[Dict[str, str]]) -> List[Dict[str, str]]:
    """Rows with any wrong column that is neither 0 nor N/A."""
    return [r for r in rows if any(k.startswith("wrong") and v not in ("0", "N/A") for k, v in r.items())]
