"""ReplayGroup: the hpccl ProcessGroup whose all_reduce, all_gather_into_tensor and reduce_scatter_tensor
torch dispatches to hpccl's compiled backend (hpccl/torch/_native.cpp) instead of Python. A repeated call
on dense CUDA tensors (DDP's buckets, FSDP2's parameter groups, a training loop's dist.all_reduce) replays
its snapshotted launch there with no Python and no GIL; a group across nodes (one rank per node) replays its
recorded network call through the network front door's C entry, under the GIL but with no Python of the
backend's. The first call on each buffer, and every other call, runs the Python backend's method, and this
module then hands what hpccl snapshotted or recorded for it to the compiled side ("arms" it). Every other op
stays Python's (HpcclProcessGroup)."""
from __future__ import annotations

import ctypes
import weakref
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.distributed as dist

from .. import Communicator
from ..gpu.cuda_comm import NOTHING
from ..gpu.gpu_sync import Bound, Clone
from ..host import hotpath
from ..kernels import Driver
from .options import asynchronous, flat, reduce_op
from .process_group import HpcclProcessGroup

AR, AG, RS = 0, 1, 2  # the compiled side's collective numbers (Coll in _native.cpp)
_AR_NAME = "all_reduce"  # the waiter's collective of a replayed hier all_reduce (held: the C side keeps its address)
_DOOR_CODES = (0, 3, 4)  # theirs at the network front door (gpu/netreplay.py CODES)
_CPP = dist.ProcessGroup.__dict__  # the C++ methods themselves (descriptors, so they bind)


def _slow_path(group: "weakref.ref[ReplayGroup]") -> Callable[..., Any]:
    """The compiled side's way back into Python, holding the group weakly (no cycle through C++)."""
    def slow(kind: str, *args: Any) -> Any:
        g = group()
        if g is None:
            raise RuntimeError(f"hpccl: {kind} on a process group that was destroyed")
        return getattr(g, "_slow_" + kind)(*args)
    return slow


