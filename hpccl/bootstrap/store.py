"""Bootstrap over a key-value store (torch's c10d Store under torchrun): the same interface as MpiBootstrap
(rank, size, allgather, bcast, barrier, split, close), so a communicator needs no MPI launcher.

Every exchange writes this rank's part under a key of its own and polls for the others' keys against
HPCCL_TIMEOUT, so a rank that never arrives is named, never waited on forever."""
from __future__ import annotations

import pickle
import time
from typing import Any, List, Optional

from .. import config
from ..errors import HpcclInvalidArgument, HpcclTimeoutError


class StoreBootstrap:
    """``store`` needs set(key, bytes), get(key) and check([keys]) (torch.distributed.Store has them)."""

    comm = None  # no MPI communicator behind it

    def __init__(self, store: Any, rank: int, size: int, prefix: str = "hpccl",
                 world_rank: Optional[int] = None) -> None:
        self.store, self.rank, self.size, self.prefix = store, rank, size, prefix
        self.world_rank = rank if world_rank is None else world_rank
        self.timeout = config.get("HPCCL_TIMEOUT")
        self._seq = 0

    def allgather(self, obj: Any, what: str = "allgather") -> List[Any]:
        """Every rank's obj, in rank order."""
        self._seq += 1
        base = f"{self.prefix}/{self._seq}"
        self.store.set(f"{base}/{self.rank}", pickle.dumps(obj))
        keys = [f"{base}/{r}" for r in range(self.size)]
        start, nap, waiting = time.monotonic(), 1e-4, list(range(self.size))
        while waiting:
            waiting = [r for r in waiting if not self.store.check([keys[r]])]
            if not waiting:
                break
            if time.monotonic() - start > self.timeout:
                raise HpcclTimeoutError(f"bootstrap {what}", self._seq, waiting, self.timeout,
                                        "through the store torch handed to hpccl")
            time.sleep(nap)
            nap = min(nap * 2, 5e-3)
        return [pickle.loads(self.store.get(k)) for k in keys]

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return self.allgather(obj if self.rank == root else None, "bcast")[root]

    def barrier(self) -> None:
        self.allgather(None, "barrier")

    def split(self, color: Optional[int], key: int) -> Optional["StoreBootstrap"]:
        """A bootstrap for the ranks of the same color, ordered by (key, rank); None for color None or < 0."""
        c = None if color is None or color < 0 else int(color)
        table = self.allgather((c, key), "split")
        if c is None:
            return None
        members = [r for _, r in sorted((k, r) for r, (col, k) in enumerate(table) if col == c)]
        return StoreBootstrap(self.store, members.index(self.rank), len(members),
                              f"{self.prefix}/s{self._seq}c{c}", self.world_rank)

    def shrink(self, exclude: List[int]) -> "StoreBootstrap":
        """A bootstrap of every rank not in ``exclude`` under a prefix of its own; the excluded ranks
        take no part (their keys are never awaited)."""
        survivors = [r for r in range(self.size) if r not in exclude]
        self._seq += 1
        tag = "-".join(str(r) for r in exclude) or "none"
        sub = StoreBootstrap(self.store, survivors.index(self.rank), len(survivors),
                             f"{self.prefix}/shrink{self._seq}x{tag}", self.world_rank)
        lists = sub.allgather(list(exclude), "shrink")
        if any(ex != list(exclude) for ex in lists):
            raise HpcclInvalidArgument("exclude", f"the surviving ranks disagree on whom to exclude: {lists}")
        return sub

    @staticmethod
    def release(sub: Any) -> None:
        """Nothing to free (MpiBootstrap frees the raw MPI communicator its split returned)."""

    def close(self) -> None:
        self.store = None
