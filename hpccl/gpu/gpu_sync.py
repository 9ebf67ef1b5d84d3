"""The stream-synchronised ("safe") protocol of GPU collectives on one node, and the watchdog that bounds it.

Spinning kernels (hpccl/gpu/cuda_comm.py's default kernels) wait for their peers inside the kernel. That is the
fast path on a GPU the job has to itself, but a spinning block holds a multiprocessor while it waits, so when
other work shares the GPU (another hpccl job under MPS, another communicator of the job on another stream,
any foreign kernel) the blocks a peer needs may never become resident: a deadlock. Here every wait on a peer
is a stream memory operation (cuStreamWaitValue32, in one cuStreamBatchMemOp per step) on words in the node's
shared memory, between kernels that never wait for anything, so no kernel of this protocol can hold a
multiprocessor that another rank's progress depends on.

Per exchange on slot parity p, rank r enqueues on the caller's stream:
  pre    wait FREE[d][p] == 1 and clear it, for every peer d   (d finished reading r's last parity-p data)
  kernel push r's data into the peers' regions [p][r]            (hp_s_push)
  post   write RDY[r][p] := 1 in every peer's words; wait RDY[s][p] == 1 in r's words and clear it
  kernel combine the peers' regions [p][s] into the output       (hp_s_reduce / hp_s_copyout)
  done   write FREE[r][p] := 1 in every peer's words
Every value is a constant, so a CUDA graph replays the same operations correctly, and each parity's
handshake is complete in itself, so calls of any size follow each other with no further ordering.

The words live in each rank's shared-memory header (hpccl/transport/shm.py, registered with CUDA), so the
host sees them too: a watchdog thread per communicator reads the rank's busy word and progress counter
(kernels bump it) and turns a stream stuck in a wait for HPCCL_TIMEOUT into a timeout, releases every wait
after an abort (the kernels then see the error word and write nothing), and checks the local peers'
processes, so a dead rank stops the others' GPU work at once (in either protocol).
"""
from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .. import config, log
from ..errors import HpcclSystemError
from ..kernels import ERR_DEAD, ERR_NET, ERR_PEER, ERR_TIMEOUT, MAX_RANKS, CommArgs, Driver, Launch, SafeArgs

# u32 word indexes in a rank's sync area (transport/shm.py gpu_sync_address)
W_PROG, W_BUSY = 0, 1
W_RDY = 16         # [src][parity] collective data from src is in this rank's regions
W_FREE = W_RDY + 2 * MAX_RANKS    # [dst][parity] dst finished reading this rank's data
W_PRDY = W_FREE + 2 * MAX_RANKS   # the same two for send/recv
W_PFREE = W_PRDY + 2 * MAX_RANKS
N_WORDS = W_PFREE + 2 * MAX_RANKS


_OP_WAIT32, _OP_WRITE32 = 1, 2  # CU_STREAM_MEM_OP_WAIT_VALUE_32, CU_STREAM_MEM_OP_WRITE_VALUE_32
_WAIT_EQ = 1                     # CU_STREAM_WAIT_VALUE_EQ
POLL_S = 0.01


class MemOp(ctypes.Structure):
    """CUstreamBatchMemOpParams (the wait/write member of the 48-byte union)."""
    _fields_ = [("operation", ctypes.c_uint32), ("_p0", ctypes.c_uint32), ("address", ctypes.c_uint64),
                ("value", ctypes.c_uint64), ("flags", ctypes.c_uint32), ("_p1", ctypes.c_uint32),
                ("alias", ctypes.c_uint64), ("_p2", ctypes.c_uint64)]


assert ctypes.sizeof(MemOp) == 48


def wanted(share: int, other_live: bool, mps: Optional[bool] = None) -> Tuple[bool, str]:
    """Whether this rank asks for the safe protocol, and why: HPCCL_CUDA_SYNC=stream|spin forces it; auto
    takes it when the GPU may be shared (several ranks on it, CUDA MPS running, or another communicator of
    this process live on the device)."""
    mode = config.get("HPCCL_CUDA_SYNC")
    if mode == "stream":
        return True, "HPCCL_CUDA_SYNC=stream"
    if mode == "spin":
        return False, "HPCCL_CUDA_SYNC=spin"
    if share > 1:
        return True, f"{share} ranks share a GPU"
    if mps is None:
        mps = mps_active()
    if mps:
        return True, "CUDA MPS is running"
    if other_live:
        return True, "another communicator is live on this GPU"
    return False, "the GPU is this rank's alone"


