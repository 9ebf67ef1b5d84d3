"""The CUDA path of a Communicator: collectives on device buffers as stream-ordered kernels over peer
memory (hpccl/transport/cuda_ipc.py), with no host round trip, allocation or host sync inside an op,
so a CUDA graph can capture and replay them.

A Communicator creates one CudaComm lazily, at the first call with a device buffer (on every rank
together), and delegates: all_reduce, reduce, broadcast, all_gather, reduce_scatter, all_to_all,
send, recv, group_p2p, barrier, close. Each returns the output object, like the host path.

Launch cost matters as much as the kernels at small sizes: a call validates its buffers from a few
attribute reads, looks its plan up in a dict, writes the changed fields of one pre-packed ctypes
argument struct and calls cuLaunchKernel through ctypes (hpccl/kernels.py).
"""
from __future__ import annotations

import ctypes
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import config, log
from .errors import (HpcclInvalidArgument, HpcclInvalidUsage, HpcclSystemError, HpcclTimeoutError,
                     HpcclUnsupported)
from .kernels import (DTYPE_IDS, ERR_TIMEOUT, MAX_BLOCKS, MAX_P2P_OPS, MAX_RANKS, OP_IDS, CommArgs, Driver,
                      Kernels, Launch, P2PArgs)
from .memory.cuda import DevBuf, device_view, empty_like, overlaps, shape_of, stream_handle
from .ops import ReduceOp, check_op_dtype
from .transport.cuda_ipc import PeerMemory


P2P_BLOCKS = 8  # channels (thread blocks) per send or receive
FAST_ENTRIES = 512  # cached launches (per communicator) for repeated calls on the same buffers


def _dtid(dtype: Any) -> int:
    i = _DTID.get(dtype)
    if i is None:
        from .ops import dtype_name
        i = _DTID[dtype] = DTYPE_IDS[dtype_name(dtype)]
    return i


_DTID: Dict[Any, int] = {}




class DeviceTuner:
    """Device cost model: t = launch + steps * sync + bytes over link (+ reduction traffic over HBM).
    Terms measured on 2x H200 NV18 (docs/GPU.md); HPCCL_ALGO ('all_reduce:oneshot|twoshot') overrides."""

    LAUNCH = 4e-6
    SYNC = 2.5e-6
    ONESHOT_BW = 324e9   # bytes/s pushed to one peer, reduction included (2x H200, 64 blocks, 1 GiB)
    TWOSHOT_BW = 342e9

    def __init__(self, nranks: int) -> None:
        self.n = nranks
        from .tuning import _parse_override
        self.override = _parse_override(config.get("HPCCL_ALGO"))
        self._cache: Dict[Tuple[str, int], str] = {}

    def predict(self, coll: str, algo: str, nbytes: int) -> float:
        n, N = self.n, float(nbytes)
        if algo == "oneshot":
            return self.LAUNCH + self.SYNC + (n - 1) * N / self.ONESHOT_BW
        if algo == "twoshot":
            return self.LAUNCH + 2 * self.SYNC + 2 * (n - 1) / n * N / self.TWOSHOT_BW
        raise KeyError(algo)

    def choose(self, coll: str, nbytes: int, names: Sequence[str]) -> str:
        key = (coll, nbytes.bit_length())
        hit = self._cache.get(key)
        if hit is None:
            forced = self.override.get(coll) or self.override.get("*")
            if forced in names:
                hit = forced
            else:
                probe = 3 << max(0, nbytes.bit_length() - 2) if nbytes > 1 else nbytes
                hit = min(names, key=lambda a: self.predict(coll, a, probe))
            self._cache[key] = hit
            log.trace("TUNING", "cuda %s %d B on %d ranks -> %s", coll, nbytes, self.n, hit)
        return hit


