"""The stream-synchronised GPU protocol (hpccl/gpu/gpu_sync.py), checked without a GPU: the programs the Builder
makes for every collective are run by a model of a GPU per rank (each batch of stream memory operations waits
and writes words as the driver would, each kernel is re-enacted on bytes from its SafeArgs as the CUDA code in
cuda/hpccl_kernels.cu does it), with the ranks' streams interleaved at random. Every result must equal numpy's,
no interleaving may deadlock, a kernel that reads a region must never see it overwritten before it read it,
and a graph replay (the same operations again) must stay correct. The real kernels run on the GPU machine
(bench/gpu_suite.sh)."""
from __future__ import annotations

import ctypes
import random
from types import SimpleNamespace

import numpy as np
import pytest

from hpccl.gpu import gpu_sync
from hpccl.kernels import CommArgs, Launch, SafeArgs
from hpccl.transport.cuda_ipc import Layout

U64 = (1 << 64) - 1


class Memory:
    """One host buffer standing for every device and host address of the model (device pointer = address)."""

    def __init__(self, size: int) -> None:
        self.buf = (ctypes.c_uint8 * size)()
        self.base = ctypes.addressof(self.buf)
        self.np = np.frombuffer(self.buf, dtype=np.uint8)
        self.top = 0

    def alloc(self, n: int) -> int:
        self.top = (self.top + 4095) // 4096 * 4096
        a = self.base + self.top
        self.top += n
        assert self.top <= len(self.np)
        return a

    def view(self, addr: int, n: int) -> np.ndarray:
        return self.np[addr - self.base: addr - self.base + n]


class FakeDriver:
    def __init__(self) -> None:
        self.launch_fn = lambda *a: 0
        self.lib = SimpleNamespace(cuStreamBatchMemOp_v2=lambda *a: 0)

    def host_register(self, page: int, n: int) -> None:
        pass

    def host_unregister(self, page) -> None:
        pass

    def host_device_pointer(self, addr: int) -> int:
        return addr


class FakeKernels:
    def __init__(self) -> None:
        self.names = {}

    def func(self, name: str, dt=None) -> int:
        return self.names.setdefault(name, len(self.names) + 1)


def make_ranks(mem: Memory, n: int, buffer_bytes: int):
    """n model ranks: their areas, sync words, error words, engines and builders."""
    lay = Layout(buffer_bytes, n)
    stage = [mem.alloc(lay.total) for _ in range(n)]
    hdr = [mem.alloc(4096) for _ in range(n)]
    shm = SimpleNamespace(gpu_sync_address=lambda r: hdr[r] + 2048, gpu_error_word=lambda r: hdr[r] + 384)
    kern = FakeKernels()
    ranks = []
    for r in range(n):
        a = CommArgs()
        for p in range(n):
            a.stage[p] = stage[p]
        a.err = hdr[r] + 384
        a.rank, a.nranks, a.root = r, n, -1
        eng = SimpleNamespace(args=a, driver=FakeDriver(), kernels=kern, threads=512, block_bytes=8192,
                              safe_blocks=4, peers=SimpleNamespace(layout=lay, stage=stage))
        words = gpu_sync.Words(shm, n, r, eng.driver, hdr[r])
        ranks.append(SimpleNamespace(eng=eng, words=words, b=gpu_sync.Builder(eng, words)))
    return ranks, kern, lay


def kernel_name(kern: FakeKernels, fi: int) -> str:
    return next(k for k, v in kern.names.items() if v == fi)


UFUNC = {0: np.add, 1: np.multiply, 2: np.minimum, 3: np.maximum, 4: np.add}