def mps_active() -> bool:
    """A CUDA MPS control daemon is reachable (its pipe directory holds the control socket)."""
    d = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    return os.path.exists(os.path.join(d, "control"))


class Words:
    """Every local rank's sync words as host views (this process's mappings) and device pointers (the
    header pages registered with CUDA here)."""

    def __init__(self, shm: Any, ranks: int, rank: int, driver: Driver, own_registered: int) -> None:
        self.rank, self.n, self.driver = rank, ranks, driver
        self.host: List[Any] = []
        self.dev: List[int] = []
        self.err_dev: List[int] = []  # every local rank's GPU error word (SafeArgs.perr)
        self._pages: List[int] = []
        for r in range(ranks):
            addr = shm.gpu_sync_address(r)
            page = addr & ~4095
            if page != own_registered:
                driver.host_register(page, 4096)
                self._pages.append(page)
            self.host.append((ctypes.c_uint32 * N_WORDS).from_address(addr))
            self.dev.append(driver.host_device_pointer(addr))
            self.err_dev.append(driver.host_device_pointer(shm.gpu_error_word(r)))  # same page
        me = self.host[rank]
        for w in range(N_WORDS):
            me[w] = 0
        for d in range(ranks):  # every region of this rank's in the peers starts free
            for p in (0, 1):
                me[W_FREE + 2 * d + p] = 1
                me[W_PFREE + 2 * d + p] = 1

    def dptr(self, r: int, word: int) -> int:
        return self.dev[r] + 4 * word

    def release_all(self) -> None:
        """Satisfy every wait of this rank's (after an abort or a timeout: the kernels write nothing)."""
        me = self.host[self.rank]
        for w in range(W_RDY, N_WORDS):
            me[w] = 1

    def close(self) -> None:
        for page in self._pages:
            try:
                self.driver.host_unregister(ctypes.c_void_p(page))
            except Exception:  # noqa: BLE001
                pass
        self._pages = []


class Ops:
    """Builds batches of stream memory operations on the sync words of one communicator."""

    def __init__(self, words: Words) -> None:
        self.w = words
        self.me = words.rank
        self.peers = [p for p in range(words.n) if p != words.rank]

    def _wait(self, r: int, word: int) -> Tuple[int, int, int, int]:
        return (_OP_WAIT32, self.w.dptr(r, word), 1, _WAIT_EQ)

    def _write(self, r: int, word: int, value: int) -> Tuple[int, int, int, int]:
        """A write; the driver fences the stream's earlier writes first (the v2 API has no unfenced write)."""
        return (_OP_WRITE32, self.w.dptr(r, word), value, 0)

    def _take(self, base: int, peers: Sequence[int], par: int) -> List[tuple]:
        """Wait for each peer's word [peer][par] of this rank's to be 1, and clear it."""
        out: List[tuple] = []
        for p in peers:
            out.append(self._wait(self.me, base + 2 * p + par))
            out.append(self._write(self.me, base + 2 * p + par, 0))
        return out

    def pre(self, par: int, p2p_peers: Optional[Sequence[int]] = None) -> List[tuple]:
        """Before writing into peers' regions of parity par: they have read the last data there."""
        return self._take(W_FREE, self.peers, par) if p2p_peers is None else self._take(W_PFREE, p2p_peers, par)

    def signal(self, par: int, p2p_peers: Optional[Sequence[int]] = None) -> List[tuple]:
        """This rank's data of parity par is in the peers' regions."""
        base, peers = (W_RDY, self.peers) if p2p_peers is None else (W_PRDY, p2p_peers)
        return [self._write(d, base + 2 * self.me + par, 1) for d in peers]

    def arrive(self, par: int, p2p_peers: Optional[Sequence[int]] = None) -> List[tuple]:
        """Wait until every peer's data of parity par is in this rank's regions."""
        return self._take(W_RDY, self.peers, par) if p2p_peers is None else self._take(W_PRDY, p2p_peers, par)

    def post(self, par: int) -> List[tuple]:
        return self.signal(par) + self.arrive(par)

    def done(self, par: int, p2p_peers: Optional[Sequence[int]] = None) -> List[tuple]:
        """This rank finished reading the peers' parity-par data: their regions here are free again."""
        base, peers = (W_FREE, self.peers) if p2p_peers is None else (W_PFREE, p2p_peers)
        return [self._write(s, base + 2 * self.me + par, 1) for s in peers]

    def busy(self, value: int) -> List[tuple]:
        return [self._write(self.me, W_BUSY, value)]


