"""comm.alloc_host / free_host (hpccl/host/host_alloc.py), run inside each rank under mpiexec: buffers every local
peer maps, which the hot path's direct calls copy and reduce through with memcpy instead of process_vm_*.
Every collective on them is right (any root, in place and out of place, mixed with private buffers), the
moves really go through the mappings, bad arguments are refused on every rank before anything is made, and
no name is left in /dev/shm."""
from __future__ import annotations

import os

import numpy as np
import pytest
from common import close, data, reduce_ref

import hpccl
from hpccl import config
from hpccl.ops import SUM


@pytest.fixture(scope="module")
def comm():
    c = hpccl.init()
    yield c
    c.destroy()


def _maps(comm) -> bool:
    """Whether this run's direct calls can go through the mappings (one node, single-copy agreed)."""
    return comm.num_nodes == 1 and comm.size > 1 and comm._prim.single_copy and hasattr(comm._hot, "map")


def _names(comm) -> list:
    """alloc_host names left in /dev/shm, listed while no rank is inside an alloc_host (barriers around)."""
    comm.barrier()
    names = [f for f in os.listdir("/dev/shm") if f.startswith(f"hpccl-{os.getuid()}-h")]
    comm.barrier()
    return names


def test_collectives_on_alloc_host_buffers(comm):
    """Sizes from the direct threshold up with odd tails; every collective on alloc_host buffers, every root
    for broadcast and reduce, in place and out of place; every result checked against numpy, the inputs
    unchanged, and (where the direct path maps) bytes moved through the mappings."""
    n, r = comm.size, comm.rank
    u8, f64 = np.dtype(np.uint8), np.dtype(np.float64)
    direct = config.get("HPCCL_HOT_DIRECT_SIZE")
    before = comm._hot.mapped_bytes if _maps(comm) else 0
    for i, per in enumerate([16 * direct + 8 * n, 3 * (64 << 10) + 40 * n]):
        per -= per % (8 * n)
        ins = [data(per, u8, q, i) for q in range(n)]
        send = comm.alloc_host(per, u8)
        send[:] = ins[r]
        out = comm.alloc_host((n, per), u8)
        comm.all_gather(send, out)
        assert np.array_equal(out.reshape(-1), np.concatenate(ins)), (per, "all_gather")
        out[r] = ins[r]
        comm.all_gather(out[r], out)
        assert np.array_equal(out.reshape(-1), np.concatenate(ins)), (per, "all_gather in place")
        a2a = comm.alloc_host(per, u8)
        comm.all_to_all(send, a2a)
        blk = per // n
        assert np.array_equal(a2a, np.concatenate([ins[q][r * blk:(r + 1) * blk] for q in range(n)])), \
            (per, "all_to_all")
        assert np.array_equal(send, ins[r]), (per, "an input changed")
        for root in range(n):
            bc = comm.alloc_host(per, u8)
            bc[:] = ins[root] if r == root else 0
            comm.broadcast(bc, root)
            assert np.array_equal(bc, ins[root]), (per, root, "broadcast in place")
            comm.broadcast(send, root, recvbuf=bc)
            assert np.array_equal(bc, ins[root]), (per, root, "broadcast out of place")
            comm.free_host(bc)
        count = per // 8
        full = [data(count, f64, q, i) for q in range(n)]
        x = comm.alloc_host(count, f64)
        x[:] = full[r]
        c = count // n
        for op in (SUM, hpccl.AVG):
            want = reduce_ref(full, op)
            rs = comm.alloc_host(c, f64)
            comm.reduce_scatter(x, rs, op=op)
            assert close(rs, want[r * c:(r + 1) * c], op), (per, op, "reduce_scatter")
            ar = comm.alloc_host(count, f64)
            comm.all_reduce(x, ar, op=op)
            assert close(ar, want, op), (per, op, "all_reduce")
            for root in range(n):
                comm.reduce(x, ar, root, op=op)
                assert r != root or close(ar, want, op), (per, op, root, "reduce")
            comm.free_host(rs)
            comm.free_host(ar)
        y = x.copy()
        comm.all_reduce(x)
        assert close(x, reduce_ref(full, SUM), SUM) and (n == 1 or not np.array_equal(x, y)), (per, "in place")
        for b in (send, out, a2a, x):
            comm.free_host(b)
    if _maps(comm):
        assert comm._hot.mapped_bytes > before, "no direct call went through the mappings"
    assert _names(comm) == []