def run_kernel(mem: Memory, name: str, s: SafeArgs, dtype, reads: list) -> None:
    """What the CUDA kernel of that name does with these arguments (cuda/hpccl_kernels.cu)."""
    a = s.c
    n, rank = a.nranks, a.rank
    assert s.perr[rank] == a.err
    words = [int(mem.view(s.perr[k], 4).view(np.uint32)[0]) for k in range(n)]
    bad = [k for k in range(n) if words[k]]
    if bad:  # this rank's or a local peer's error word: nothing written; in its own word the first peer,
        # preferring one whose word names a cause of its own (not ERR_PEER)
        own = mem.view(a.err, 4).view(np.uint32)
        cause = [k for k in bad if words[k] < gpu_sync.ERR_PEER] or bad
        if rank not in bad:
            own[0] = gpu_sync.ERR_PEER + cause[0]
        return

    def region(dst, par, src):
        return a.stage[dst] + (par * n + src) * a.slot

    def piece(p):
        start = s.off + p * a.stride
        return 0 if s.limit <= start else min(s.limit - start, a.nbytes)

    if name == "hp_s_push":
        if (s.mode == 0 and a.root >= 0 and rank != a.root) or (s.mode == 2 and rank == a.root):
            return
        for p in range(n):
            if p == rank or (s.mode == 2 and p != a.root):
                continue
            pc = p if s.mode == 1 else 0
            ln = piece(pc)
            assert ln <= a.slot
            mem.view(region(p, s.par, rank), ln)[:] = mem.view(a.send + s.off + pc * a.stride, ln)
            reads.append(("w", p, s.par, rank))
    elif name.startswith("hp_s_reduce"):
        op = int(name.split(",")[1].rstrip(">"))
        if a.root >= 0 and rank != a.root:
            return
        ln = piece(rank)
        if ln == 0:
            return
        srcs = []
        for k in range(n):
            if k == rank:
                srcs.append(mem.view(a.send + s.off + rank * a.stride, ln).view(dtype).copy())
            else:
                srcs.append(mem.view(region(rank, s.par, k), ln).view(dtype).copy())
                reads.append(("r", rank, s.par, k))
        acc = srcs[0].copy()
        for x in srcs[1:]:
            acc = UFUNC[op](acc, x)
        if op == 4:
            acc = (acc / n).astype(dtype)
        out = acc.view(np.uint8)
        mem.view(a.recv + s.off + rank * s.rstride, ln)[:] = out
        if s.par2 >= 0:
            for p in range(n):
                if p != rank:
                    mem.view(region(p, s.par2, rank), ln)[:] = out
                    reads.append(("w", p, s.par2, rank))
    elif name == "hp_s_copyout":
        for k in range(n):
            if (a.root >= 0 and k != a.root) or (k == rank and s.mode == 1):
                continue
            ln = piece(0 if a.root >= 0 else k)
            if ln == 0:
                continue
            if k == rank:
                src = a.send + s.off + k * a.stride
            else:
                src = region(rank, s.par, k)
                reads.append(("r", rank, s.par, k))
            dst = a.recv + s.off + (0 if a.root >= 0 else k * s.rstride)
            if dst != src:
                mem.view(dst, ln)[:] = mem.view(src, ln)
    else:
        raise AssertionError(name)
    w = mem.view(s.prog, 4).view(np.uint32)
    w[0] += 1


def run_programs(mem, kern, progs, dtype, seed, on_deadlock=None):
    """Interleave the ranks' programs at random, step by step (a batch's operations one at a time, a kernel
    whole); fail on a deadlock unless on_deadlock() unblocks something (it returns True then)."""
    rng = random.Random(seed)
    flat = []
    for prog in progs:
        ops = []
        for st in prog.steps:
            if isinstance(st, gpu_sync.Batch):
                ops.extend(("m", st.arr[i]) for i in range(st.count))
            else:
                ops.append(("k", st))
        flat.append(ops)
    pos = [0] * len(progs)
    log = []
    while True:
        ready = []
        for r, ops in enumerate(flat):
            if pos[r] >= len(ops):
                continue
            kind, x = ops[pos[r]]
            if kind == "m" and x.operation == 1 and mem.view(x.address, 4).view(np.uint32)[0] != x.value:
                continue
            ready.append(r)
        if not ready:
            if all(pos[r] >= len(ops) for r, ops in enumerate(flat)):
                return log
            if on_deadlock is not None and on_deadlock():
                continue
            raise AssertionError(f"deadlock at {pos}")
        r = rng.choice(ready)
        kind, x = flat[r][pos[r]]
        pos[r] += 1
        if kind == "m":
            if x.operation == 2:
                mem.view(x.address, 4).view(np.uint32)[0] = x.value
        elif kernel_name(kern, x.func.value) != "hp_s_peek":  # a bounded look: no effect on memory
            run_kernel(mem, kernel_name(kern, x.func.value), x._keep[0], dtype, log)