class ReplayGroup(HpcclProcessGroup):
    """An HpcclProcessGroup whose three hot collectives are served by the compiled backend, registered
    with torch for CPU and CUDA tensors (CPU calls and first calls come back to Python through it)."""

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
        self._door: Any = None  # or the network front door (a NetDoor) of a group across nodes
        self._side_dev: Optional[int] = None
        self._armed: Dict[tuple, Any] = {}  # launches the compiled side replays (their argument memory)
        self._armed_gen = -1

    # ----- the compiled side's slow path: Python's method, then arm what hpccl snapshotted -------------
    def _slow_allreduce(self, tensors: List[torch.Tensor], opts: Any) -> Any:
        work = self._allreduce(tensors, opts)
        if len(tensors) == 1 and tensors[0].is_cuda and not tensors[0].is_sparse:
            t = tensors[0]
            self._arm(AR, "ar", t, t, opts, True)
        return work

    def _slow_allgather_base(self, out: torch.Tensor, inp: torch.Tensor, opts: Any) -> Any:
        work = HpcclProcessGroup.all_gather_single(self, out, inp, opts)
        if inp.is_cuda and out.is_cuda:
            self._arm(AG, "ag", inp, out, opts, False)
        return work

    def _slow_reduce_scatter_base(self, out: torch.Tensor, inp: torch.Tensor, opts: Any) -> Any:
        work = HpcclProcessGroup.reduce_scatter_single(self, out, inp, opts)
        if inp.is_cuda and out.is_cuda:
            self._arm(RS, "rs", inp, out, opts, True)
        return work

    def _arm(self, coll: int, name: str, inp: torch.Tensor, out: torch.Tensor, opts: Any, reduces: bool) -> None:
        """Hand the launch hpccl snapshotted for this call (if it did) to the compiled side, under the key
        the compiled side computes (collective, buffers, size, dtype, torch's op, stream)."""
        op, rop = None, 0
        if reduces:
            op, factor = reduce_op(opts)
            if factor is not None:
                return  # a premul sum reduces a scaled copy made per call: nothing to replay
            rop = int(getattr(opts.reduceOp, "op", opts.reduceOp))
        dev, door = self.comm._dev, self.comm._door
        eng = dev.engine if dev is not None else None
        hier = dev.hier if dev is not None and coll == AR else None
        if (eng is None and door is None and hier is None) or not (inp.is_contiguous() and out.is_contiguous()):
            return
        idx = inp.get_device()
        h = torch._C._cuda_getCurrentRawStream(idx)
        if asynchronous(opts):
            side = self._sides.get(idx)
            if side is None or self._side_dev not in (None, idx):
                return
            if self._side_dev is None:
                self.native.side(*side.ids, side.h, side.join)
                self._side_dev = idx
            h = side.h
        if hier is not None:
            self._arm_hier(hier, inp, op, rop, h)
            return
        if door is not None:
            self._arm_net(door, coll, inp, out, op, rop, h)
            return
        if eng is not self._engine:
            self._attach(eng)
        x = flat(inp, "tensor")
        ln = self._replayable(eng, eng.fast_key(name, x, None if coll == AR else flat(out, "output"), op, -1, h))
        if ln is None:
            return
        self._keep((coll, inp.data_ptr(), out.data_ptr(), inp.nbytes, inp.dtype, rop, h), ln, eng.fs.gen)
        self.native.arm(coll, inp, out, rop, h, eng.fs.gen, *_launch_args(ln))

    @staticmethod
    def _replayable(eng: Any, key: Any) -> Any:
        """What the compiled side can replay of the engine's snapshot under key: the launch, NOTHING, or a
        stream-synchronised program's clone bound to its buffers; None when there is nothing it can."""
        ln = eng._fast.get(key) if key is not None else None
        if type(ln) is Bound:
            return ln.prog.clone(ln.send, ln.recv, ln.aligned) if eng.compiled_program is not None else None
        if ln is None or (ln is not NOTHING and not hasattr(ln, "fi")):
            return None
        return ln

    def _keep(self, key: tuple, what: Any, gen: int) -> None:
        """Hold what an armed entry's memory belongs to (launch arguments, clones, chains) while it may replay."""
        if gen != self._armed_gen:
            self._armed.clear()
            self._armed_gen = gen
        self._armed[key] = what

    def _arm_hier(self, hier: Any, t: torch.Tensor, op: Any, rop: int, h: int) -> None:
        """Arm a hier all_reduce's chain (hpccl/gpu/hierreplay.py) once each of its three sub-calls has what
        the compiled side replays: the node engine's two snapshots and the network door's recording."""
        comm = self.comm
        ch = hier.get(comm._dev.keys.key("ar", flat(t, "tensor"), None, op, -1, h))
        intra, inter = comm._sub.get("intra"), comm._sub.get("inter")
        if ch is None or ch.k_rs is None or intra is None or inter is None or inter._door is None:
            return
        eng, door = intra._dev.engine, inter._door
        rs, ag = self._replayable(eng, ch.k_rs), self._replayable(eng, ch.k_ag)
        slot = door.slot(0, ch.part, None, ch.op, -1, h)
        if rs is None or ag is None or slot < 0:
            return
        if eng is not self._engine:
            self._attach(eng)
        if door is not self._door:
            self._attach_door(door)
        self._keep((AR, t.data_ptr(), t.nbytes, t.dtype, rop, h), (rs, ag, ch), eng.fs.gen)
        self.native.arm_hier(t, rop, h, eng.fs.gen, *_launch_args(rs), slot, door.generation, *_launch_args(ag),
                             door.count_call, id(comm), id(_AR_NAME))

    def _slow_hier_rest(self, start: int, t: torch.Tensor, rop: int, h: int) -> None:
        """The rest of a chain the compiled side began (sub-call ``start`` on) through the Python paths."""
        kept = self._armed.get((AR, t.data_ptr(), t.nbytes, t.dtype, rop, h))
        if kept is None:
            raise RuntimeError("hpccl: the compiled backend replayed part of a hier all_reduce whose chain is gone")
        kept[2].run(self.comm._sub["intra"], self.comm._sub["inter"], start)

    def _arm_net(self, door: Any, coll: int, inp: torch.Tensor, out: torch.Tensor, op: Any, rop: int, h: int) -> None:
        """Hand the door's entry for this call (the Python path just ran it: recorded, or replayed through
        the door) to the compiled side; none yet (a first call is recorded at its end) arms nothing."""
        if door is not self._door:
            self._attach_door(door)
            self._engine = None
        y = None if coll == AR else flat(out, "output")
        slot = door.slot(_DOOR_CODES[coll], flat(inp, "tensor"), y, op, -1, h)
        if slot >= 0:
            self.native.arm_net(coll, inp, out, rop, h, slot, door.generation)

    def _attach_door(self, door: Any) -> None:
        drv = Driver.get()
        self.native.attach_net(id(door), door.fire_slot, drv.entry_points()[2], drv.wait_entry_point())
        self._door = door
        self._armed.clear()

    def _attach(self, eng: Any) -> None:
        pub = eng._shm.device_counter_address() if eng._pub is not None else 0
        launch, capturing, record = eng._entry
        prog = eng.compiled_program is not None
        self.native.attach(ctypes.addressof(eng.fs), ctypes.addressof(eng._err), pub, eng._tail.ptr, launch,
                           capturing, record, eng.driver.wait_entry_point(),
                           hotpath._hotpath.program_entry() if prog else 0, eng._batch_addr if prog else 0)
        self._engine = eng
        self._armed.clear()

    # ----- torch's coalescing: the compiled side steps aside ----------------------------------------
    def _start_coalescing(self, device: Any = None) -> None:
        self.native.hold(True)
        super()._start_coalescing(device)

    def _end_coalescing(self, device: Any = None) -> Any:
        self.native.hold(False)
        return super()._end_coalescing(device)

    @property
    def replays(self) -> int:
        """Calls the compiled side replayed (with no Python)."""
        return self.native.replays


# not overridden in Python (the C++ methods themselves): torch dispatches these to the registered backend;
# every name a torch version may look up is covered
for _name in ("allreduce", "_allgather_base", "all_gather_single", "_reduce_scatter_base", "reduce_scatter_single"):
    if _name in _CPP:
        setattr(ReplayGroup, _name, _CPP[_name])
del _name


def _launch_args(ln: Any) -> tuple:
    """(func, grid, block, params, steps) of what the compiled side replays: NOTHING all zeros, a program's
    clone its packed steps and their count."""
    if ln is NOTHING:
        return (0, 0, 0, 0, 0)
    if type(ln) is Clone:
        return (ln.addr, 0, 0, 0, ln.count)
    return (ln.fi, ln.grid, ln.block, ln.pi, 0)