def test_mixed_with_private_buffers(comm):
    """One rank's buffers from alloc_host, the others' from its heap (and the output private while the
    input is shared): the direct path mixes memcpy through mappings with cross-process reads, still right."""
    n, r = comm.size, comm.rank
    per = 16 * config.get("HPCCL_HOT_DIRECT_SIZE") + 8 * n
    per -= per % n
    u8 = np.dtype(np.uint8)
    ins = [data(per, u8, q, 7) for q in range(n)]
    shared = comm.alloc_host(per, u8)
    send = shared if r % 2 == 0 else np.empty(per, u8)
    send[:] = ins[r]
    out = np.full(n * per, 3, u8)
    comm.all_gather(send, out)
    assert np.array_equal(out, np.concatenate(ins))
    for root in range(n):
        got = np.zeros(per, u8)
        comm.broadcast(send, root, recvbuf=got)
        assert np.array_equal(got, ins[root]), root
    comm.free_host(shared)


def test_each_rank_its_own_shape_and_the_array_outlives_free(comm):
    """alloc_host is collective but each rank may ask for its own shape and dtype (a zero-size one too); an
    array stays readable and writable after free_host and after the mappings are gone."""
    r = comm.rank
    a = comm.alloc_host((r + 1, 3), np.int16)
    assert a.shape == (r + 1, 3) and a.dtype == np.int16 and a.flags.c_contiguous and a.flags.writeable
    assert a.ctypes.data % 4096 == 0
    z = comm.alloc_host(0, np.float32)
    assert z.size == 0
    a[:] = 5
    comm.free_host(a)
    comm.free_host(z)
    a += 1
    assert (a == 6).all()


def test_bad_arguments_are_refused_everywhere(comm):
    """A bad shape or dtype is named before any collective step; a buffer that is not from alloc_host on any
    rank is refused on every rank (naming them), and nothing is unmapped: the real buffer frees after."""
    with pytest.raises(hpccl.HpcclInvalidArgument, match="shape"):
        comm.alloc_host((4, -1))
    with pytest.raises(hpccl.HpcclInvalidArgument, match="shape"):
        comm.alloc_host("many")
    with pytest.raises(hpccl.HpcclInvalidArgument, match="dtype"):
        comm.alloc_host(4, object)
    buf = comm.alloc_host(1 << 16, np.uint8)
    mine = np.empty(16, np.uint8)
    wrong = mine if comm.rank == comm.size - 1 else buf
    with pytest.raises(hpccl.HpcclInvalidArgument, match=rf"buf.*ranks \[{comm.size - 1}\]"):
        comm.free_host(wrong)
    buf[:] = comm.rank
    out = np.empty(comm.size * buf.size, np.uint8)
    comm.all_gather(buf, out)
    assert (out.reshape(comm.size, -1) == np.arange(comm.size)[:, None]).all()
    comm.free_host(buf)
    with pytest.raises(hpccl.HpcclInvalidArgument, match="buf"):
        comm.free_host(buf)  # twice: no longer ours
    assert _names(comm) == []


def test_mappings_follow_alloc_and_free(comm):
    """The hot path maps each local peer's segment at alloc_host and drops it at free_host: unmap of a freed
    segment finds nothing."""
    if not _maps(comm):
        pytest.skip("no node hot path that maps here (several nodes, one rank, or single-copy reads off)")
    buf = comm.alloc_host(4096, np.uint8)
    addrs = comm._boot.allgather(buf.ctypes.data)
    comm.free_host(buf)
    assert not any(comm._hot.unmap(q, a) for q, a in enumerate(addrs)), "a mapping outlived free_host"