class Batch:
    """One cuStreamBatchMemOp: its parameter array packed once."""

    __slots__ = ("arr", "count", "_fn")

    def __init__(self, fn: Any, ops: Sequence[tuple]) -> None:
        self.count = len(ops)
        self.arr = (MemOp * len(ops))()
        for i, (kind, addr, value, flags) in enumerate(ops):
            m = self.arr[i]
            m.operation, m.address, m.value, m.flags = kind, addr, value, flags
        self._fn = fn

    def __call__(self, stream: int) -> int:
        return self._fn(ctypes.c_void_p(stream), self.count, self.arr, 0)


class GpuStep(ctypes.Structure):
    """One step for the compiled runner (hpccl/csrc/_hotpath.c gpu_program): a launch or a batch."""
    _fields_ = [("kind", ctypes.c_uint64), ("func", ctypes.c_uint64), ("grid", ctypes.c_uint32),
                ("block", ctypes.c_uint32), ("params", ctypes.c_uint64)]


class Program:
    """The stream operations of one call (batches and kernel launches, in order), built once per plan and
    replayed; the buffers are patched into every launch's arguments when they change."""

    __slots__ = ("steps", "args", "_bufs", "_packed", "_npacked")

    def __init__(self) -> None:
        self.steps: List[Callable[[int], int]] = []
        self.args: List[SafeArgs] = []
        self._bufs: Tuple[int, int, int] = (-1, -1, -1)
        self._packed: Any = None
        self._npacked = -1

    def packed(self) -> int:
        """Address of the steps as GpuStep records (made once; again if the steps changed)."""
        if self._npacked != len(self.steps):
            arr = (GpuStep * max(1, len(self.steps)))()
            for i, st in enumerate(self.steps):
                if isinstance(st, Batch):
                    arr[i].kind, arr[i].func, arr[i].params = 1, st.count, ctypes.addressof(st.arr)
                else:
                    arr[i].kind, arr[i].func, arr[i].grid, arr[i].block, arr[i].params = 0, st.fi, st.grid, st.block, st.pi
            self._packed, self._npacked = arr, len(self.steps)
        return ctypes.addressof(self._packed)

    def bind(self, send: int, recv: int, aligned: int) -> None:
        if (send, recv, aligned) != self._bufs:
            for a in self.args:
                a.c.send, a.c.recv, a.c.aligned = send, recv, aligned
            self._bufs = (send, recv, aligned)

    def clone(self, send: int, recv: int, aligned: int) -> "Clone":
        """A private copy bound to these buffers, for a replay outside Python (hpccl/torch/_native.cpp): its
        own argument structs and packed steps, so binding this program to other buffers later leaves it be."""
        return Clone(self, send, recv, aligned)

    def __call__(self, stream: int) -> int:
        for i, step in enumerate(self.steps):
            rc = step(stream)
            if rc:
                if i:
                    raise HpcclSystemError(f"a stream operation failed after {i} of {len(self.steps)} were "
                                           f"enqueued (CUresult {rc})")
                return rc
        return 0