class CudaComm:
    """Device-side collectives for one Communicator (intra-node ranks; one GPU per rank, or several ranks
    sharing a GPU)."""

    def __init__(self, comm: Any, device: Optional[int] = None) -> None:
        try:
            import cupy
        except ImportError as exc:
            raise HpcclUnsupported(f"GPU buffers need CuPy (pip install hpccl[cuda]): {exc}") from None
        if comm.num_nodes > 1:
            raise HpcclUnsupported("the CUDA path covers ranks of one node; this communicator spans "
                                   f"{comm.num_nodes} nodes")
        n = comm.size
        if n > MAX_RANKS:
            raise HpcclUnsupported(f"the CUDA path supports at most {MAX_RANKS} ranks per communicator, not {n}")
        rt = cupy.cuda.runtime
        ndev = rt.getDeviceCount()
        if ndev < 1:
            raise HpcclUnsupported("no CUDA device is visible to this process")
        if device is None:
            device = config.get("HPCCL_CUDA_DEVICE")
            if device < 0:
                device = comm.local_rank % ndev
        self.comm = comm
        self.rank, self.size, self.device = comm.rank, n, device
        self._closed = False
        self._failed = False
        self.peers = PeerMemory(comm._boot, comm.rank, n, device, config.get("HPCCL_CUDA_BUFFER_SIZE"),
                                config.get("HPCCL_CUDA_TRANSPORT"))
        lay = self.peers.layout
        with cupy.cuda.Device(device):
            self._err_ptr = rt.hostAlloc(64, rt.hostAllocMapped | rt.hostAllocPortable)
        ctypes.memset(self._err_ptr, 0, 64)
        self._err = ctypes.c_uint32.from_address(self._err_ptr)
        a = self.args = CommArgs()
        a.slot, a.p2p_off, a.p2p_slot = lay.slot, lay.p2p_off, lay.p2p_slot
        a.timeout_ns = int(config.get("HPCCL_TIMEOUT") * 1e9)
        for r in range(n):
            a.stage[r] = self.peers.stage[r]
            a.flags[r] = self.peers.flags[r]
        a.err = self._err_ptr
        a.rank, a.nranks, a.root = self.rank, n, -1
        self.rstride = ctypes.c_uint64(0)
        self.p2p_args = P2PArgs()
        ctypes.memmove(ctypes.addressof(self.p2p_args.c), ctypes.addressof(a), ctypes.sizeof(CommArgs))
        self.driver = Driver.get()
        self.kernels = Kernels(device)
        self.threads = max(64, min(512, config.get("HPCCL_CUDA_THREADS")))
        self.maxb = max(1, min(MAX_BLOCKS, config.get("HPCCL_CUDA_BLOCKS")))
        self.block_bytes = max(256, config.get("HPCCL_CUDA_BLOCK_BYTES"))
        self.tuner = DeviceTuner(n)
        self._launch_cache: Dict[tuple, Launch] = {}
        self._plans: Dict[tuple, tuple] = {}
        self._last_stream: Optional[int] = None
        self._seq = 0
        # fast path: launches snapshotted per (collective, buffers, dtype, op, root, stream)
        self._fast: Dict[tuple, Launch] = {}
        self._live = True
        self._cp_nd = cupy.ndarray
        self._cur_stream = cupy.cuda.get_current_stream
        probe = cupy.empty(1, dtype=cupy.uint8)
        self._cp_contig = hasattr(probe, "_c_contiguous")
        del probe
        self.transport = self.peers.mode
        # compile the dtype-free kernels now, while every rank is here anyway
        self.kernels.func("hp_copy_push")
        log.info("INIT", "CUDA path rank %d/%d on GPU %d over %s", self.rank, n, device, self.transport)

    # ----- plumbing -----------------------------------------------------------------------------------
    def _launch(self, name: str, dt: Optional[int], grid: int, kind: str) -> Launch:
        key = (name, grid, kind)
        ln = self._launch_cache.get(key)
        if ln is None:
            if kind == "copy":
                args = [self.args, self.rstride]
            elif kind == "p2p":
                args = [self.p2p_args]
            else:
                args = [self.args]
            ln = Launch(self.driver, self.kernels.func(name, dt), grid, self.threads, args)
            self._launch_cache[key] = ln
        return ln

    def _plan(self, pkey: tuple, kernel: str, dt: Optional[int], nbytes: int, kind: str) -> tuple:
        """(launch, chunk) of a single-part kernel for nbytes, built once per key and kept."""
        plan = self._plans.get(pkey)
        if plan is None:
            blocks, chunk = self._geometry(nbytes, 1)
            plan = self._plans[pkey] = (self._launch(kernel, dt, blocks, kind), chunk)
        return plan

    def _geometry(self, nbytes: int, parts: int) -> Tuple[int, int]:
        """(blocks, chunk bytes per block step) for nbytes split into ``parts`` segments per unit."""
        per = max(1, -(-nbytes // parts))
        blocks = max(1, min(self.maxb, -(-per // self.block_bytes)))
        chunk = -(-per // blocks)
        chunk = max(16, min(self.args.slot, (chunk + 15) // 16 * 16))
        blocks = max(1, min(blocks, -(-per // chunk)))
        return blocks, chunk

    def _check(self, what: str) -> None:
        if self._closed:
            raise HpcclInvalidUsage(f"{what} called after the communicator was destroyed")
        if self._failed:
            raise HpcclInvalidUsage(f"{what} called on an aborted communicator (an earlier GPU op failed)")
        if self._err.value:
            self._fail(what)

    def _fail(self, what: str) -> None:
        code = self._err.value
        self._failed = True
        self._live = False
        self._fast.clear()
        try:
            self.comm.abort()
        except Exception:  # noqa: BLE001
            pass
        if code == ERR_TIMEOUT:
            raise HpcclTimeoutError(what, self._seq, [], config.get("HPCCL_TIMEOUT"),
                                    "a GPU kernel's wait for a peer's flag timed out; a rank did not make "
                                    "the same collective call or its GPU stalled")
        raise HpcclSystemError(f"GPU collective failed with device error code {code}")

    def _order(self, stream: int) -> None:
        """Ops of one communicator share its staging buffer: keep them ordered when the stream changes."""
        last = self._last_stream
        self._last_stream = stream
        if last is None or last == stream:
            return
        import cupy
        rt = cupy.cuda.runtime
        try:
            if rt.streamIsCapturing(stream) or rt.streamIsCapturing(last):
                return  # inside a capture the user's own stream dependencies order the ops
        except Exception:  # noqa: BLE001
            return
        ev = cupy.cuda.Event(block=False, disable_timing=True)
        rt.eventRecord(ev.ptr, last)
        rt.streamWaitEvent(stream, ev.ptr, 0)

    def _go(self, ln: Launch, stream: int, what: str) -> None:
        if stream != self._last_stream:
            self._order(stream)
        rc = ln(stream)
        if rc:
            if rc in (201, 400, 709):  # no/invalid context current on this thread: make ours current
                import cupy
                with cupy.cuda.Device(self.device):
                    rc = ln(stream)
            if rc:
                raise HpcclSystemError(f"{what}: cuLaunchKernel failed: {self.driver.error_name(rc)}")
        self._seq += 1

    def _buf(self, obj: Any, name: str) -> DevBuf:
        b = device_view(obj, name)
        if b.device != self.device:
            raise HpcclInvalidArgument(name, f"buffer is on GPU {b.device}, but this rank's communicator "
                                             f"uses GPU {self.device} (set the device before the first "
                                             "GPU call, or HPCCL_CUDA_DEVICE)")
        return b

    def _same_size_out(self, recvbuf: Any, s: DevBuf, input_name: str) -> DevBuf:
        """recvbuf validated as an output of s's size that is s itself or does not overlap it."""
        r = self._out(recvbuf, s, s.count, "recvbuf")
        if r.ptr != s.ptr and overlaps(r, s):
            raise HpcclInvalidArgument("recvbuf", f"partially overlaps {input_name}")
        return r

    def _out(self, obj: Any, like: DevBuf, count: int, name: str) -> DevBuf:
        b = self._buf(obj, name)
        if b.dtype != like.dtype:
            raise HpcclInvalidArgument(name, f"dtype {b.dtname} differs from sendbuf's {like.dtname}")
        if b.count != count:
            raise HpcclInvalidArgument(name, f"has {b.count} elements, needs {count}")
        return b

    def _set(self, send: int, recv: int, nbytes: int, stride: int, chunk: int, root: int,
             extra_align: int = 0) -> None:
        a = self.args
        a.send, a.recv, a.nbytes, a.stride, a.chunk, a.root = send, recv, nbytes, stride, chunk, root
        a.aligned = 1 if ((send | recv | stride | extra_align) & 15) == 0 else 0

    def retune(self, algo: Optional[str] = None, blocks: Optional[int] = None) -> None:
        """Force the all_reduce algorithm ('oneshot'/'twoshot', None: the cost model) and/or the most
        blocks per kernel, dropping cached plans and launches (tests and benchmark sweeps)."""
        self.tuner.override = {"all_reduce": algo} if algo else {}
        self.tuner._cache.clear()
        if blocks is not None:
            self.maxb = max(1, min(MAX_BLOCKS, blocks))
        self._plans.clear()
        self._fast.clear()

    # ----- fast path ------------------------------------------------------------------------------------
    def _bkey(self, obj: Any) -> Optional[tuple]:
        """(ptr, count, dtype, contiguous) read straight off a CuPy array or torch tensor; None otherwise."""
        if type(obj) is self._cp_nd:
            return (obj.data.ptr, obj.size, obj.dtype,
                    obj._c_contiguous if self._cp_contig else obj.flags.c_contiguous)
        if type(obj).__module__.startswith("torch") and getattr(obj, "is_cuda", False):
            return (obj.data_ptr(), obj.numel(), obj.dtype, obj.is_contiguous())
        return None

    def _fkey(self, coll: str, sendbuf: Any, recvbuf: Any, op: Any, root: int, stream: Any) -> Optional[tuple]:
        ks = self._bkey(sendbuf)
        if ks is None:
            return None
        kr = None
        if recvbuf is not None:
            kr = self._bkey(recvbuf)
            if kr is None:
                return None
        if stream is None:
            if type(sendbuf) is self._cp_nd:
                st = self._cur_stream().ptr
            else:
                st = stream_handle(None, device_view(sendbuf, "sendbuf"))
        elif type(stream) is int:
            st = stream
        else:
            st = getattr(stream, "ptr", None)
            if st is None:
                st = getattr(stream, "cuda_stream", None)
                if st is None:
                    return None
        return (coll, ks, kr, op, root, st)

    def _fire(self, key: tuple) -> bool:
        """Launch the snapshot cached for key; False when there is none (take the validating path)."""
        ln = self._fast.get(key)
        if ln is None or not self._live or self._err.value:
            return False
        st = key[-1]
        if st != self._last_stream:
            self._order(st)
        rc = ln(st)
        if rc:
            return False  # the slow path retries and reports
        self._seq += 1
        return True

    def _remember(self, key: Optional[tuple], ln: Launch, kind: str) -> None:
        """Snapshot the argument struct(s) of the launch just made, for _fire on the same key."""
        if key is None:
            return
        if len(self._fast) >= FAST_ENTRIES:
            self._fast.clear()
        a = CommArgs()
        ctypes.memmove(ctypes.addressof(a), ctypes.addressof(self.args), ctypes.sizeof(CommArgs))
        args: List[Any] = [a]
        if kind == "copy":
            args.append(ctypes.c_uint64(self.rstride.value))
        self._fast[key] = Launch(self.driver, ln.func.value, ln.grid, ln.block, args)

    # ----- collectives ----------------------------------------------------------------------------------
    def all_reduce(self, sendbuf: Any, recvbuf: Any = None, op: ReduceOp = ReduceOp.SUM, stream: Any = None) -> Any:
        key = self._fkey("ar", sendbuf, recvbuf, op, -1, stream)
        if key is not None and self._fire(key):
            return sendbuf if recvbuf is None else recvbuf
        self._check("all_reduce")
        s = self._buf(sendbuf, "sendbuf")
        check_op_dtype(op, s.dtype)
        if recvbuf is None:
            r, result = s, sendbuf
        else:
            r, result = self._same_size_out(recvbuf, s, "sendbuf (use the same buffer for in place)"), recvbuf
        nbytes = s.nbytes
        if nbytes == 0:
            return result
        dt, opid = _dtid(s.dtype), OP_IDS[op.value]
        pkey = ("ar", dt, opid, nbytes)
        plan = self._plans.get(pkey)
        if plan is None:
            algo = self.tuner.choose("all_reduce", nbytes, ("oneshot", "twoshot") if self.size > 1 else ("oneshot",))
            if algo == "twoshot":
                blocks, chunk = self._geometry(nbytes, self.size)
                name = f"hp_allreduce_twoshot<{dt}, {opid}>"
            else:
                blocks, chunk = self._geometry(nbytes, 1)
                name = f"hp_reduce_push<{dt}, {opid}>"
            plan = (self._launch(name, dt, blocks, "plain"), chunk, algo)
            self._plans[pkey] = plan
        self._set(s.ptr, r.ptr, nbytes, 0, plan[1], -1)
        self._go(plan[0], stream_handle(stream, s), "all_reduce")
        self._remember(key, plan[0], "plain")
        return result

    def reduce(self, sendbuf: Any, recvbuf: Any = None, root: int = 0, op: ReduceOp = ReduceOp.SUM,
               stream: Any = None) -> Any:
        key = self._fkey("red", sendbuf, recvbuf, op, root, stream)
        if key is not None and self._fire(key):
            return (sendbuf if recvbuf is None else recvbuf) if self.rank == root else recvbuf
        self._check("reduce")
        s = self._buf(sendbuf, "sendbuf")
        check_op_dtype(op, s.dtype)
        result = recvbuf
        r = s
        if self.rank == root:
            if recvbuf is None:
                result = sendbuf
            else:
                r = self._same_size_out(recvbuf, s, "sendbuf")
        elif recvbuf is not None:
            self._out(recvbuf, s, s.count, "recvbuf")
        nbytes = s.nbytes
        if nbytes == 0:
            return result
        dt, opid = _dtid(s.dtype), OP_IDS[op.value]
        plan = self._plan(("red", dt, opid, nbytes), f"hp_reduce_push<{dt}, {opid}>", dt, nbytes, "plain")
        self._set(s.ptr, r.ptr, nbytes, 0, plan[1], root)
        self._go(plan[0], stream_handle(stream, s), "reduce")
        self._remember(key, plan[0], "plain")
        return result

    def reduce_scatter(self, sendbuf: Any, recvbuf: Any = None, op: ReduceOp = ReduceOp.SUM,
                       stream: Any = None) -> Any:
        key = self._fkey("rs", sendbuf, recvbuf, op, -1, stream) if recvbuf is not None else None
        if key is not None and self._fire(key):
            return recvbuf
        self._check("reduce_scatter")
        s = self._buf(sendbuf, "sendbuf")
        check_op_dtype(op, s.dtype)
        if s.count % self.size:
            raise HpcclInvalidArgument("sendbuf", f"has {s.count} elements, not a multiple of the "
                                                  f"communicator size {self.size}")
        count = s.count // self.size
        if recvbuf is None:
            result = empty_like(s, (count,))
            r = self._buf(result, "recvbuf")
        else:
            r, result = self._out(recvbuf, s, count, "recvbuf"), recvbuf
            if overlaps(r, s) and r.ptr != s.ptr + self.rank * count * s.itemsize:
                raise HpcclInvalidArgument("recvbuf", "overlaps sendbuf other than as its own block "
                                                      "(sendbuf[rank*count:(rank+1)*count])")
        nbytes = count * s.itemsize
        if nbytes == 0:
            return result
        dt, opid = _dtid(s.dtype), OP_IDS[op.value]
        plan = self._plan(("rs", dt, opid, nbytes), f"hp_reduce_push<{dt}, {opid}>", dt, nbytes, "plain")
        self._set(s.ptr, r.ptr, nbytes, nbytes, plan[1], -1)
        self._go(plan[0], stream_handle(stream, s), "reduce_scatter")
        self._remember(key, plan[0], "plain")
        return result

    def _copy_coll(self, what: str, s: DevBuf, r: DevBuf, nbytes: int, stride: int, rstride: int, root: int,
                   stream: Any, key: Optional[tuple] = None) -> None:
        plan = self._plan(("copy", nbytes), "hp_copy_push", None, nbytes, "copy")
        self._set(s.ptr, r.ptr, nbytes, stride, plan[1], root, rstride)
        self.rstride.value = rstride
        self._go(plan[0], stream_handle(stream, s), what)
        self._remember(key, plan[0], "copy")

    def all_gather(self, sendbuf: Any, recvbuf: Any = None, stream: Any = None) -> Any:
        key = self._fkey("ag", sendbuf, recvbuf, None, -1, stream) if recvbuf is not None else None
        if key is not None and self._fire(key):
            return recvbuf
        self._check("all_gather")
        s = self._buf(sendbuf, "sendbuf")
        if recvbuf is None:
            result = empty_like(s, (self.size,) + shape_of(sendbuf))
            r = self._buf(result, "recvbuf")
        else:
            r, result = self._out(recvbuf, s, s.count * self.size, "recvbuf"), recvbuf
            if overlaps(r, s) and s.ptr != r.ptr + self.rank * s.nbytes:
                raise HpcclInvalidArgument("sendbuf", "overlaps recvbuf other than as its own block "
                                                      "(recvbuf[rank*count:(rank+1)*count])")
        if s.nbytes == 0:
            return result
        self._copy_coll("all_gather", s, r, s.nbytes, 0, s.nbytes, -1, stream, key)
        return result

    def all_to_all(self, sendbuf: Any, recvbuf: Any = None, stream: Any = None) -> Any:
        key = self._fkey("a2a", sendbuf, recvbuf, None, -1, stream) if recvbuf is not None else None
        if key is not None and self._fire(key):
            return recvbuf
        self._check("all_to_all")
        s = self._buf(sendbuf, "sendbuf")
        if s.count % self.size:
            raise HpcclInvalidArgument("sendbuf", f"has {s.count} elements, not a multiple of the "
                                                  f"communicator size {self.size}")
        if recvbuf is None:
            result = empty_like(s, shape_of(sendbuf))
            r = self._buf(result, "recvbuf")
        else:
            r, result = self._same_size_out(recvbuf, s, "sendbuf"), recvbuf
        seg = s.nbytes // self.size
        if seg == 0:
            return result
        self._copy_coll("all_to_all", s, r, seg, seg, seg, -1, stream, key)
        return result

    def broadcast(self, buf: Any, root: int = 0, recvbuf: Any = None, stream: Any = None) -> Any:
        key = self._fkey("bc", buf, recvbuf, None, root, stream)
        if key is not None and self._fire(key):
            return buf if recvbuf is None else recvbuf
        self._check("broadcast")
        s = self._buf(buf, "buf")
        if recvbuf is None:
            r, result = s, buf
        else:
            r, result = self._same_size_out(recvbuf, s, "buf"), recvbuf
        if s.nbytes == 0:
            return result
        self._copy_coll("broadcast", s, r, s.nbytes, 0, 0, root, stream, key)
        return result

    def barrier(self, stream: Any = None) -> None:
        """Stream-ordered barrier: work after it on ``stream`` starts once every rank's stream got here."""
        self._check("barrier")
        self._set(0, 0, 0, 0, 16, -1)
        self._go(self._launch("hp_barrier", None, 1, "plain"), stream_handle(stream, None), "barrier")

    # ----- point to point --------------------------------------------------------------------------------
    def send(self, buf: Any, peer: int, stream: Any = None) -> None:
        self.group_p2p([(peer, buf)], [], stream)

    def recv(self, buf: Any, peer: int, stream: Any = None) -> Any:
        self.group_p2p([], [(peer, buf)], stream)
        return buf

    def group_p2p(self, sends: Sequence[Tuple[int, Any]], recvs: Sequence[Tuple[int, Any]],
                  stream: Any = None) -> None:
        """Run sends and receives together in one kernel (like ncclGroupStart/End around them): the k-th
        send to a peer matches that peer's k-th receive from this rank."""
        self._check("group(send/recv)")
        ops: List[Tuple[int, DevBuf, int]] = []
        first: Optional[DevBuf] = None
        for kind, items in ((1, sends), (0, recvs)):
            for peer, obj in items:
                if not isinstance(peer, int) or isinstance(peer, bool) or not 0 <= peer < self.size:
                    raise HpcclInvalidArgument("peer", f"{peer!r} is not a rank of this communicator")
                b = self._buf(obj, "buf")
                first = first or b
                ops.append((peer, b, kind))
        if not ops:
            return
        st = stream_handle(stream, first)
        # rounds: the k-th op of each (peer, direction) pair; at most MAX_P2P_OPS per kernel
        seen: Dict[Tuple[int, int], int] = {}
        rounds: List[List[Tuple[int, DevBuf, int]]] = []
        for op in ops:
            k = seen.get((op[0], op[2]), 0)
            seen[(op[0], op[2])] = k + 1
            while len(rounds) <= k:
                rounds.append([])
            rounds[k].append(op)
        for rnd in rounds:
            for i in range(0, len(rnd), MAX_P2P_OPS):
                self._p2p_kernel(rnd[i:i + MAX_P2P_OPS], st)

    def _p2p_kernel(self, ops: Sequence[Tuple[int, DevBuf, int]], stream: int) -> None:
        pa = self.p2p_args
        per_op = P2P_BLOCKS  # fixed, so a sender and its receiver always agree on the channels
        nb_total = 0
        n = 0
        for peer, b, is_send in ops:
            if b.nbytes == 0:
                continue
            o = pa.ops[n]
            nb = max(1, min(per_op, -(-b.nbytes // self.args.p2p_slot)))
            o.buf, o.nbytes, o.peer, o.is_send, o.nblocks, o.first_block = b.ptr, b.nbytes, peer, is_send, nb, nb_total
            nb_total += nb
            n += 1
        if n == 0:
            return
        pa.nops = n
        self._go(self._launch("hp_p2p", None, nb_total, "p2p"), stream, "send/recv")

    # ----- life cycle ----------------------------------------------------------------------------------
    def synchronize(self) -> None:
        """Wait for this rank's GPU work (tests/benchmarks), then raise if a kernel reported a failure."""
        import cupy
        with cupy.cuda.Device(self.device):
            cupy.cuda.runtime.deviceSynchronize()
        if self._err.value:
            self._fail("synchronize")

    def close(self) -> None:
        if self._closed:
            return
        self._live = False
        self._fast.clear()
        import cupy
        try:
            with cupy.cuda.Device(self.device):
                cupy.cuda.runtime.deviceSynchronize()
        except Exception:  # noqa: BLE001
            pass
        try:
            self.comm._boot.barrier()  # nobody unmaps a buffer a peer's kernel may still touch
        except Exception:  # noqa: BLE001
            pass
        self.peers.close()
        try:
            cupy.cuda.runtime.freeHost(self._err_ptr)
        except Exception:  # noqa: BLE001
            pass
        self._closed = True
