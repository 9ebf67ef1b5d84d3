"""Call: one validated collective (or group of sends/receives), what the front end hands to the runner."""
from __future__ import annotations

from typing import Any, Callable, Optional


class Call:
    """One validated collective (or group of sends/receives): what the front end hands to an algorithm.
    ``finish`` is the output avg divides at the end; ``key`` the device fast path's snapshot key; ``fn``
    runs it instead of the algorithm table (fn(comm, call); None: a collective of the table)."""

    __slots__ = ("coll", "mem", "stream", "nbytes", "args", "op", "finish", "key", "fn")

    def __init__(self, coll: str, mem: Any, stream: Any, nbytes: int, args: tuple, op: Any = None,
                 finish: Any = None, key: Any = None, fn: Optional[Callable] = None) -> None:
        self.coll, self.mem, self.stream, self.nbytes, self.args = coll, mem, stream, nbytes, args
        self.op, self.finish, self.key, self.fn = op, finish, key, fn