class Clone:
    """A Program's steps with argument structs of their own, bound to one call's buffers; ``addr`` and
    ``count`` are the packed steps for the compiled runner (hpccl/csrc/_hotpath.c program_entry). Batches are
    constants and shared with the program (kept alive through it)."""

    __slots__ = ("prog", "addr", "count", "_keep")

    def __init__(self, prog: Program, send: int, recv: int, aligned: int) -> None:
        self.prog, self.count = prog, len(prog.steps)
        bound = {id(a) for a in prog.args}
        arr = (GpuStep * max(1, self.count))()
        self._keep: List[Any] = [arr]
        for i, st in enumerate(prog.steps):
            if isinstance(st, Batch):
                arr[i].kind, arr[i].func, arr[i].params = 1, st.count, ctypes.addressof(st.arr)
                continue
            args = []
            for a in st._keep[:-1]:  # a Launch keeps its arguments, then their pointer array
                c = type(a).from_buffer_copy(a)
                if id(a) in bound:
                    c.c.send, c.c.recv, c.c.aligned = send, recv, aligned
                args.append(c)
            ptrs = (ctypes.c_void_p * len(args))(*[ctypes.addressof(c) for c in args])
            self._keep += args + [ptrs]
            arr[i].kind, arr[i].func, arr[i].grid, arr[i].block = 0, st.fi, st.grid, st.block
            arr[i].params = ctypes.addressof(ptrs)
        self.addr = ctypes.addressof(arr)


class Bound:
    """A program with the buffers of one call: what the fast path replays for a repeated call."""

    __slots__ = ("prog", "send", "recv", "aligned")

    def __init__(self, prog: Program, send: int, recv: int, aligned: int) -> None:
        self.prog, self.send, self.recv, self.aligned = prog, send, recv, aligned

    def __call__(self, stream: int) -> int:
        self.prog.bind(self.send, self.recv, self.aligned)
        return self.prog(stream)


