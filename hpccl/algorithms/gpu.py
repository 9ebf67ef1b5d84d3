"""The GPU kernel algorithms of the table: one kernel each over GPU peer memory (cuda_comm.CudaComm), the
same schedules as the host window algorithms of the same names (direct.py) with NVLink/PCIe stores in
place of shared-memory copies. ``e`` is the communicator's CudaComm; buffers are flat CuPy views."""
from __future__ import annotations

from typing import Any

from ..ops import ReduceOp


def all_reduce_oneshot(e: Any, send: Any, recv: Any, op: ReduceOp, stream: int) -> None:
    e.all_reduce(send, recv, op, stream, "oneshot")


def all_reduce_twoshot(e: Any, send: Any, recv: Any, op: ReduceOp, stream: int) -> None:
    e.all_reduce(send, recv, op, stream, "twoshot")


def reduce(e: Any, send: Any, recv: Any, root: int, op: ReduceOp, stream: int) -> None:
    e.reduce(send, recv, root, op, stream)


def reduce_scatter(e: Any, send: Any, recv: Any, op: ReduceOp, stream: int) -> None:
    e.reduce_scatter(send, recv, op, stream)


def all_gather(e: Any, send: Any, recv: Any, stream: int) -> None:
    e.all_gather(send, recv, stream)


def broadcast(e: Any, send: Any, recv: Any, root: int, stream: int) -> None:
    e.broadcast(send, recv, root, stream)


def all_to_all(e: Any, send: Any, recv: Any, stream: int) -> None:
    e.all_to_all(send, recv, stream)