CASES = [
    # (collective, ranks, elements per rank's piece, root)
    ("all_reduce", 2, 5, -1), ("all_reduce", 3, 70001, -1), ("all_reduce", 4, 3, -1),
    ("twoshot", 2, 70001, -1), ("twoshot", 3, 999, -1), ("twoshot", 4, 1, -1),
    ("reduce_scatter", 3, 40000, -1), ("reduce", 3, 50000, 1), ("all_gather", 3, 40001, -1),
    ("all_to_all", 4, 20000, -1), ("broadcast", 3, 70000, 2), ("broadcast", 2, 1, 0),
]


@pytest.mark.parametrize("spin", [0, 20], ids=["no-peek", "peek"])
@pytest.mark.parametrize("coll,n,count,root", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_programs_compute_what_numpy_does_under_any_interleaving(coll, n, count, root, spin, monkeypatch):
    """Small areas (so large calls take several rounds and parities), three random interleavings, each
    call run twice in a row on the same program (a replay), float32 sum and max."""
    monkeypatch.setenv("HPCCL_CUDA_SYNC_SPIN", str(spin))
    mem = Memory(48 << 20)
    ranks, kern, lay = make_ranks(mem, n, 256 << 10)
    if spin:
        assert any(kernel_name(kern, st.func.value) == "hp_s_peek" for rk in ranks
                   for st in rk.b.one_pass(0, "reduce", 8, 0, 64, 0, 0, -1).steps if isinstance(st, Launch))
    for seed in range(3):
        for opid, ufunc in ((0, np.add), (3, np.maximum)):
            if coll in ("all_gather", "all_to_all", "broadcast") and opid:
                continue
            rng = np.random.default_rng(seed)
            nin = count * n if coll in ("reduce_scatter", "all_to_all") else count
            nout = count * n if coll in ("all_gather", "all_to_all") else count
            inputs = [rng.integers(-50, 50, nin).astype(np.float32) for _ in range(n)]
            progs, outs = [], []
            for r, rk in enumerate(ranks):
                send, recv = mem.alloc(nin * 4), mem.alloc(nout * 4)
                mem.view(send, nin * 4)[:] = inputs[r].view(np.uint8)
                b = rk.b
                nb = count * 4
                if coll == "all_reduce":
                    prog = b.one_pass(0, "reduce", 8, opid, nb, 0, 0, -1)
                elif coll == "twoshot":
                    prog = b.two_shot(8, opid, nb)
                elif coll == "reduce_scatter":
                    prog = b.one_pass(1, "reduce", 8, opid, nb, nb, 0, -1)
                elif coll == "reduce":
                    prog = b.one_pass(2, "reduce", 8, opid, nb, 0, 0, root)
                elif coll == "all_gather":
                    prog = b.one_pass(0, "copy", None, None, nb, 0, nb, -1)
                elif coll == "all_to_all":
                    prog = b.one_pass(1, "copy", None, None, nb, nb, nb, -1)
                else:
                    prog = b.one_pass(0, "copy", None, None, nb, 0, 0, root)
                prog.bind(send, recv, 1)
                progs.append(prog)
                outs.append(recv)
            for rep in range(2):  # the second run replays the same operations, like a CUDA graph
                for recv in outs:
                    mem.view(recv, nout * 4)[:] = 0xFF
                run_programs(mem, kern, progs, np.float32, seed * 10 + rep)
                for r in range(n):
                    got = mem.view(outs[r], nout * 4).view(np.float32)
                    if coll in ("all_reduce", "twoshot"):
                        want = ufunc.reduce(inputs)
                    elif coll == "reduce_scatter":
                        want = ufunc.reduce(inputs)[r * count:(r + 1) * count]
                    elif coll == "reduce":
                        if r != root:
                            continue
                        want = ufunc.reduce(inputs)
                    elif coll == "all_gather":
                        want = np.concatenate(inputs)
                    elif coll == "all_to_all":
                        want = np.concatenate([inputs[s][r * count:(r + 1) * count] for s in range(n)])
                    else:
                        want = inputs[root]
                    np.testing.assert_array_equal(got, want, err_msg=f"{coll} rank {r} run {rep}")
            # every word back at rest: nothing pending, every region free, busy cleared
            for rk in ranks:
                w = rk.words.host[rk.words.rank]
                assert w[gpu_sync.W_BUSY] == 0
                for d in range(n):
                    if d != rk.words.rank:
                        assert [w[gpu_sync.W_RDY + 2 * d + p] for p in (0, 1)] == [0, 0]
                        assert [w[gpu_sync.W_FREE + 2 * d + p] for p in (0, 1)] == [1, 1]


def test_a_region_is_never_overwritten_before_it_is_read():
    """Trace the writes into and reads from every region over several back-to-back calls of two sizes on 3
    ranks: between two writes of a region by its source, its owner read it exactly once."""
    mem = Memory(32 << 20)
    n = 3
    ranks, kern, lay = make_ranks(mem, n, 256 << 10)
    progs = []
    for r, rk in enumerate(ranks):
        big = rk.b.one_pass(0, "reduce", 8, 0, 200000, 0, 0, -1)
        small = rk.b.two_shot(8, 0, 4000)
        send, recv = mem.alloc(200000), mem.alloc(200000)
        for p in (big, small):
            p.bind(send, recv, 1)
        seq = gpu_sync.Program()
        for p in (big, small, big, small, small):
            seq.steps.extend(p.steps)
        progs.append(seq)
    for seed in range(5):
        log = run_programs(mem, kern, progs, np.float32, seed)
        state = {}
        for kind, dst, par, src in log:
            key = (dst, par, src)
            if kind == "w":
                assert state.get(key, "read") == "read", f"region {key} overwritten before it was read (seed {seed})"
                state[key] = "written"
            else:
                assert state.get(key) == "written", f"region {key} read before it was written (seed {seed})"
                state[key] = "read"


def test_p2p_rounds_never_deadlock_and_deliver():
    """A ring exchange and an all-pairs exchange of messages larger than the send/recv regions, each rank's
    sends and receives in one list: delivered intact under random interleavings."""
    mem = Memory(64 << 20)
    n = 4
    ranks, kern, lay = make_ranks(mem, n, 256 << 10)
    per = ranks[0].b.p2p_region
    nbytes = 2 * per + 1000
    for pattern in ("ring", "all"):
        progs, bufs = [], {}
        for r, rk in enumerate(ranks):
            ops = []
            peers = [(r + 1) % n] if pattern == "ring" else [p for p in range(n) if p != r]
            srcs = [(r - 1) % n] if pattern == "ring" else [p for p in range(n) if p != r]
            for p in peers:
                b = mem.alloc(nbytes)
                mem.view(b, nbytes)[:] = (np.arange(nbytes) * (r + 1) + p) % 251
                ops.append((p, b, nbytes, 1))
            for s in srcs:
                b = mem.alloc(nbytes)
                bufs[(r, s)] = b
                ops.append((s, b, nbytes, 0))
            progs.append(rk.b.p2p(ops))
        for seed in range(3):
            run_programs(mem, kern, progs, np.uint8, seed)
            for (r, s), b in bufs.items():
                want = ((np.arange(nbytes) * (s + 1) + r) % 251).astype(np.uint8)
                np.testing.assert_array_equal(mem.view(b, nbytes), want, err_msg=f"{pattern} {s}->{r}")


def test_release_after_abort_lets_every_program_finish_without_writing():
    """A peer that never runs its program (dead): the others' streams stall in a wait. Once the error word
    is set and the waits are released again and again (the watchdog's drain), every program runs to its end,
    the calls queued behind pass too, and no kernel writes an output."""
    mem = Memory(16 << 20)
    n = 3
    ranks, kern, lay = make_ranks(mem, n, 256 << 10)
    progs, outs = [], []
    for rk in ranks[:2]:
        one = rk.b.one_pass(0, "reduce", 8, 0, 300000, 0, 0, -1)  # two rounds
        send, recv = mem.alloc(300000), mem.alloc(300000)
        mem.view(recv, 300000)[:] = 7
        one.bind(send, recv, 1)
        seq = gpu_sync.Program()
        seq.steps = one.steps * 3  # three calls queued on the stream
        progs.append(seq)
        outs.append(recv)
    stalls = []

    def drain():
        for rk in ranks[:2]:
            mem.view(rk.eng.args.err, 4).view(np.uint32)[0] = 2
            rk.words.release_all()
        stalls.append(1)
        return len(stalls) < 100

    log = run_programs(mem, kern, progs, np.float32, 1, on_deadlock=drain)
    assert 0 < len(stalls) < 100
    assert not [e for e in log if e[0] == "r"], "a kernel read a region after the abort"
    for recv in outs:
        assert (mem.view(recv, 300000) == 7).all(), "an output was written after the abort"


def test_wanted_follows_the_setting_and_the_sharing(monkeypatch):
    monkeypatch.setenv("HPCCL_CUDA_SYNC", "auto")
    assert gpu_sync.wanted(1, False, mps=False) == (False, "the GPU is this rank's alone")
    assert gpu_sync.wanted(2, False, mps=False)[0]
    assert gpu_sync.wanted(1, False, mps=True) == (True, "CUDA MPS is running")
    assert gpu_sync.wanted(1, True, mps=False)[0]
    monkeypatch.setenv("HPCCL_CUDA_SYNC", "spin")
    assert not gpu_sync.wanted(4, True, mps=True)[0]
    monkeypatch.setenv("HPCCL_CUDA_SYNC", "stream")
    assert gpu_sync.wanted(1, False, mps=False)[0]


def test_memop_struct_matches_the_driver():
    """CUstreamBatchMemOpParams is a 48-byte union: operation at 0, address at 8, value at 16, flags at 24."""
    assert ctypes.sizeof(gpu_sync.MemOp) == 48
    assert gpu_sync.MemOp.address.offset == 8 and gpu_sync.MemOp.value.offset == 16
    assert gpu_sync.MemOp.flags.offset == 24
    assert ctypes.sizeof(SafeArgs) == 336


_P, _U = ctypes.c_void_p, ctypes.c_uint
# the driver entry points the compiled runner calls, as ctypes callbacks (stand-ins record the calls)
LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, _P, _U, _U, _U, _U, _U, _U, _U, _P, _P, _P)
BATCH = ctypes.CFUNCTYPE(ctypes.c_int, _P, _U, _P, _U)
CAPT = ctypes.CFUNCTYPE(ctypes.c_int, _P, ctypes.POINTER(ctypes.c_int))
REC = ctypes.CFUNCTYPE(ctypes.c_int, _P, _P)