class Builder:
    """Makes the Program of each collective from rounds of (pre, push, post, combine, done)."""

    def __init__(self, eng: Any, words: Words) -> None:
        self.eng = eng
        self.ops = Ops(words)
        self.words = words
        d = eng.driver
        self._batch_fn = getattr(d.lib, "cuStreamBatchMemOp_v2", None) or getattr(d.lib, "cuStreamBatchMemOp", None)
        if self._batch_fn is None:
            raise HpcclSystemError("the CUDA driver has no cuStreamBatchMemOp: the stream-synchronised protocol "
                                   "cannot run (set HPCCL_CUDA_SYNC=spin on a GPU this job has alone)")
        self._batch_fn.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_uint]
        self._batch_fn.restype = ctypes.c_int
        lay = eng.peers.layout
        from ..kernels import MAX_BLOCKS
        self.region = lay.slot * MAX_BLOCKS  # bytes of one [parity][src] region
        self.p2p_region = lay.p2p_slot * MAX_BLOCKS  # bytes of one send/recv [src][parity] region
        self.prog_dev = words.dptr(words.rank, W_PROG)
        self.spin_ns = int(config.get("HPCCL_CUDA_SYNC_SPIN") * 1000)
        self._peek_args: Dict[int, list] = {}

    # --- pieces ---
    def _args(self, mode: int, par: int, off: int, nbytes: int, stride: int, rstride: int, root: int,
              par2: int = -1, limit: int = (1 << 64) - 1, region: Optional[int] = None) -> SafeArgs:
        s = SafeArgs()
        ctypes.memmove(ctypes.addressof(s.c), ctypes.addressof(self.eng.args), ctypes.sizeof(CommArgs))
        s.c.nbytes, s.c.stride, s.c.root = nbytes, stride, root
        s.c.slot = self.region if region is None else region
        s.off, s.rstride, s.limit, s.prog = off, rstride, limit, self.prog_dev
        s.par, s.par2, s.mode = par, par2, mode
        for r, d in enumerate(self.words.err_dev):
            s.perr[r] = d
        s.perr[self.words.rank] = s.c.err  # the word this rank's kernels poll (private when not shared)
        return s

    def _kernel(self, prog: Program, name: str, dt: Optional[int], args: SafeArgs, nbytes: int,
                bound: bool = True) -> None:
        """A launch of ``nbytes`` of work; ``bound``: its buffers are the call's (patched by bind())."""
        eng = self.eng
        grid = max(1, min(eng.safe_blocks, -(-nbytes // eng.block_bytes)))
        prog.steps.append(Launch(eng.driver, eng.kernels.func(name, dt), grid, eng.threads, [args]))
        if bound:
            prog.args.append(args)

    def _arrive(self, prog: Program, par: int, before: Sequence[tuple] = (), after: Sequence[tuple] = ()) -> None:
        """Wait for every peer's parity-par data: a bounded look first (hp_s_peek, HPCCL_CUDA_SYNC_SPIN),
        then the stream's wait."""
        o = self.ops
        if self.spin_ns > 0 and o.peers:
            self._batch(prog, list(before))
            args = self._peek_args.get(par)
            if args is None:
                mask = 0
                for s in o.peers:
                    mask |= 1 << s
                args = self._peek_args[par] = [ctypes.c_uint64(self.words.dptr(self.words.rank, W_RDY + par)),
                                               ctypes.c_uint32(mask), ctypes.c_uint64(self.spin_ns)]
            eng = self.eng
            prog.steps.append(Launch(eng.driver, eng.kernels.func("hp_s_peek"), 1, 32, args))
            self._batch(prog, o.arrive(par) + list(after))
        else:
            self._batch(prog, list(before) + o.arrive(par) + list(after))

    def _batch(self, prog: Program, ops: Sequence[tuple]) -> None:
        if ops:
            prog.steps.append(Batch(self._batch_fn, ops))

    def _rounds(self, total: int, per: int) -> List[Tuple[int, int]]:
        """(offset, bytes) of each round; one empty round for an empty call (the ranks still meet)."""
        if total <= 0:
            return [(0, 0)]
        return [(off, min(per, total - off)) for off in range(0, total, per)]

    # --- collectives ---
    def one_pass(self, push_mode: int, combine: str, dt: Optional[int], op: Optional[int], total: int,
                 stride: int, rstride: int, root: int) -> Program:
        """Rounds of push, exchange, combine: one-shot all_reduce (push 0, reduce), reduce_scatter (push 1,
        reduce), reduce (push 2, reduce at the root), all_gather and broadcast (push 0, copy), all_to_all
        (push 1, copy). ``total``: bytes of one piece."""
        prog = Program()
        o = self.ops
        pending = o.busy(1)
        name = f"hp_s_reduce<{dt}, {op}>" if combine == "reduce" else "hp_s_copyout"
        for i, (off, n) in enumerate(self._rounds(total, self.region)):
            par = i & 1
            self._batch(prog, pending + o.pre(par))
            self._kernel(prog, "hp_s_push", None, self._args(push_mode, par, off, n, stride, rstride, root), n)
            self._arrive(prog, par, before=o.signal(par))
            self._kernel(prog, name, dt if combine == "reduce" else None,
                         self._args(0, par, off, n, stride, rstride, root), n)
            pending = o.done(par)
        self._batch(prog, pending + o.busy(0))
        return prog

    def two_shot(self, dt: int, op: int, total: int) -> Program:
        """all_reduce in stripes: piece p of each unit to rank p, which reduces it and forwards the result
        into every peer's parity-1 region; then every rank copies the other stripes out."""
        prog = Program()
        o = self.ops
        n = self.words.n
        per = -(-total // n)
        seg = min(self.region, max(16, -(-per // 16) * 16))
        pending = o.busy(1)
        for base in range(0, max(total, 1), seg * n):
            self._batch(prog, pending + o.pre(0))
            self._kernel(prog, "hp_s_push", None, self._args(1, 0, base, seg, seg, seg, -1, limit=total), seg)
            self._arrive(prog, 0, before=o.signal(0), after=o.pre(1))
            self._kernel(prog, f"hp_s_reduce<{dt}, {op}>", dt,
                         self._args(0, 0, base, seg, seg, seg, -1, par2=1, limit=total), seg)
            self._arrive(prog, 1, before=o.done(0) + o.signal(1))
            self._kernel(prog, "hp_s_copyout", None, self._args(1, 1, base, seg, seg, seg, -1, limit=total), seg)
            pending = o.done(1)
        self._batch(prog, pending + o.busy(0))
        return prog

    def barrier(self) -> Program:
        prog = Program()
        o = self.ops
        self._batch(prog, o.busy(1) + o.pre(0) + o.post(0) + o.done(0) + o.busy(0))
        return prog

    def p2p(self, ops: Sequence[Tuple[int, int, int, int]]) -> Program:
        """One round list of send/recv ops (peer, buffer address, bytes, is_send; at most one per peer and
        direction): chunk k of every op in round k, sends before receives, so every wait depends only on
        earlier rounds or on sends of the same round, which wait on nothing of it."""
        prog = Program()
        o = self.ops
        sends = [x for x in ops if x[3]]
        recvs = [x for x in ops if not x[3]]
        per = self.p2p_region
        nrounds = max(1, max(-(-x[2] // per) for x in ops))
        pending = o.busy(1)
        for k in range(nrounds):
            par = k & 1
            live_s = [x for x in sends if k * per < x[2]]
            live_r = [x for x in recvs if k * per < x[2]]
            if live_s:
                self._batch(prog, pending + o.pre(par, [x[0] for x in live_s]))
                pending = []
                for peer, buf, nb, _ in live_s:
                    n = min(per, nb - k * per)
                    if n > 0:
                        self._copy(prog, buf + k * per, self._p2p_at(peer, self.words.rank, par), n)
                self._batch(prog, o.signal(par, [x[0] for x in live_s]))
            if live_r:
                self._batch(prog, pending + o.arrive(par, [x[0] for x in live_r]))
                pending = []
                for peer, buf, nb, _ in live_r:
                    n = min(per, nb - k * per)
                    if n > 0:
                        self._copy(prog, self._p2p_at(self.words.rank, peer, par), buf + k * per, n)
                pending = o.done(par, [x[0] for x in live_r])
        self._batch(prog, pending + o.busy(0))
        return prog

    def _p2p_at(self, dst: int, src: int, par: int) -> int:
        """Device address of the send/recv region [src][par] in rank dst's area."""
        lay = self.eng.peers.layout
        return self.eng.peers.stage[dst] + lay.p2p_off + (2 * src + par) * self.p2p_region

    def _copy(self, prog: Program, src: int, dst: int, nbytes: int) -> None:
        """A copy kernel (hp_s_copyout as broadcast from "root" 0 = this rank's own input)."""
        s = self._args(0, 0, 0, nbytes, 0, 0, self.words.rank)
        s.c.send, s.c.recv = src, dst
        s.c.aligned = 1 if ((src | dst) & 15) == 0 else 0
        self._kernel(prog, "hp_s_copyout", None, s, nbytes, bound=False)  # fixed buffers: bind() leaves them


class Watchdog:
    """A daemon thread per GPU communicator: dead local peers (both protocols), and for the safe protocol a
    stream stuck in one of its waits for HPCCL_TIMEOUT, and the release of every wait once the error word is
    set. It reports nothing itself: the rank's next call or synchronize() raises (CudaComm._fail)."""

    def __init__(self, eng: Any, words: Optional[Words], shm: Any) -> None:
        self.eng, self.words, self.shm = eng, words, shm
        self.dead: Optional[Tuple[int, str]] = None
        self._stop = threading.Event()
        self._timeout = float(config.get("HPCCL_TIMEOUT"))
        self._thread = threading.Thread(target=self._run, name="hpccl-gpu-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        err = self.eng._err
        words = self.words
        last_prog, last_change = -1, time.monotonic()
        tick = 0
        while not self._stop.wait(POLL_S):
            tick += 1
            if err.value:
                # keep every wait of this rank satisfied (the kernels behind them see the error word and do
                # nothing), every millisecond while the stream is inside a call
                if words is not None:
                    words.release_all()
                    if words.host[words.rank][W_BUSY]:
                        self._stop.wait(0.001)
                continue
            if self.shm is not None and tick % 2 == 0:
                d = self.shm.dead_peer()
                if d is not None:
                    self.dead = d
                    if err.value == 0:
                        err.value = ERR_DEAD
                    continue
            if words is None:
                continue
            me = words.host[words.rank]
            now = time.monotonic()
            if not me[W_BUSY]:
                last_prog, last_change = me[W_PROG], now
                continue
            p = me[W_PROG]
            if p != last_prog:
                last_prog, last_change = p, now
            elif now - last_change > self._timeout:
                if err.value == 0:
                    err.value = ERR_TIMEOUT
                log.warn("GPU", "stream-synchronised call stuck for %.1f s: released (timeout)", now - last_change)


def progress(shm: Any, ranks: int) -> Dict[int, Tuple[int, int]]:
    """(progress counter, busy) of every local rank whose words this process sees."""
    out = {}
    for r in range(ranks):
        try:
            w = (ctypes.c_uint32 * N_WORDS).from_address(shm.gpu_sync_address(r))
        except Exception:  # noqa: BLE001
            continue
        out[r] = (int(w[W_PROG]), int(w[W_BUSY]))
    return out
