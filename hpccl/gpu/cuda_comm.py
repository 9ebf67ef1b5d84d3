"""The GPU kernel algorithms of a single-node communicator: collectives on device buffers as stream-ordered
kernels over peer memory (hpccl/transport/cuda_ipc.py), with no host round trip, allocation or host sync
inside an op, so a CUDA graph can capture and replay them.

The front end (hpccl.core.comm) validates every call and picks the algorithm from the one table
(hpccl.algorithms); the table's GPU entries (oneshot, twoshot, push, p2p) call the methods here with
flat CuPy views and a stream handle. One CudaComm per single-node communicator, built lazily at the
first device call (on every rank together).

Launch cost matters as much as the kernels at small sizes: a call looks its plan up in a dict, writes the
changed fields of one pre-packed ctypes argument struct and calls cuLaunchKernel through ctypes
(hpccl/kernels.py); a repeated call on the same buffers and stream replays a snapshot of its launch
before any Python-side validation (fast(), remember()).
"""
from __future__ import annotations

import ctypes
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import config, log
from . import gpu_sync
from ..errors import HpcclSystemError, HpcclUnsupported
from ..transport.shm import _I_DEVSEQ
from ..kernels import (DTYPE_IDS, MAX_BLOCKS, MAX_P2P_OPS, MAX_RANKS, OP_IDS,
                      CommArgs, Driver, FastState, Kernels, Launch, P2PArgs, RegArgs)
from .cuda_failures import CudaFailures
from .gpu_sync import Bound, Builder, Program, Watchdog, Words
from ..memory.cuda import CallKeys, DeviceMemory
from ..ops import ReduceOp
from ..transport.cuda_ipc import PeerMemory
from ..transport.cuda_register import Registry


P2P_BLOCKS = 8  # most channels (thread blocks) per send or receive
FAST_ENTRIES = 512  # cached launches (per communicator) for repeated calls on the same buffers


NO_STREAM = (1 << 64) - 1  # FastState.last_stream before the first launch
NOTHING = object()  # the launch of a call with nothing to do (one rank, output = input)

def _logical(a: Any) -> Any:
    """The hpccl dtype of a flat CuPy view (bfloat16 travels as uint16)."""
    return DeviceMemory.dtype(a)


def _dtid(dtype: Any) -> int:
    i = _DTID.get(dtype)
    if i is None:
        from ..ops import dtype_name
        i = _DTID[dtype] = DTYPE_IDS[dtype_name(dtype)]
    return i


_DTID: Dict[Any, int] = {}


