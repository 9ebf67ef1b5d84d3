"""ReplayGroup: the hpccl ProcessGroup whose all_reduce torch dispatches to hpccl's compiled backend
(hpccl/torch/_native.cpp) instead of Python. A repeated call on one dense CUDA tensor (DDP's buckets, a
training loop's dist.all_reduce) replays its snapshotted launch there with no Python and no GIL; the
first call of each buffer, and every other call, runs the Python backend's all_reduce, and this module
then hands the launch hpccl snapshotted for it to the compiled side ("arms" it). Every other op stays
Python's (HpcclProcessGroup)."""
from __future__ import annotations

import ctypes
import weakref
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from .. import Communicator
from ..cuda_comm import NOTHING
from .options import asynchronous, flat, reduce_op
from .process_group import HpcclProcessGroup


def _slow_path(group: "weakref.ref[ReplayGroup]") -> Any:
    """The compiled side's way back into Python, holding the group weakly (no cycle through C++)."""
    def slow(tensors: List[torch.Tensor], opts: Any) -> Any:
        g = group()
        if g is None:
            raise RuntimeError("hpccl: all_reduce on a process group that was destroyed")
        return g._allreduce_and_arm(tensors, opts)
    return slow


class ReplayGroup(HpcclProcessGroup):
    """An HpcclProcessGroup whose all_reduce is served by the compiled backend, registered with torch for
    CPU and CUDA tensors (CPU calls and first calls come back to Python through it)."""

    # the C++ method itself (its descriptor, so it binds): torch sees no Python override and dispatches to
    # the backend
    allreduce = dist.ProcessGroup.__dict__["allreduce"]

    def __init__(self, comm: Communicator, rank: int, size: int) -> None:
        super().__init__(comm, rank, size)
        from .native import load
        mod = load()
        if mod is None:
            raise RuntimeError("hpccl: the compiled torch backend is not available")
        self.native = mod.Native(rank, size, _slow_path(weakref.ref(self)))
        for dev in ("cpu", "cuda"):
            self._register_backend(torch.device(dev), dist.ProcessGroup.BackendType.CUSTOM, self.native)
        self._engine: Any = None  # the CudaComm attached to the compiled side
        self._side_dev: Optional[int] = None
        self._armed: Dict[tuple, Any] = {}  # launches the compiled side replays (their argument memory)
        self._armed_gen = -1

    def _allreduce_and_arm(self, tensors: List[torch.Tensor], opts: Any) -> Any:
        work = self._allreduce(tensors, opts)
        if len(tensors) == 1 and tensors[0].is_cuda and not tensors[0].is_sparse:
            self._arm(tensors[0], opts)
        return work

    def _arm(self, t: torch.Tensor, opts: Any) -> None:
        """Hand the launch hpccl snapshotted for this call (if it did) to the compiled side."""
        op, factor = reduce_op(opts)
        dev = self.comm._dev
        eng = dev.engine if dev is not None else None
        if factor is not None or eng is None or not t.is_contiguous():
            return
        idx = t.get_device()
        if eng is not self._engine:
            self._attach(eng)
        h = torch._C._cuda_getCurrentRawStream(idx)
        if asynchronous(opts):
            side = self._sides.get(idx)
            if side is None or self._side_dev not in (None, idx):
                return
            if self._side_dev is None:
                self.native.side(*side.ids, side.h, side.join)
                self._side_dev = idx
            h = side.h
        ln = eng._fast.get(eng.fast_key("ar", flat(t, "tensor"), None, op, -1, h))
        if ln is None:
            return
        gen = eng.fs.gen
        if gen != self._armed_gen:
            self._armed.clear()
            self._armed_gen = gen
        self._armed[(t.data_ptr(), t.nbytes, t.dtype, op, h)] = ln  # the compiled table's key
        if ln is NOTHING:
            self.native.arm(t, opts, h, gen, 0, 0, 0, 0)
        else:
            self.native.arm(t, opts, h, gen, ln.fi, ln.grid, ln.block, ln.pi)

    def _attach(self, eng: Any) -> None:
        pub = eng._shm.device_counter_address() if eng._pub is not None else 0
        launch, capturing, record = eng._entry
        self.native.attach(ctypes.addressof(eng.fs), ctypes.addressof(eng._err), pub, eng._tail.ptr, launch,
                           capturing, record, eng.driver.wait_entry_point())
        self._engine = eng
        self._armed.clear()

    def _start_coalescing(self, device: Any = None) -> None:
        self.native.hold(True)
        super()._start_coalescing(device)

    def _end_coalescing(self, device: Any = None) -> Any:
        self.native.hold(False)
        return super()._end_coalescing(device)

    @property
    def replays(self) -> int:
        """all_reduce calls the compiled side replayed (with no Python)."""
        return self.native.replays
