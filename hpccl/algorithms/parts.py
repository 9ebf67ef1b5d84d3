"""Splitting a buffer into n nearly equal contiguous parts (the same split on every rank)."""
from __future__ import annotations

from typing import List


def offsets(count: int, n: int) -> List[int]:
    """n+1 boundaries; part i is [off[i], off[i+1]); sizes differ by at most one element."""
    return [i * count // n for i in range(n + 1)]