def block_cap(sms: int, share: int) -> int:
    """Most thread blocks one rank's kernel may launch so that no layout can deadlock. Block b of a rank
    waits for block b of every peer, so every rank's blocks must be able to be resident at once; blocks of
    different hpccl kernels (ranks can be one call apart) may not pack onto one multiprocessor, but any one
    of them fits on an idle one. So the ranks sharing a GPU split its multiprocessors: one block each."""
    return max(1, sms // max(1, share))


def p2p_blocks(cap: int, nranks: int) -> int:
    """Channels per send or receive: a p2p kernel holds at most one send and one receive per peer, and
    both ends of a pair compute the same number (it depends only on values every rank shares)."""
    return max(1, min(P2P_BLOCKS, cap // max(1, 2 * (nranks - 1))))



_LIVE: "weakref.WeakSet[CudaComm]" = weakref.WeakSet()  # engines of this process, for "another is live"


class CudaComm(CudaFailures):
    """Device-side collectives for one Communicator (intra-node ranks; one GPU per rank, or several ranks
    sharing a GPU). Two ways to synchronise, chosen together at set-up (HPCCL_CUDA_SYNC): spinning kernels,
    or the stream-synchronised protocol of hpccl/gpu/gpu_sync.py where the GPU may be shared."""

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
        self.driver = Driver.get()
        shm = comm._table.find("shm")
        self._shm = shm  # peers' launch counts, read when a kernel's wait times out
        self._pub = shm.device_counter() if shm is not None else None  # where this rank publishes its own
        with cupy.cuda.Device(device):
            err_host, self._err_dev, self._err_page, self.abort_word = self._error_word(shm)
        self._err = ctypes.c_uint32.from_address(err_host)
        a = self.args = CommArgs()
        a.slot, a.p2p_off, a.p2p_slot = lay.slot, lay.p2p_off, lay.p2p_slot
        a.timeout_ns = int(config.get("HPCCL_TIMEOUT") * 1e9)
        for r in range(n):
            a.stage[r] = self.peers.stage[r]
            a.flags[r] = self.peers.flags[r]
        a.err = self._err_dev
        a.rank, a.nranks, a.root = self.rank, n, -1
        self.rstride = ctypes.c_uint64(0)
        self.reg_args = RegArgs()
        ctypes.memmove(ctypes.addressof(self.reg_args.c), ctypes.addressof(a), ctypes.sizeof(CommArgs))
        self.registry = Registry(comm._boot, self.rank, n, device, self.driver)
        self.zero_copy_min = config.get("HPCCL_CUDA_ZERO_COPY")
        self.ce_min = config.get("HPCCL_CUDA_CE_SIZE")
        self.p2p_args = P2PArgs()
        ctypes.memmove(ctypes.addressof(self.p2p_args.c), ctypes.addressof(a), ctypes.sizeof(CommArgs))
        self.kernels = Kernels.for_device(device)
        self.threads = max(64, min(512, config.get("HPCCL_CUDA_THREADS")))
        # ranks of a parent communicator on the same GPU (hier's other emulated or real node steps) count too
        self.share = max(self.peers.share, getattr(comm, "gpu_share", 1))
        self.block_cap = block_cap(self.peers.sms, self.share)
        self.maxb = max(1, min(MAX_BLOCKS, config.get("HPCCL_CUDA_BLOCKS"), self.block_cap))
        self.p2p_blocks = p2p_blocks(self.block_cap, n)
        self.block_bytes = max(256, config.get("HPCCL_CUDA_BLOCK_BYTES"))
        # spinning kernels or the stream-synchronised protocol: the same on every rank, the safe one when any
        # rank asks for it (and every rank's sync words are in shared memory it can register)
        other = any(e is not self and not e._closed and e.device == device for e in list(_LIVE))
        want, why = gpu_sync.wanted(self.share, other)
        can = shm is not None and self.abort_word == "shared"
        votes = comm._boot.allgather((want, can, why))
        self.safe = any(v[0] for v in votes) and all(v[1] for v in votes)
        if any(v[0] for v in votes) and not self.safe:
            log.warn("INIT", "the GPU may be shared (%s) but some rank's sync words are not in shared memory: "
                     "spinning kernels, which can deadlock beside other GPU work", why)
        self.sync_why = why if want else next((v[2] for v in votes if v[0]), why)
        self.safe_blocks = max(1, min(MAX_BLOCKS, config.get("HPCCL_CUDA_BLOCKS")))
        self.words: Optional[Words] = None
        self._progs: Dict[tuple, Program] = {}
        if self.safe:
            self.words = Words(shm, n, self.rank, self.driver, self._err_page)
            comm._boot.barrier()  # every rank's words initialised before any peer's stream writes them
            self.builder = Builder(self, self.words)
            self.zero_copy_min = -1  # the zero-copy kernels spin: staged (and safe) instead
        self.watchdog = Watchdog(self, self.words, shm)
        if shm is not None:
            shm.before_close.append(self.watchdog.stop)  # it reads the segments: stopped before they go
        _LIVE.add(self)
        self._launch_cache: Dict[tuple, Launch] = {}
        self._plans: Dict[tuple, tuple] = {}
        self.fs = FastState()  # seq, last stream, tail, generation, live: shared with compiled replays
        self.fs.live, self.fs.last_stream = 1, NO_STREAM
        with cupy.cuda.Device(device):
            self._tail = cupy.cuda.Event(block=False, disable_timing=True)  # after the latest launch
        self._tail_h = ctypes.c_void_p(self._tail.ptr)
        self.last: Optional[Tuple[Launch, Optional[str]]] = None
        self._what = "idle"  # the last collective enqueued (named when a later check finds a failure)
        # fast path: launches snapshotted per (collective, buffers, dtype, op, root, stream)
        self._fast: Dict[tuple, Launch] = {}
        from ..host import hotpath
        # the fast path's driver calls in C when the extension is built (hpccl/csrc/_hotpath.c), else ctypes
        self.compiled_launch = (hotpath._hotpath.gpu_launch if hotpath.available()
                                and config.get("HPCCL_COMPILED_LAUNCH") else None)
        self._entry = self.driver.entry_points()
        # a stream-synchronised program's operations in one C call (hpccl/csrc/_hotpath.c gpu_program)
        self.compiled_program = (getattr(hotpath._hotpath, "gpu_program", None) if self.safe and
                                 self.compiled_launch is not None else None)
        self._batch_addr = Driver.address(self.builder._batch_fn) if self.safe else 0
        self._keys = CallKeys()
        self.transport = self.peers.mode
        # compile the dtype-free kernels now, while every rank is here anyway
        self.kernels.func("hp_copy_push")
        log.info("INIT", "CUDA path rank %d/%d on GPU %d over %s; %d rank(s) per GPU, %d SMs: %s", self.rank, n,
                 device, self.transport, self.share, self.peers.sms,
                 f"stream-synchronised ({self.sync_why}), {self.safe_blocks} blocks per kernel" if self.safe else
                 f"spinning kernels ({self.sync_why}), at most {self.maxb} blocks per kernel, "
                 f"{self.p2p_blocks} per send/recv")

    # ----- plumbing -----------------------------------------------------------------------------------
    def _launch(self, name: str, dt: Optional[int], grid: int, kind: str) -> Launch:
        key = (name, grid, kind)
        ln = self._launch_cache.get(key)
        if ln is None:
            if kind == "copy":
                args = [self.args, self.rstride]
            elif kind == "reg":
                args = [self.reg_args]
            elif kind == "regcopy":
                args = [self.reg_args, self.rstride]
            elif kind == "p2p":
                args = [self.p2p_args]
            else:
                args = [self.args]
            func = self.kernels.func(name, dt)
            if self.driver.occupancy(func, self.threads) < 1:
                raise HpcclUnsupported(f"kernel {name} cannot run with HPCCL_CUDA_THREADS={self.threads} threads "
                                       "per block on this GPU; lower HPCCL_CUDA_THREADS")
            ln = Launch(self.driver, func, grid, self.threads, args)
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

    def _order(self, stream: int) -> None:
        """Ops of one communicator share its staging buffer: keep them ordered when the stream changes, by
        waiting for the tail event (recorded after every launch, so the previous stream itself, which the
        caller may have destroyed since, is never touched)."""
        fs = self.fs
        last = fs.last_stream
        fs.last_stream = stream
        if last == NO_STREAM or last == stream or not fs.tail_live:
            return
        if self.driver.capturing(stream):
            return  # inside a capture the user's own stream dependencies order the ops
        import cupy
        cupy.cuda.runtime.streamWaitEvent(stream, self._tail.ptr, 0)

    def _mark(self, stream: int) -> None:
        """Record the tail event after a launch (outside captures: a captured record is not an event)."""
        if self.driver.capturing(stream):
            self.fs.tail_live = False
        else:
            self.driver.event_record(self._tail_h, ctypes.c_void_p(stream))
            self.fs.tail_live = True

    def _run_compiled(self, ln: Any, stream: int, what: str) -> int:
        """A stream-synchronised program (or its Bound call) in one C call, tail event included; a CUresult
        (0: done). A failure after some operations were enqueued cannot be retried: it raises."""
        prog = ln.prog if type(ln) is Bound else ln
        if type(ln) is Bound:
            prog.bind(ln.send, ln.recv, ln.aligned)
        rc, done = self.compiled_program(*self._entry, self._batch_addr, prog.packed(), len(prog.steps), stream,
                                         self._tail.ptr)
        if rc > 0:
            if done:
                raise HpcclSystemError(f"{what}: a stream operation failed after {done} of {len(prog.steps)} were "
                                       f"enqueued: {self.driver.error_name(rc)}")
            return rc
        self.fs.tail_live = rc == 0
        return 0

    def _go(self, ln: Any, stream: int, what: str, kind: Optional[str]) -> None:
        if stream != self.fs.last_stream:
            self._order(stream)
        compiled = self.compiled_program is not None and type(ln) in (Bound, Program)
        rc = self._run_compiled(ln, stream, what) if compiled else ln(stream)
        if rc:
            if rc in (201, 400, 709):  # no/invalid context current on this thread: make ours current
                import cupy
                with cupy.cuda.Device(self.device):
                    rc = self._run_compiled(ln, stream, what) if compiled else ln(stream)
            if rc:
                raise HpcclSystemError(f"{what}: cuLaunchKernel failed: {self.driver.error_name(rc)}")
        if not compiled:
            self._mark(stream)
        self._count()
        self._what = what
        self.last = (ln, kind)

    def _count(self) -> None:
        """One more call of this rank, published for peers that look for a rank that never launched."""
        self.fs.seq += 1
        if self._pub is not None:
            self._pub[_I_DEVSEQ] = self.fs.seq

    def _set(self, send: int, recv: int, nbytes: int, stride: int, chunk: int, root: int,
             extra_align: int = 0) -> None:
        a = self.args
        a.send, a.recv, a.nbytes, a.stride, a.chunk, a.root = send, recv, nbytes, stride, chunk, root
        a.aligned = 1 if ((send | recv | stride | extra_align) & 15) == 0 else 0

    def set_blocks(self, blocks: int) -> None:
        """The most blocks per kernel (benchmark sweeps; never above block_cap), dropping cached plans and
        launches."""
        self.maxb = max(1, min(MAX_BLOCKS, blocks, self.block_cap))
        self.safe_blocks = max(1, min(MAX_BLOCKS, blocks))
        self._plans.clear()
        self._progs.clear()
        self.drop()

    # ----- fast path ------------------------------------------------------------------------------------
    def drop(self) -> None:
        """Forget every launch snapshot (here and in compiled replays, through the generation)."""
        self._fast.clear()
        self.fs.gen += 1

    def fast_key(self, coll: str, sendbuf: Any, recvbuf: Any, op: Any, root: int, stream: Any) -> Optional[tuple]:
        return self._keys.key(coll, sendbuf, recvbuf, op, root, stream)

    def fire(self, key: tuple) -> bool:
        """Launch the snapshot cached for key; False when there is none (take the validating path)."""
        ln = self._fast.get(key)
        if ln is None or not self.fs.live or self.fs.held or self._err.value:
            return False
        if ln is NOTHING:
            self._count()
            return True
        st = key[-1]
        if st != self.fs.last_stream:
            self._order(st)
        if self.compiled_program is not None and type(ln) is Bound:
            if self._run_compiled(ln, st, self._what):
                return False  # nothing was enqueued: the slow path retries and reports
        elif self.compiled_launch is not None and type(ln) is Launch:  # capture check, launch, tail record in C
            rc = self.compiled_launch(*self._entry, ln.fi, ln.grid, ln.block, st, ln.pi, self._tail.ptr)
            if rc > 0:
                return False  # the slow path retries and reports
            self.fs.tail_live = rc == 0
        else:
            if ln(st):
                return False
            self._mark(st)
        self._count()
        return True

    def remember(self, key: Optional[tuple]) -> None:
        """Snapshot the argument struct(s) of the launch just made, for fire() on the same key."""
        if key is None or self.last is None or self.last[1] is None:
            return
        ln, kind = self.last
        if len(self._fast) >= FAST_ENTRIES:
            self.drop()
        if ln is NOTHING or kind == "safe":  # a Bound program holds its own buffers
            self._fast[key] = ln
            return
        a = CommArgs()
        ctypes.memmove(ctypes.addressof(a), ctypes.addressof(self.args), ctypes.sizeof(CommArgs))
        args: List[Any] = [a]
        if kind == "copy":
            args.append(ctypes.c_uint64(self.rstride.value))
        self._fast[key] = Launch(self.driver, ln.func.value, ln.grid, ln.block, args)

    # ----- collectives: flat CuPy views already validated by the front end (hpccl.core.comm) --------------
    @staticmethod
    def _ptr(a: Any) -> int:
        return a.data.ptr

    def _alone(self, send: Any, recv: Any) -> bool:
        """One rank whose output is its input: nothing moves and nothing is launched (as NCCL at one rank);
        the call still counts, and its snapshot replays as nothing."""
        if self.size != 1 or send.data.ptr != recv.data.ptr:
            return False
        self._count()
        self.last = (NOTHING, "plain")
        return True

    def _safe(self, pkey: tuple, build: Any, send: int, recv: int, stream: int, what: str,
              extra_align: int = 0) -> None:
        """Run a call on the stream-synchronised protocol: its program, built once per plan key."""
        prog = self._progs.get(pkey)
        if prog is None:
            if len(self._progs) >= FAST_ENTRIES:
                self._progs.clear()
                self.drop()
            prog = self._progs[pkey] = build()
        aligned = 1 if ((send | recv | extra_align) & 15) == 0 else 0
        self._go(Bound(prog, send, recv, aligned), stream, what, "safe")

    def all_reduce(self, send: Any, recv: Any, op: ReduceOp, stream: int, algo: str = "oneshot") -> None:
        """One kernel: 'oneshot' (every rank reduces all of it) or 'twoshot' (stripes, then a gather)."""
        if self._alone(send, recv):
            return
        nbytes = send.nbytes
        dt, opid = _dtid(_logical(send)), OP_IDS[op.value]
        if self.safe:
            two = algo == "twoshot" and self.size > 1
            b = self.builder
            self._safe(("s-ar", dt, opid, nbytes, two),
                       (lambda: b.two_shot(dt, opid, nbytes)) if two else
                       (lambda: b.one_pass(0, "reduce", dt, opid, nbytes, 0, 0, -1)),
                       self._ptr(send), self._ptr(recv), stream, "all_reduce")
            return
        pkey = ("ar", dt, opid, nbytes, algo)
        plan = self._plans.get(pkey)
        if plan is None:
            if algo == "twoshot" and self.size > 1:
                blocks, chunk = self._geometry(nbytes, self.size)
                name = f"hp_allreduce_twoshot<{dt}, {opid}>"
            else:
                blocks, chunk = self._geometry(nbytes, 1)
                name = f"hp_reduce_push<{dt}, {opid}>"
            plan = self._plans[pkey] = (self._launch(name, dt, blocks, "plain"), chunk)
        self._set(self._ptr(send), self._ptr(recv), nbytes, 0, plan[1], -1)
        self._go(plan[0], stream, "all_reduce", "plain")

    def reduce(self, send: Any, recv: Any, root: int, op: ReduceOp, stream: int) -> None:
        if self._alone(send, recv):
            return
        nbytes = send.nbytes
        dt, opid = _dtid(_logical(send)), OP_IDS[op.value]
        if self.safe:
            self._safe(("s-red", dt, opid, nbytes, root),
                       lambda: self.builder.one_pass(2, "reduce", dt, opid, nbytes, 0, 0, root),
                       self._ptr(send), self._ptr(recv), stream, "reduce")
            return
        plan = self._plan(("red", dt, opid, nbytes), f"hp_reduce_push<{dt}, {opid}>", dt, nbytes, "plain")
        self._set(self._ptr(send), self._ptr(recv), nbytes, 0, plan[1], root)
        self._go(plan[0], stream, "reduce", "plain")

    def reduce_scatter(self, send: Any, recv: Any, op: ReduceOp, stream: int) -> None:
        if self._alone(send, recv):
            return
        nbytes = recv.nbytes
        dt, opid = _dtid(_logical(send)), OP_IDS[op.value]
        if self.safe:
            self._safe(("s-rs", dt, opid, nbytes),
                       lambda: self.builder.one_pass(1, "reduce", dt, opid, nbytes, nbytes, 0, -1),
                       self._ptr(send), self._ptr(recv), stream, "reduce_scatter", nbytes)
            return
        plan = self._plan(("rs", dt, opid, nbytes), f"hp_reduce_push<{dt}, {opid}>", dt, nbytes, "plain")
        self._set(self._ptr(send), self._ptr(recv), nbytes, nbytes, plan[1], -1)
        self._go(plan[0], stream, "reduce_scatter", "plain")

    def _copy_coll(self, what: str, send: Any, recv: Any, nbytes: int, stride: int, rstride: int, root: int,
                   stream: int) -> None:
        if self._alone(send, recv):
            return
        if self.safe:
            self._safe(("s-copy", nbytes, stride, rstride, root),
                       lambda: self.builder.one_pass(1 if stride else 0, "copy", None, None, nbytes, stride, rstride,
                                                     root),
                       self._ptr(send), self._ptr(recv), stream, what, stride | rstride)
            return
        plan = self._plan(("copy", nbytes), "hp_copy_push", None, nbytes, "copy")
        self._set(self._ptr(send), self._ptr(recv), nbytes, stride, plan[1], root, rstride)
        self.rstride.value = rstride
        self._go(plan[0], stream, what, "copy")

    def all_gather(self, send: Any, recv: Any, stream: int) -> None:
        self._copy_coll("all_gather", send, recv, send.nbytes, 0, send.nbytes, -1, stream)

    def all_to_all(self, send: Any, recv: Any, stream: int) -> None:
        seg = send.nbytes // self.size
        self._copy_coll("all_to_all", send, recv, seg, seg, seg, -1, stream)

    def broadcast(self, send: Any, recv: Any, root: int, stream: int) -> None:
        self._copy_coll("broadcast", send, recv, send.nbytes, 0, 0, root, stream)

    def barrier(self, stream: int) -> None:
        """Stream-ordered barrier: work after it on ``stream`` starts once every rank's stream got here."""
        if self.safe:
            prog = self._progs.get(("s-bar",))
            if prog is None:
                prog = self._progs[("s-bar",)] = self.builder.barrier()
            self._go(prog, stream, "barrier", None)
            return
        self._set(0, 0, 0, 0, 16, -1)
        self._go(self._launch("hp_barrier", None, 1, "plain"), stream, "barrier", None)

    # ----- zero-copy collectives on registered buffers (transport/cuda_register.py) ----------------------
    def register(self, ptr: int, nbytes: int, obj: Any, name: str) -> None:
        self.registry.register(ptr, nbytes, obj, name)
        self.drop()  # snapshots of staged launches on this buffer must not replay

    def deregister(self, ptr: int, nbytes: int, name: str) -> None:
        self.registry.deregister(ptr, nbytes, name)
        self.drop()

    # ----- point to point --------------------------------------------------------------------------------
    def group_p2p(self, sends: Sequence[Tuple[int, Any]], recvs: Sequence[Tuple[int, Any]], stream: int) -> None:
        """Run sends and receives together in one kernel (like ncclGroupStart/End around them): the k-th
        send to a peer matches that peer's k-th receive from this rank."""
        ops: List[Tuple[int, Any, int]] = [(peer, b, 1) for peer, b in sends] + [(peer, b, 0) for peer, b in recvs]
        # rounds: the k-th op of each (peer, direction) pair; at most MAX_P2P_OPS per kernel
        seen: Dict[Tuple[int, int], int] = {}
        rounds: List[List[Tuple[int, Any, int]]] = []
        for op in ops:
            k = seen.get((op[0], op[2]), 0)
            seen[(op[0], op[2])] = k + 1
            while len(rounds) <= k:
                rounds.append([])
            rounds[k].append(op)
        for rnd in rounds:
            if self.safe:
                live = [(peer, b.data.ptr, b.nbytes, is_send) for peer, b, is_send in rnd if b.nbytes]
                if live:
                    self._go(self.builder.p2p(live), stream, "send/recv", None)
                continue
            for i in range(0, len(rnd), MAX_P2P_OPS):
                self._p2p_kernel(rnd[i:i + MAX_P2P_OPS], stream)

    def _p2p_kernel(self, ops: Sequence[Tuple[int, Any, int]], stream: int) -> None:
        pa = self.p2p_args
        per_op = self.p2p_blocks  # the same on every rank, so a sender and its receiver agree on the channels
        nb_total = 0
        n = 0
        for peer, b, is_send in ops:
            if b.nbytes == 0:
                continue
            o = pa.ops[n]
            nb = max(1, min(per_op, -(-b.nbytes // self.args.p2p_slot)))
            o.buf, o.nbytes, o.peer, o.is_send, o.nblocks, o.first_block = (b.data.ptr, b.nbytes, peer, is_send, nb,
                                                                             nb_total)
            nb_total += nb
            n += 1
        if n == 0:
            return
        pa.nops = n
        self._go(self._launch("hp_p2p", None, nb_total, "p2p"), stream, "send/recv", None)

    # ----- life cycle ----------------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self.fs.live = 0
        self.drop()
        self.watchdog.stop()
        _LIVE.discard(self)
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
        self.registry.close()
        if self.words is not None:
            self.words.close()
        self.peers.close()
        try:
            if self._err_page:
                self.driver.host_unregister(ctypes.c_void_p(self._err_page))
            else:
                cupy.cuda.runtime.freeHost(self._private_err)
        except Exception:  # noqa: BLE001
            pass
        self._closed = True