def test_compiled_runner_issues_every_step_in_order():
    """hpccl/csrc/_hotpath.c gpu_program: the program's launches and batches in order on the stream, then the tail
    event; capture leaves the event out; a failing step stops the rest and says which step."""
    from hpccl.host import hotpath
    if not hotpath.available():
        pytest.skip("the compiled hot path is not built here (no C compiler at install)")
    run = hotpath._hotpath.gpu_program
    calls = []
    fail_at = [-1]
    capturing = [0]

    def launch(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        calls.append(("k", f, gx, bx, stream, params))
        return 700 if len(calls) - 1 == fail_at[0] else 0

    def batch(stream, count, arr, flags):
        calls.append(("m", count, arr, stream))
        return 1 if len(calls) - 1 == fail_at[0] else 0

    def capt(stream, out):
        out[0] = capturing[0]
        return 0

    def rec(ev, stream):
        calls.append(("e", ev, stream))
        return 0

    fl, fb, fc, fr = LAUNCH(launch), BATCH(batch), CAPT(capt), REC(rec)
    addr = [ctypes.cast(f, ctypes.c_void_p).value for f in (fl, fc, fr, fb)]
    mem = Memory(16 << 20)
    ranks, kern, lay = make_ranks(mem, 2, 256 << 10)
    prog = ranks[0].b.one_pass(0, "reduce", 8, 0, 4096, 0, 0, -1)
    n = len(prog.steps)
    assert run(*addr, prog.packed(), n, 77, 99) == (0, n)
    kinds = ["m" if isinstance(s, gpu_sync.Batch) else "k" for s in prog.steps]
    assert [c[0] for c in calls] == kinds + ["e"]
    for c, s in zip(calls, prog.steps):
        if c[0] == "k":
            assert (c[1], c[2], c[3], c[5]) == (s.fi, s.grid, s.block, s.pi) and c[4] == 77
        else:
            assert (c[1], c[2], c[3]) == (s.count, ctypes.addressof(s.arr), 77)
    assert calls[-1] == ("e", 99, 77)
    calls.clear()
    capturing[0] = 1
    assert run(*addr, prog.packed(), n, 77, 99) == (-1, n) and calls[-1][0] != "e"
    calls.clear()
    capturing[0], fail_at[0] = 0, 2
    rc, done = run(*addr, prog.packed(), n, 77, 99)
    assert rc != 0 and done == 2 and len(calls) == 3


def test_a_clone_replays_through_the_runners_c_entry_with_its_own_buffers():
    """What torch's compiled backend replays for a stream-synchronised call (hpccl/torch/_native.cpp): a
    Clone of the program bound to that call's buffers, run through program_entry()'s C function. Its launches
    carry argument structs of its own (the call's buffers, the rest as built), its batches are the program's,
    and binding the program to another call's buffers afterwards changes nothing of the clone's."""
    from hpccl.host import hotpath
    if not hotpath.available():
        pytest.skip("the compiled hot path is not built here (no C compiler at install)")
    calls = []

    def launch(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        a = ctypes.cast(ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))[0], ctypes.POINTER(SafeArgs))[0]
        calls.append(("k", f, gx, bx, stream, a.c.send, a.c.recv, a.c.aligned, a.c.nbytes, a.off, a.par))
        return 0

    def batch(stream, count, arr, flags):
        calls.append(("m", count, arr, stream))
        return 0

    fns = (LAUNCH(launch), CAPT(lambda st, out: out.__setitem__(0, 0) or 0), REC(lambda ev, st: 0),
           BATCH(batch))
    addr = [ctypes.cast(f, ctypes.c_void_p).value for f in fns]
    RUN = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_uint64] * 8, ctypes.POINTER(ctypes.c_uint64))
    run = RUN(hotpath._hotpath.program_entry())
    mem = Memory(16 << 20)
    ranks, kern, lay = make_ranks(mem, 3, 64 << 10)
    prog = ranks[1].b.one_pass(0, "all_reduce", 8, 0, 200000, 0, 0, -1)
    a_send, a_recv, b_send, b_recv = 1 << 40, 2 << 40, 3 << 40, 4 << 40
    prog.bind(a_send, a_recv, 1)
    clone = prog.clone(b_send, b_recv, 0)
    prog.bind(5 << 40, 6 << 40, 1)  # another call's buffers, after the clone was made
    done = ctypes.c_uint64(0)
    assert run(*addr, clone.addr, clone.count, 77, 99, ctypes.byref(done)) == 0 and done.value == clone.count
    steps = prog.steps
    assert clone.count == len(steps) and len(calls) == len(steps)
    for c, st in zip(calls, steps):
        if isinstance(st, gpu_sync.Batch):
            assert c == ("m", st.count, ctypes.addressof(st.arr), 77)
            continue
        orig = st._keep[0]
        assert c[0] == "k" and (c[1], c[2], c[3], c[4]) == (st.fi, st.grid, st.block, 77)
        assert (c[8], c[9], c[10]) == (orig.c.nbytes, orig.off, orig.par)  # the rest as built
        if any(orig is a for a in prog.args):
            assert (c[5], c[6], c[7]) == (b_send, b_recv, 0)
            assert (orig.c.send, orig.c.recv) == (5 << 40, 6 << 40)  # the program's own args: untouched
    assert any(isinstance(st, gpu_sync.Batch) for st in steps) and any(c[0] == "k" and c[5] == b_send for c in calls)


