"""torch.distributed backend "hpccl": ``import hpccl.torch`` registers it, then
``torch.distributed.init_process_group("hpccl")`` runs torch's collectives,
DDP and FSDP included, on hpccl communicators, for CPU and CUDA tensors.

Bootstrap (HPCCL_BOOTSTRAP): under mpiexec or srun, MPI (mpi4py), with torch's rank equal to the MPI rank
(``hpccl.torch.init_process_group()`` sets that up), and subgroups over the matching MPI group; under
torchrun (no MPI launcher), the c10d Store torch hands the backend for each group.

Work, as ProcessGroupNCCL's: CUDA collectives run on an hpccl stream per group and device that first
waits on the caller's current stream; the caller's tensors are recorded on it with the caching allocator
(record_stream), and the call returns at once. The Work's wait() (and its future's) makes the caller's
current stream wait on that stream: no host synchronisation. CPU collectives complete inside the call, as
hpccl's host calls do. Bad input and hpccl's timeouts (naming the collective and the ranks) raise from
the call.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
import torch.autograd.profiler as _autograd_profiler
import torch.distributed as dist

from .. import Communicator, config
from ..bootstrap import StoreBootstrap
from .. import log
from ..errors import HpcclError, HpcclInvalidArgument
from ..ops import AVG, MAX, MIN, PROD, SUM

BACKEND = "hpccl"

_T = dist.ReduceOp.RedOpType
_RED = {_T.SUM: SUM, _T.PRODUCT: PROD, _T.MIN: MIN, _T.MAX: MAX, _T.AVG: AVG}


def _op(opts: Any) -> Tuple[Any, Optional[float]]:
    """(hpccl op, premul factor or None): PREMUL_SUM is a SUM of inputs scaled by its factor."""
    r = opts.reduceOp
    kind = getattr(r, "op", r)  # a ReduceOp carries its RedOpType
    ours = _RED.get(kind)
    if ours is not None:
        return ours, None
    if kind == _T.PREMUL_SUM:
        f = getattr(r, "factor", None)
        if f is None:  # torch <= 2.12 exposes the factor only through the op's pickled state
            try:
                f = r.__getstate__()[1]
            except Exception:  # noqa: BLE001 - no such state in this version
                f = None
        if f is None:
            raise HpcclInvalidArgument("op", "PREMUL_SUM without a readable factor in this torch version")
        return SUM, float(f.item() if isinstance(f, torch.Tensor) else f)
    raise HpcclInvalidArgument("op", f"torch ReduceOp {r} is not supported by hpccl (SUM, PRODUCT, MIN, MAX, "
                                     "AVG, PREMUL_SUM)")


def _is_premul(opts: Any) -> bool:
    return getattr(opts.reduceOp, "op", opts.reduceOp) == _T.PREMUL_SUM


def _scaled(t: torch.Tensor, factor: Optional[float]) -> torch.Tensor:
    """The input a premul sum reduces: a scaled copy (the caller's input is never changed)."""
    return t if factor is None else t * factor


class _Side:
    """A group's CUDA resources on one device: hpccl's stream, the event that joins it to the caller's
    stream, and a ring of completion events (a Work waited on after its event was re-recorded waits for
    later work on the same stream: stronger, never wrong)."""

    RING = 64

    def __init__(self, idx: int) -> None:
        from ..kernels import Driver
        self.drv = Driver.get()
        self.stream = torch.cuda.Stream(device=idx)
        self.h = int(self.stream.cuda_stream)
        with torch.cuda.device(idx):
            self.join = self.drv.event()
            self.ring = [self.drv.event() for _ in range(self.RING)]
        self.i = 0

    def done_event(self) -> int:
        """A ring event recorded on hpccl's stream now."""
        ev = self.ring[self.i]
        self.i = (self.i + 1) % self.RING
        self.drv.event_record(ev, self.h)
        return ev


class _Work(dist._Work):
    """A collective's Work, as ProcessGroupNCCL's behaves: host work is complete when made; CUDA work ends
    with an event on hpccl's stream, and wait() makes the caller's current stream wait on it (no host
    sync). The future is made only when asked for (torch's CUDA futures cost tens of us to complete)."""

    def __init__(self, result: Any, side: Optional[_Side] = None, device: int = 0) -> None:
        super().__init__()
        self._result, self._side, self._device = result, side, device
        self._event = side.done_event() if side is not None else 0

    def wait(self, timeout: Any = None) -> bool:
        if self._side is not None:
            self._side.drv.stream_wait_event(torch._C._cuda_getCurrentRawStream(self._device), self._event, 0)
        return True

    def is_completed(self) -> bool:
        return self._side is None or self._side.drv.event_query(self._event) == 0

    def is_success(self) -> bool:
        return True

    def exception(self) -> Any:
        return None

    def synchronize(self) -> None:
        if self._side is not None:
            self._side.drv.event_synchronize(self._event)

    def result(self) -> Any:
        r = self._result
        return r if isinstance(r, list) else ([] if r is None else [r])

    def get_future(self) -> torch.futures.Future:
        if self._side is None:
            fut: torch.futures.Future = torch.futures.Future()
            fut.set_result(self._result)
            return fut
        fut = torch.futures.Future(devices=[self._device])
        with torch.cuda.stream(self._side.stream):  # its completion event is recorded after this Work's
            fut.set_result(self._result)
        return fut


def _done(result: Any) -> Any:
    return _Work(result)


def _opts(opts: Any, cls: Any, op: Any = None, root: Optional[int] = None) -> Any:
    """The Options torch's pybind overloads would build: callers pass Options, a ReduceOp, a root, or none."""
    if isinstance(opts, cls):
        return opts
    o = cls()
    if isinstance(opts, (dist.ReduceOp, dist.ReduceOp.RedOpType)):
        op = opts
    elif isinstance(opts, int):
        root = opts
    if op is not None:
        o.reduceOp = op if isinstance(op, dist.ReduceOp) else dist.ReduceOp(op)
    if root is not None:
        o.rootRank = root
    return o


def _list(x: Any) -> List[Any]:
    return [x] if isinstance(x, torch.Tensor) else x


def _flat(t: torch.Tensor, name: str) -> torch.Tensor:
    if not t.is_contiguous():
        raise HpcclInvalidArgument(name, "tensor is not contiguous; pass t.contiguous()")
    return t.view(-1)


class HpcclProcessGroup(dist.ProcessGroup):
    """A torch ProcessGroup whose collectives are one hpccl Communicator's."""

    def __init__(self, comm: Communicator, rank: int, size: int) -> None:
        super().__init__(rank, size)
        self.comm = comm
        self._coalescing: Optional[List[Any]] = None
        self._streams: dict = {}  # device index -> this group's _Side there
        self._h: Optional[int] = None  # the stream handle hpccl's calls are enqueued on (None: host)

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    # torch names each group after creating it; a ProcessGroup implemented in Python keeps the name itself
    # (the C++ base stores it on per-device backends, which this group does not have)
    def _set_group_name(self, name: str) -> None:
        self._hpccl_group_name = name

    @property
    def group_name(self) -> str:  # type: ignore[override]
        return getattr(self, "_hpccl_group_name", "")

    def _set_group_desc(self, desc: str) -> None:
        self._hpccl_group_desc = desc

    @property
    def group_desc(self) -> str:  # type: ignore[override]
        return getattr(self, "_hpccl_group_desc", "")

    def _get_backend(self, device: Any) -> "HpcclProcessGroup":
        """This group serves every device itself."""
        return self

    @property
    def name(self) -> str:  # type: ignore[override]
        return BACKEND

    def shutdown(self) -> None:
        """destroy_process_group: finalize collectively, as ncclCommFinalize does (no rank leaves, tearing
        down the store rank 0 serves, while another still shuts down a newer group), then free the comm. A
        peer that never arrives is named in a warning after HPCCL_TIMEOUT; the communicator is freed anyway."""
        if self.comm._destroyed:
            return
        try:
            self._wait_streams()
            self.comm.barrier()
        except HpcclError as exc:
            log.warn("INIT", "process group shutdown: %s", exc)
        finally:
            self.comm.destroy()

    # ----- torch.distributed.split_group ------------------------------------------------------------
    options = None  # no backend options: split_group copies the parent's

    @property
    def supports_splitting(self) -> bool:  # type: ignore[override]
        """True for split_group, which this group serves. torch also asks it (in _get_split_source) when it
        builds a group of another backend, e.g. new_group(backend="nccl"), to split that from the default
        group; only NCCL's own groups can be split into NCCL ones, so the answer there is False."""
        return sys._getframe(1).f_code.co_name != "_get_split_source"

    def eager_connect_single_device(self, device: Any) -> None:
        """init_process_group(device_id=...): the group's GPU is that one."""
        if device is not None and getattr(device, "type", None) == "cuda" and self.comm._dev is None:
            self.comm.cuda_device = device.index if device.index is not None else torch.cuda.current_device()

    def perform_nocolor_split(self, device: Any) -> None:
        """A rank outside a new_group: nothing to do (hpccl builds a subgroup among its members only)."""

    def comm_split_count(self) -> int:
        return getattr(self, "_splits", 0)

    def _set_sequence_number_for_group(self) -> None:
        """hpccl's communicators count their own calls (the sequence numbers its timeouts name)."""

    def _get_sequence_number_for_group(self) -> int:
        return self.comm._seq

    def split_group(self, ranks: Sequence[int], timeout: Any = None, opts: Any = None, group_name: Any = None,
                    group_desc: Any = None, device_types: Any = None) -> Optional["HpcclProcessGroup"]:
        """The subgroup of these ranks (of this group), by splitting this group's communicator (every rank
        of this group calls it; a rank outside ``ranks`` gets None), as ncclCommSplit does for NCCL."""
        ranks = sorted(int(r) for r in ranks)
        me = self.rank()
        self._splits = self.comm_split_count() + 1
        sub = self.comm.split(min(ranks) if me in ranks else -1, me)
        if sub is None:
            return None
        if sub.size != len(ranks):
            raise HpcclInvalidArgument("split_ranks", f"{ranks} overlaps another split of the same call")
        if self.comm._dev is not None:
            sub.cuda_device = self.comm._dev.device
        elif self.comm.cuda_device is not None:
            sub.cuda_device = self.comm.cuda_device
        pg = HpcclProcessGroup(sub, ranks.index(me), len(ranks))
        if group_name:
            pg._set_group_name(group_name)
        if group_desc:
            pg._set_group_desc(group_desc)
        return pg

    def _run(self, result: Any, fn: Callable[[], None], tensors: Sequence[torch.Tensor] = (),
             temps: bool = True) -> Any:
        """Run an hpccl call: CPU tensors complete here; CUDA tensors are enqueued on this group's stream
        (after the caller's current stream's work), and the Work's wait() joins the caller's stream to it.
        ``temps``: the call makes torch temporaries, which then belong to hpccl's stream. Errors (bad input
        naming the argument, timeouts naming the ranks) raise from the call itself. Under torch.profiler
        the call is a range named "hpccl:<the torch method>" (e.g. hpccl:allreduce)."""
        if _autograd_profiler._is_profiler_enabled:
            with torch.profiler.record_function("hpccl:" + sys._getframe(1).f_code.co_name):  # the method that called
                return self._run_now(result, fn, tensors, temps)
        return self._run_now(result, fn, tensors, temps)

    def _run_now(self, result: Any, fn: Callable[[], None], tensors: Sequence[torch.Tensor], temps: bool) -> Any:
        if not tensors or not tensors[0].is_cuda:
            self._h = None
            fn()
            return _Work(result)
        idx = tensors[0].get_device()
        side = self._streams.get(idx)
        if side is None:
            side = self._new_side(idx)
        drv = side.drv
        drv.event_record(side.join, torch._C._cuda_getCurrentRawStream(idx))
        drv.stream_wait_event(side.h, side.join, 0)  # hpccl's stream starts after the caller's work so far
        for t in tensors:
            if t.is_cuda:
                t.record_stream(side.stream)  # not reused by the caller's stream while hpccl's still reads it
        self._h = side.h
        if temps:
            cur = torch.cuda.current_stream(idx)
            torch.cuda.set_stream(side.stream)
            try:
                fn()
            finally:
                torch.cuda.set_stream(cur)
        else:
            fn()
        return _Work(result, side, idx)

    def _new_side(self, idx: int) -> _Side:
        if self.comm.cuda_device is None:
            self.comm.cuda_device = idx  # the group's GPU is its tensors' (torch's LOCAL_RANK device)
        if self.bound_device_id is None:  # split_group needs it; torch sets it only for Backend objects
            self.bound_device_id = torch.device("cuda", idx)
        side = self._streams[idx] = _Side(idx)
        return side

    def _wait_streams(self) -> None:
        """The host waits for this group's CUDA work (barrier's meaning, as with NCCL)."""
        for side in self._streams.values():
            side.stream.synchronize()

    # ----- reductions -----------------------------------------------------------------------------
    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        tensors, opts = _list(tensors), _opts(opts, dist.AllreduceOptions)

        def go() -> None:
            op, factor = _op(opts)
            for t in tensors:
                flat = _flat(t, "tensor")
                if factor is not None:
                    flat.mul_(factor)  # in place: the tensor is the output too
                self.comm.all_reduce(flat, op=op, stream=self._h)
        return self._run(tensors, go, tensors, temps=_is_premul(opts))

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        return self.allreduce(tensors, opts)

    def reduce(self, tensors: List[torch.Tensor], opts: Any = None, op: Any = None) -> Any:
        tensors, opts = _list(tensors), _opts(opts, dist.ReduceOptions, op)

        def go() -> None:
            op, factor = _op(opts)
            for t in tensors:
                flat = _flat(t, "tensor")
                self.comm.reduce(_scaled(flat, factor), flat if self.rank() == opts.rootRank else None,
                                 root=opts.rootRank, op=op)
        return self._run(tensors, go, tensors)

    def reduce_scatter(self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]],
                       opts: Any = None) -> Any:
        if isinstance(output_tensors, torch.Tensor):
            output_tensors, input_tensors = [output_tensors], [input_tensors]
        opts = _opts(opts, dist.ReduceScatterOptions)

        def go() -> None:
            op, factor = _op(opts)
            for out, ins in zip(output_tensors, input_tensors):
                if len(ins) != self.size():
                    raise HpcclInvalidArgument("input_list", f"has {len(ins)} tensors, needs {self.size()}")
                flat = torch.cat([_flat(t, "input_list") for t in ins])
                self.comm.reduce_scatter(_scaled(flat, factor), _flat(out, "output"), op=op)
        return self._run(output_tensors, go, [*output_tensors, *(t for ins in input_tensors for t in ins)])

    def _reduce_scatter_one(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> None:
        op, factor = _op(opts)
        self.comm.reduce_scatter(_scaled(_flat(input, "input"), factor), _flat(output, "output"), op=op,
                                 stream=self._h)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        opts = opts or dist.ReduceScatterOptions()
        return self._run(output, lambda: self._reduce_scatter_one(output, input, opts), (output, input),
                         temps=_is_premul(opts))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
                                        opts: Any = None) -> Any:
        opts = opts or dist.ReduceScatterOptions()

        def go() -> None:
            for o, i in zip(outputs, inputs):
                self._reduce_scatter_one(o, i, opts)
        return self._run(list(outputs), go, [*outputs, *inputs])

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # ----- data movement --------------------------------------------------------------------------
    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        tensors, opts = _list(tensors), _opts(opts, dist.BroadcastOptions)

        def go() -> None:
            for t in tensors:
                self.comm.broadcast(_flat(t, "tensor"), root=opts.rootRank, stream=self._h)
        return self._run(tensors, go, tensors, temps=False)

    def _allgather_list(self, outs: List[torch.Tensor], inp: torch.Tensor) -> None:
        if len(outs) != self.size():
            raise HpcclInvalidArgument("tensor_list", f"has {len(outs)} tensors, needs {self.size()}")
        src = _flat(inp, "tensor")
        both = torch.empty(self.size() * src.numel(), dtype=src.dtype, device=src.device)
        self.comm.all_gather(src, both)
        for r, o in enumerate(outs):
            o.copy_(both[r * src.numel():(r + 1) * src.numel()].view_as(o))

    def allgather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor],
                  opts: Any = None) -> Any:
        if isinstance(input_tensors, torch.Tensor):
            output_tensors, input_tensors = [output_tensors], [input_tensors]

        def go() -> None:
            for outs, inp in zip(output_tensors, input_tensors):
                self._allgather_list(outs, inp)
        return self._run(output_tensors, go, [*input_tensors, *(t for outs in output_tensors for t in outs)])

    def allgather_coalesced(self, output_lists: List[List[torch.Tensor]], input_list: List[torch.Tensor],
                            opts: Any = None) -> Any:
        """output_lists[r][i] = rank r's input_list[i]."""
        if len(output_lists) != self.size():
            raise HpcclInvalidArgument("output_tensor_lists", f"has {len(output_lists)} lists, needs {self.size()}")

        def go() -> None:
            for i, inp in enumerate(input_list):
                self._allgather_list([output_lists[r][i] for r in range(self.size())], inp)
        return self._run(output_lists, go, [*input_list, *(t for outs in output_lists for t in outs)])

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> Any:
        from ..errors import HpcclUnsupported
        raise HpcclUnsupported("recv from any source: hpccl matches point-to-point messages by (peer, order), "
                               "as NCCL does; name the source rank")

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        return self._run(output, lambda: self.comm.all_gather(_flat(input, "input_tensor"), _flat(output, "output_tensor"),
                                                              stream=self._h), (output, input), temps=False)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
                                    opts: Any = None) -> Any:
        def go() -> None:
            for o, i in zip(outputs, inputs):
                self.comm.all_gather(_flat(i, "input_tensor"), _flat(o, "output_tensor"))
        return self._run(list(outputs), go, [*outputs, *inputs])

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def _exchange(self, sends: List[Any], recvs: List[Any]) -> None:
        """Sends and receives together (hpccl's group): no ordering deadlock; empty ones are skipped."""
        with self.comm.group():
            for peer, t in sends:
                if t.numel():
                    self.comm.send(t, peer)
            for peer, t in recvs:
                if t.numel():
                    self.comm.recv(t, peer)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: List[int],
                          input_split_sizes: List[int], opts: Any = None) -> Any:
        """Equal splits: hpccl's all_to_all; uneven (rows of dim 0 per rank): its all_to_all_v."""
        n = self.size()

        def go() -> None:
            src, dst = _flat(input, "input"), _flat(output, "output")
            if not output_split_sizes and not input_split_sizes:
                self.comm.all_to_all(src, dst)
                return
            ins = _splits(input_split_sizes, input, n, "input_split_sizes")
            outs = _splits(output_split_sizes, output, n, "output_split_sizes")
            row_in = input[0].numel() if input.dim() and input.shape[0] else 0
            row_out = output[0].numel() if output.dim() and output.shape[0] else 0
            self.comm.all_to_all_v(src, dst, [c * row_in for c in ins], [c * row_out for c in outs])
        return self._run(output, go, (output, input))

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor],
                 opts: Any = None) -> Any:
        def go() -> None:
            self._exchange([(p, _flat(t, "input_tensor_list")) for p, t in enumerate(input_tensors)],
                           [(p, _flat(t, "output_tensor_list")) for p, t in enumerate(output_tensors)])
        return self._run(output_tensors, go, [*output_tensors, *input_tensors])

    def gather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor],
               opts: Any = None) -> Any:
        if isinstance(input_tensors, torch.Tensor):
            output_tensors, input_tensors = [output_tensors], [input_tensors]
        root = _opts(opts, dist.GatherOptions).rootRank

        def go() -> None:
            src = _flat(input_tensors[0], "tensor")
            if self.rank() == root:
                self._exchange([(root, src)], [(p, _flat(t, "gather_list"))
                                               for p, t in enumerate(output_tensors[0])])
            else:
                self._exchange([(root, src)], [])
        return self._run(output_tensors, go, [*input_tensors, *(t for ts in output_tensors for t in ts)])

    def scatter(self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]],
                opts: Any = None) -> Any:
        if isinstance(output_tensors, torch.Tensor):
            output_tensors, input_tensors = [output_tensors], [input_tensors]
        root = _opts(opts, dist.ScatterOptions).rootRank

        def go() -> None:
            dst = _flat(output_tensors[0], "tensor")
            if self.rank() == root:
                self._exchange([(p, _flat(t, "scatter_list")) for p, t in enumerate(input_tensors[0])],
                               [(root, dst)])
            else:
                self._exchange([], [(root, dst)])
        return self._run(output_tensors, go, [*output_tensors, *(t for ts in input_tensors for t in ts)])

    def barrier(self, opts: Any = None) -> Any:
        """Every rank arrived, and this rank's CUDA collectives of this group are done (as NCCL's barrier
        leaves the host after the device work)."""
        self._wait_streams()
        return self._run(None, self.comm.barrier)

    # ----- point to point, and batch_isend_irecv's coalescing -------------------------------------
    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0) -> Any:
        if self._coalescing is not None:
            self._coalescing.append(("send", dst, tensors))
            return _done(tensors)
        return self._run(tensors, lambda: [self.comm.send(_flat(t, "tensor"), dst) for t in tensors], tensors)

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0) -> Any:
        if self._coalescing is not None:
            self._coalescing.append(("recv", src, tensors))
            return _done(tensors)
        return self._run(tensors, lambda: [self.comm.recv(_flat(t, "tensor"), src) for t in tensors], tensors)

    def _start_coalescing(self, device: Any = None) -> None:
        self._coalescing = []

    def _end_coalescing(self, device: Any = None) -> Any:
        ops, self._coalescing = self._coalescing or [], None
        sends = [(peer, _flat(t, "tensor")) for kind, peer, ts in ops if kind == "send" for t in ts]
        recvs = [(peer, _flat(t, "tensor")) for kind, peer, ts in ops if kind == "recv" for t in ts]
        return self._run(None, lambda: self._exchange(sends, recvs), [t for _, _, ts in ops for t in ts])


