"""Direct point-to-point patterns: every pair at once (all_to_all)."""
from __future__ import annotations

import numpy as np

from ..runtime.primitives import Primitives


def all_to_all(p: Primitives, send: np.ndarray, recv: np.ndarray) -> None:
    n, r = p.size, p.rank
    c = send.size // n
    order = [(r + s) % n for s in range(n)]  # staggered so ranks do not all hit rank 0 first
    p.exchange([(q, send[q * c:(q + 1) * c]) for q in order],
               [(q, recv[q * c:(q + 1) * c], None) for q in reversed(order)])