@pytest.mark.parametrize("coll", ["all_reduce", "all_gather"])
def test_a_peer_whose_error_word_is_set_is_never_read_as_data(coll):
    """Issue 32's wrong result (GPU buffers, 3 nodes x 2, a rank killed): a rank whose network step failed
    has its error word set (by the engine) before its node step; its kernels then write nothing, but its
    stream still signals "ready". Its local peers must not take that for data: their kernels see its word,
    write nothing either, and set their own word to ERR_PEER + its rank, so their hosts raise. Under every
    interleaving no survivor's output changes and no region of the failed rank is read."""
    mem = Memory(16 << 20)
    n = 3
    ranks, kern, lay = make_ranks(mem, n, 256 << 10)
    for seed in range(4):
        for rk in ranks:  # a fresh start: words at rest, error words clear
            rk.words.host[rk.words.rank][gpu_sync.W_BUSY] = 0
            mem.view(rk.eng.args.err, 4).view(np.uint32)[0] = 0
        progs, outs = [], []
        for r, rk in enumerate(ranks):
            nb = 4000
            prog = (rk.b.one_pass(0, "reduce", 8, 0, nb, 0, 0, -1) if coll == "all_reduce"
                    else rk.b.one_pass(0, "copy", None, None, nb, 0, nb, -1))
            send, recv = mem.alloc(nb), mem.alloc(nb * n)
            mem.view(send, nb)[:] = r + 1
            mem.view(recv, nb * n)[:] = 0xEE
            prog.bind(send, recv, 1)
            progs.append(prog)
            outs.append((recv, nb * n))
        failed = seed % n
        mem.view(ranks[failed].eng.args.err, 4).view(np.uint32)[0] = gpu_sync.ERR_NET
        log = run_programs(mem, kern, progs, np.float32, seed)
        assert not any(kind == "r" and src == failed for kind, _d, _p, src in log), "a failed rank's region was read"
        for r in range(n):
            assert (mem.view(*outs[r]) == 0xEE).all(), f"rank {r}'s output was written"
            word = mem.view(ranks[r].eng.args.err, 4).view(np.uint32)[0]
            assert word == (gpu_sync.ERR_NET if r == failed else gpu_sync.ERR_PEER + failed), (r, word)
        for rk in ranks:  # the watchdog's release after an error: every wait satisfied again for the next seed
            rk.words.release_all()
            w = rk.words.host[rk.words.rank]
            for d in range(n):
                for p in (0, 1):
                    w[gpu_sync.W_RDY + 2 * d + p], w[gpu_sync.W_FREE + 2 * d + p] = 0, 1
