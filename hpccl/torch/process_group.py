"""HpcclProcessGroup: torch's collectives on one hpccl Communicator. Every torch op is an adapter of a few
lines around one core, ``_collective``, which owns the stream choice, the join to the caller's stream,
allocator safety, the profiler range and the Work."""
from __future__ import annotations

import sys
from typing import Any, Callable, List, Optional, Sequence

import torch
import torch.autograd.profiler as _autograd_profiler
import torch.distributed as dist

from .. import Communicator, log
from ..errors import HpcclError, HpcclInvalidArgument, HpcclUnsupported
from ..ops import SUM
from .options import as_list, asynchronous, flat, options, reduce_op, scaled, splits
from .work import Side, Work, on_stream

BACKEND = "hpccl"
Fn = Callable[[Optional[int]], None]  # runs hpccl's call(s) on a stream handle (None: host tensors)

_current_stream = torch._C._cuda_getCurrentRawStream if torch.cuda.is_available() else None


class HpcclProcessGroup(dist.ProcessGroup):
    """A torch ProcessGroup whose collectives are one hpccl Communicator's."""

    def __init__(self, comm: Communicator, rank: int, size: int) -> None:
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self.comm = comm
        self._coalescing: Optional[List[Any]] = None
        self._sides: dict = {}  # device index -> this group's Side there (asynchronous calls)
        self._bound: set = set()  # device indices this group's calls have run on

    # ----- the core -------------------------------------------------------------------------------
    def _collective(self, opts: Any, tensors: Sequence[torch.Tensor], fn: Fn, result: Any,
                    temps: bool = False, name: Optional[str] = None) -> Any:
        """Run ``fn`` as torch expects of a backend, as ProcessGroupNCCL does:
        - host tensors complete inside the call;
        - a synchronous CUDA call (asyncOp false) is enqueued on the caller's current stream: no events, no
          Work (torch then waits on nothing);
        - an asynchronous one runs on this group's stream, which first waits on the caller's; its tensors
          are recorded on that stream with the caching allocator, and the Work's wait() joins the caller's
          stream back (no host sync). ``temps``: fn makes torch temporaries, which then belong to hpccl's
          stream.
        Bad input and hpccl's timeouts raise from the call. Under torch.profiler the call is a range named
        "hpccl:<the torch method>" (``name``, else the method that called)."""
        if _autograd_profiler._is_profiler_enabled:
            with torch.profiler.record_function("hpccl:" + (name or sys._getframe(1).f_code.co_name)):
                return self._launch(opts, tensors, fn, result, temps)
        return self._launch(opts, tensors, fn, result, temps)

    def _launch(self, opts: Any, tensors: Sequence[torch.Tensor], fn: Fn, result: Any, temps: bool) -> Any:
        t = tensors[0] if tensors else None
        if t is None or not t.is_cuda:
            fn(None)
            return Work(result) if asynchronous(opts) else None
        idx = t.get_device()
        if not asynchronous(opts):
            if idx not in self._bound:
                self._bind(idx)
            fn(_current_stream(idx))
            return None
        side = self._sides.get(idx)
        if side is None:
            side = self._sides[idx] = self._bind(idx)
        side.after(_current_stream(idx))
        for x in tensors:
            if x.is_cuda:
                x.record_stream(side.stream)  # not reused by the caller's stream while hpccl's still reads it
        if temps:
            prev = on_stream(side.ids)
            try:
                fn(side.h)
            finally:
                on_stream(prev)
        else:
            fn(side.h)
        return Work(result, side, idx)

    def _pairs(self, opts: Any, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], result: Any,
               run: Callable[[torch.Tensor, torch.Tensor, Optional[int]], None], temps: bool = False,
               name: Optional[str] = None) -> Any:
        """An op that pairs each output with its input (its single and coalesced forms), through the core;
        the profiler range is named after the torch method that called."""
        return self._collective(opts, [*outputs, *inputs], lambda h: [run(o, i, h) for o, i in zip(outputs, inputs)],
                                result, temps, name or sys._getframe(1).f_code.co_name)

    def _bind(self, idx: int) -> Side:
        """The group's first call on GPU ``idx``: the communicator's GPU is its tensors' (torch's LOCAL_RANK
        device), and split_group finds the device bound. Returns the group's Side there."""
        if self.comm.cuda_device is None:
            self.comm.cuda_device = idx
        if self.bound_device_id is None:  # split_group needs it; torch sets it only for Backend objects
            self.bound_device_id = torch.device("cuda", idx)
        self._bound.add(idx)
        return self._sides.get(idx) or Side(idx)

    def _wait_streams(self) -> None:
        """The host waits for this group's CUDA work (barrier's meaning, as with NCCL)."""
        for side in self._sides.values():
            side.stream.synchronize()
        for idx in self._bound:
            torch.cuda.current_stream(idx).synchronize()

    # ----- identity, life cycle, splitting ---------------------------------------------------------
    # torch's own rank()/size() release the GIL and, on a group written in Python, take it back in the
    # C++ trampoline: microseconds per call where other threads run, and FSDP2 asks dozens of times a step
    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

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
        pg = type(self)(sub, ranks.index(me), len(ranks))
        if group_name:
            pg._set_group_name(group_name)
        if group_desc:
            pg._set_group_desc(group_desc)
        return pg

    # ----- reductions -----------------------------------------------------------------------------
    def _allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        tensors, opts = as_list(tensors), options(opts, dist.AllreduceOptions)
        op, factor = reduce_op(opts)
        comm = self.comm
        if any(t.is_sparse for t in tensors):
            for t in tensors:
                self._sparse_ok(t, op, factor)
            return self._collective(opts, [], lambda h: [self._sparse_allreduce(t) for t in tensors], tensors,
                                    name="allreduce")

        def go(h: Optional[int]) -> None:
            for t in tensors:
                x = flat(t, "tensor")
                if factor is not None:
                    x.mul_(factor)  # in place: the tensor is the output too
                comm.all_reduce(x, op=op, stream=h)
        return self._collective(opts, tensors, go, tensors, temps=factor is not None, name="allreduce")

    @staticmethod
    def _sparse_ok(t: torch.Tensor, op: Any, factor: Optional[float]) -> None:
        """Sparse all_reduce as gloo has it: COO tensors on the CPU, summed."""
        if not t.is_sparse or t.layout != torch.sparse_coo:
            raise HpcclInvalidArgument("tensors", "sparse and dense tensors cannot be all-reduced in one call")
        if t.is_cuda:
            raise HpcclUnsupported("all_reduce of sparse CUDA tensors: hpccl reduces sparse tensors on the CPU "
                                   "(as gloo does); move it with t.cpu(), or pass t.to_dense()")
        if op is not SUM or factor is not None:
            raise HpcclInvalidArgument("op", "sparse tensors are all-reduced with SUM only (as gloo)")

    def _sparse_allreduce(self, t: torch.Tensor) -> None:
        """Every rank's indices and values, gathered (padded to the largest count), then summed by
        coalescing; the result replaces ``t`` in place, coalesced, as gloo's does."""
        c, n = t.coalesce(), self.size()
        idx, val = c.indices(), c.values()
        nnz = idx.shape[1]
        counts = torch.empty(n, dtype=torch.int64)
        self.comm.all_gather(torch.tensor([nnz], dtype=torch.int64), counts)
        most = max(1, int(counts.max()))
        pidx = torch.zeros((idx.shape[0], most), dtype=torch.int64)
        pidx[:, :nnz] = idx
        pval = torch.zeros((most, *val.shape[1:]), dtype=val.dtype)
        pval[:nnz] = val
        gidx = torch.empty((n, *pidx.shape), dtype=torch.int64)
        gval = torch.empty((n, *pval.shape), dtype=val.dtype)
        self.comm.all_gather(pidx, gidx)
        self.comm.all_gather(pval, gval)
        k = counts.tolist()
        out = torch.sparse_coo_tensor(torch.cat([gidx[r][:, :k[r]] for r in range(n)], 1),
                                      torch.cat([gval[r][:k[r]] for r in range(n)], 0), t.shape)
        t.copy_(out.coalesce())

    allreduce = _allreduce

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        return self._allreduce(tensors, opts)

    def reduce(self, tensors: List[torch.Tensor], opts: Any = None, op: Any = None) -> Any:
        tensors, opts = as_list(tensors), options(opts, dist.ReduceOptions, op)
        (op, factor), root = reduce_op(opts), opts.rootRank

        def go(h: Optional[int]) -> None:
            for t in tensors:
                x = flat(t, "tensor")
                self.comm.reduce(scaled(x, factor), x if self.rank() == root else None, root=root, op=op, stream=h)
        return self._collective(opts, tensors, go, tensors, temps=factor is not None)

    def reduce_scatter(self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]],
                       opts: Any = None) -> Any:
        if isinstance(output_tensors, torch.Tensor):
            output_tensors, input_tensors = [output_tensors], [input_tensors]
        opts = options(opts, dist.ReduceScatterOptions)
        op, factor = reduce_op(opts)
        for ins in input_tensors:
            if len(ins) != self.size():
                raise HpcclInvalidArgument("input_list", f"has {len(ins)} tensors, needs {self.size()}")

        def go(h: Optional[int]) -> None:
            for out, ins in zip(output_tensors, input_tensors):
                x = torch.cat([flat(t, "input_list") for t in ins])
                self.comm.reduce_scatter(scaled(x, factor), flat(out, "output"), op=op, stream=h)
        return self._collective(opts, [*output_tensors, *(t for ins in input_tensors for t in ins)], go,
                                output_tensors, temps=True)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        return self._reduce_scatter_pairs([output], [input], opts, output, "reduce_scatter_single")

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
                                        opts: Any = None) -> Any:
        return self._reduce_scatter_pairs(outputs, inputs, opts, list(outputs), "reduce_scatter_single_coalesced")

    def _reduce_scatter_pairs(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], opts: Any,
                              result: Any, name: str) -> Any:
        opts = opts or dist.ReduceScatterOptions()
        op, factor = reduce_op(opts)
        return self._pairs(opts, outputs, inputs, result, lambda o, i, h: self.comm.reduce_scatter(
            scaled(flat(i, "input"), factor), flat(o, "output"), op=op, stream=h), factor is not None, name)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # ----- data movement --------------------------------------------------------------------------
    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        tensors, opts = as_list(tensors), options(opts, dist.BroadcastOptions)
        root = opts.rootRank

        def go(h: Optional[int]) -> None:
            for t in tensors:
                self.comm.broadcast(flat(t, "tensor"), root=root, stream=h)
        return self._collective(opts, tensors, go, tensors)

    def _allgather_list(self, outs: List[torch.Tensor], inp: torch.Tensor, h: Optional[int]) -> None:
        """Equal sizes: hpccl's all_gather; uneven (outs[r] sized as rank r's tensor): its all_gather_v."""
        src = flat(inp, "tensor")
        counts = [o.numel() for o in outs]
        if counts[self._rank] != src.numel():
            raise HpcclInvalidArgument("tensor_list", f"entry {self._rank} has {counts[self._rank]} elements but "
                                                      f"this rank's tensor has {src.numel()}")
        both = torch.empty(sum(counts), dtype=src.dtype, device=src.device)
        if all(c == src.numel() for c in counts):
            self.comm.all_gather(src, both, stream=h)
        else:
            self.comm.all_gather_v(src, both, counts, stream=h)
        at = 0
        for o, c in zip(outs, counts):
            o.copy_(both[at:at + c].view_as(o))
            at += c

    def allgather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor],
                  opts: Any = None) -> Any:
        if isinstance(input_tensors, torch.Tensor):
            output_tensors, input_tensors = [output_tensors], [input_tensors]
        for outs in output_tensors:
            if len(outs) != self.size():
                raise HpcclInvalidArgument("tensor_list", f"has {len(outs)} tensors, needs {self.size()}")

        def go(h: Optional[int]) -> None:
            for outs, inp in zip(output_tensors, input_tensors):
                self._allgather_list(outs, inp, h)
        return self._collective(opts, [*input_tensors, *(t for outs in output_tensors for t in outs)], go,
                                output_tensors, temps=True)

    def allgather_coalesced(self, output_lists: List[List[torch.Tensor]], input_list: List[torch.Tensor],
                            opts: Any = None) -> Any:
        """output_lists[r][i] = rank r's input_list[i]."""
        if len(output_lists) != self.size():
            raise HpcclInvalidArgument("output_tensor_lists", f"has {len(output_lists)} lists, needs {self.size()}")

        def go(h: Optional[int]) -> None:
            for i, inp in enumerate(input_list):
                self._allgather_list([output_lists[r][i] for r in range(self.size())], inp, h)
        return self._collective(opts, [*input_list, *(t for outs in output_lists for t in outs)], go,
                                output_lists, temps=True)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        return self._pairs(opts, [output], [input], output, self._all_gather_pair)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
                                    opts: Any = None) -> Any:
        return self._pairs(opts, outputs, inputs, list(outputs), self._all_gather_pair)

    def _all_gather_pair(self, o: torch.Tensor, i: torch.Tensor, h: Optional[int]) -> None:
        self.comm.all_gather(flat(i, "input_tensor"), flat(o, "output_tensor"), stream=h)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def _exchange(self, sends: List[Any], recvs: List[Any], h: Optional[int]) -> None:
        """Sends and receives together (hpccl's group): no ordering deadlock; empty ones are skipped."""
        with self.comm.group():
            for peer, t in sends:
                if t.numel():
                    self.comm.send(t, peer, stream=h)
            for peer, t in recvs:
                if t.numel():
                    self.comm.recv(t, peer, stream=h)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: List[int],
                          input_split_sizes: List[int], opts: Any = None) -> Any:
        """Equal splits: hpccl's all_to_all; uneven (rows of dim 0 per rank): its all_to_all_v."""
        n = self.size()
        src, dst = flat(input, "input"), flat(output, "output")
        even = not output_split_sizes and not input_split_sizes
        if not even:
            ins = splits(input_split_sizes, input, n, "input_split_sizes")
            outs = splits(output_split_sizes, output, n, "output_split_sizes")
            row_in = input[0].numel() if input.dim() and input.shape[0] else 0
            row_out = output[0].numel() if output.dim() and output.shape[0] else 0

        def go(h: Optional[int]) -> None:
            if even:
                self.comm.all_to_all(src, dst, stream=h)
            else:
                self.comm.all_to_all_v(src, dst, [c * row_in for c in ins], [c * row_out for c in outs],
                                       stream=h)
        return self._collective(opts, (output, input), go, output)

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor],
                 opts: Any = None) -> Any:
        sends = [(p, flat(t, "input_tensor_list")) for p, t in enumerate(input_tensors)]
        recvs = [(p, flat(t, "output_tensor_list")) for p, t in enumerate(output_tensors)]
        return self._collective(opts, [*output_tensors, *input_tensors], lambda h: self._exchange(sends, recvs, h),
                                output_tensors)

    def gather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor],
               opts: Any = None) -> Any:
        """hpccl's gather into one buffer on the root, then copied into gather_list."""
        if isinstance(input_tensors, torch.Tensor):
            output_tensors, input_tensors = [output_tensors], [input_tensors]
        opts = options(opts, dist.GatherOptions)
        root, src = opts.rootRank, flat(input_tensors[0], "tensor")
        outs = output_tensors[0] if self.rank() == root else []
        if self.rank() == root:
            _same_sizes(outs, src.numel(), self.size(), "gather_list")

        def go(h: Optional[int]) -> None:
            both = torch.empty(self.size() * src.numel(), dtype=src.dtype, device=src.device) if outs else None
            self.comm.gather(src, both, root=root, stream=h)
            for r, o in enumerate(outs):
                o.copy_(both[r * src.numel():(r + 1) * src.numel()].view_as(o))
        return self._collective(opts, [*input_tensors, *(t for ts in output_tensors for t in ts)], go,
                                output_tensors, temps=True)

    def scatter(self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]],
                opts: Any = None) -> Any:
        """scatter_list packed into one buffer on the root, then hpccl's scatter."""
        if isinstance(output_tensors, torch.Tensor):
            output_tensors, input_tensors = [output_tensors], [input_tensors]
        opts = options(opts, dist.ScatterOptions)
        root, dst = opts.rootRank, flat(output_tensors[0], "tensor")
        ins = input_tensors[0] if self.rank() == root else []
        if self.rank() == root:
            _same_sizes(ins, dst.numel(), self.size(), "scatter_list")

        def go(h: Optional[int]) -> None:
            both = torch.cat([flat(t, "scatter_list") for t in ins]) if ins else None
            self.comm.scatter(both, dst, root=root, stream=h)
        return self._collective(opts, [*output_tensors, *(t for ts in input_tensors for t in ts)], go,
                                output_tensors, temps=True)

    def barrier(self, opts: Any = None) -> Any:
        """Every rank arrived, and this rank's CUDA collectives of this group are done (as NCCL's barrier
        leaves the host after the device work)."""
        self._wait_streams()
        return self._collective(opts, (), lambda h: self.comm.barrier(), None)

    # ----- point to point, and batch_isend_irecv's coalescing -------------------------------------
    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0) -> Any:
        if self._coalescing is not None:
            self._coalescing.append(("send", dst, tensors))
            return Work(tensors)
        return self._collective(None, tensors, lambda h: [self.comm.send(flat(t, "tensor"), dst, stream=h)
                                                          for t in tensors], tensors)

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0) -> Any:
        if self._coalescing is not None:
            self._coalescing.append(("recv", src, tensors))
            return Work(tensors)
        return self._collective(None, tensors, lambda h: [self.comm.recv(flat(t, "tensor"), src, stream=h)
                                                          for t in tensors], tensors)

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> Any:
        """dist.recv/irecv without src (CPU tensors, as gloo): the Work names the sender (_source_rank)."""
        t = flat(tensors[0], "tensor")
        if t.is_cuda:
            raise HpcclUnsupported("recv from any source takes CPU tensors (as gloo); on CUDA tensors name the "
                                   "source rank (NCCL has no receive from any source either)")
        if _autograd_profiler._is_profiler_enabled:
            with torch.profiler.record_function("hpccl:recvAnySource"):
                return Work(tensors, source=self.comm.recv_any(t))
        return Work(tensors, source=self.comm.recv_any(t))

    def _start_coalescing(self, device: Any = None) -> None:
        self._coalescing = []

    def _end_coalescing(self, device: Any = None) -> Any:
        ops, self._coalescing = self._coalescing or [], None
        sends = [(peer, flat(t, "tensor")) for kind, peer, ts in ops if kind == "send" for t in ts]
        recvs = [(peer, flat(t, "tensor")) for kind, peer, ts in ops if kind == "recv" for t in ts]
        return self._collective(None, [t for _, _, ts in ops for t in ts],
                                lambda h: self._exchange(sends, recvs, h), None)


def _same_sizes(ts: Sequence[torch.Tensor], count: int, n: int, name: str) -> None:
    """``ts`` holds one tensor per rank, each of ``count`` elements."""
    if len(ts) != n:
        raise HpcclInvalidArgument(name, f"has {len(ts)} tensors, needs {n}")
    bad = [r for r, t in enumerate(ts) if t.numel() != count]
    if bad:
        raise HpcclInvalidArgument(name, f"entry {bad[0]} has {ts[bad[0]].numel()} elements, this rank's tensor "
                                         f"{count}")