def _splits(sizes: Sequence[int], t: torch.Tensor, n: int, name: str) -> List[int]:
    """Rows of dim 0 per rank: as given (checked to add up), or equal when empty."""
    rows = t.shape[0] if t.dim() else t.numel()
    if not sizes:
        if rows % n:
            raise HpcclInvalidArgument(name, f"empty, and {rows} rows do not split evenly over {n} ranks")
        return [rows // n] * n
    sizes = list(sizes)
    if len(sizes) != n or sum(sizes) != rows or min(sizes) < 0:
        raise HpcclInvalidArgument(name, f"{sizes} does not split {rows} rows over {n} ranks")
    return sizes


def _mpi_comm(global_ranks: Sequence[int], group_size: int) -> Any:
    """The MPI communicator of a torch group: the world for the default group (whose ranks must be MPI's),
    else the MPI group of the same world ranks (created only by its members, as torch calls this)."""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    ranks = list(global_ranks) or list(range(group_size))
    if ranks == list(range(world.Get_size())):
        return world
    if max(ranks) >= world.Get_size():
        raise HpcclInvalidArgument("world_size", f"torch's group has ranks {ranks} but MPI's world has "
                                                 f"{world.Get_size()}: launch every torch rank as an MPI rank")
    return world.Create_group(world.Get_group().Incl(ranks))


_MPI_ENV = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALRANKID")


def _use_mpi() -> bool:
    mode = config.get("HPCCL_BOOTSTRAP")
    if mode not in ("auto", "mpi", "store"):
        raise HpcclInvalidArgument("HPCCL_BOOTSTRAP", f"{mode!r} is not auto, mpi or store")
    return mode == "mpi" or (mode == "auto" and any(v in os.environ for v in _MPI_ENV))


def _create(dist_opts: Any, backend_opts: Any = None) -> HpcclProcessGroup:
    """The creator torch calls for each group that uses "hpccl" (extended API)."""
    if not _use_mpi():
        boot = StoreBootstrap(dist_opts.store, dist_opts.group_rank, dist_opts.group_size, "hpccl")
        return HpcclProcessGroup(Communicator(boot), dist_opts.group_rank, dist_opts.group_size)
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    ranks = list(dist_opts.global_ranks_in_group)
    if not ranks and dist_opts.group_size == world.Get_size() and dist_opts.group_rank != world.Get_rank():
        raise HpcclInvalidArgument("rank", f"torch rank {dist_opts.group_rank} is MPI rank {world.Get_rank()}: "
                                           "the hpccl backend needs torch's ranks to be MPI's (use "
                                           "hpccl.torch.init_process_group(), or RANK from the MPI launcher)")
    mc = _mpi_comm(ranks, dist_opts.group_size)
    comm = Communicator(mc)
    if comm.size != dist_opts.group_size:
        raise HpcclInvalidArgument("world_size", f"torch's group has {dist_opts.group_size} ranks, the MPI "
                                                 f"communicator {comm.size}")
    return HpcclProcessGroup(comm, dist_opts.group_rank, dist_opts.group_size)


def register() -> None:
    """Register the "hpccl" backend with torch.distributed (idempotent; done by importing hpccl.torch)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])


def init_process_group(backend: str = BACKEND, **kwargs: Any) -> None:
    """torch.distributed.init_process_group with rank, world size and a TCP store taken from MPI, for jobs
    launched by mpiexec or srun (rank 0's host and a free port are broadcast over MPI)."""
    from mpi4py import MPI
    import socket
    world = MPI.COMM_WORLD
    addr = None
    if world.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        host = os.environ.get("MASTER_ADDR") or socket.gethostbyname(socket.gethostname())
        addr = f"tcp://{host}:{port}"
    addr = world.bcast(addr, root=0)
    kwargs.setdefault("init_method", addr)
    dist.init_process_group(backend, rank=world.Get_rank(), world_size=world.Get_size(), **kwargs)
    dev = kwargs.get("device_id")
    pg = dist.group.WORLD
    if dev is not None and isinstance(pg, HpcclProcessGroup) and pg.bound_device_id is None:
        pg.bound_device_id = dev  # torch binds only Backend objects; split_group reads it


register()
