"""Every collective x dtype x op x algorithm against numpy, run inside each rank under mpiexec."""
from __future__ import annotations

import array

import numpy as np
import pytest
from common import ALL_DTYPES, algorithms, close, data, reduce_ref, valid_ops

import hpccl
from hpccl import config

SIZES = [1, 7, 1001]


@pytest.fixture(scope="module")
def comm():
    c = hpccl.init()
    yield c
    c.destroy()


def _sizes(comm):
    """Small sizes plus one that crosses the slot / window-half boundaries of this run's buffers."""
    edge = config.get("HPCCL_SHM_SLOT_SIZE") * 2 + 5
    return SIZES + [edge // 8 + 3]


def test_all_reduce_every_dtype_op_algorithm(comm):
    n, r = comm.size, comm.rank
    for algo in algorithms(comm, "all_reduce"):
        comm._planner.force("all_reduce", algo)
        for dtype in ALL_DTYPES:
            for op in valid_ops(dtype):
                for i, count in enumerate(_sizes(comm)):
                    x = data(count, dtype, r, i, op)
                    want = reduce_ref([data(count, dtype, q, i, op) for q in range(n)], op)
                    if i % 2:  # in place
                        got = comm.all_reduce(x, op=op)
                        assert got is x
                    else:
                        got = comm.all_reduce(x, np.empty_like(x), op=op)
                        assert np.array_equal(x, data(count, dtype, r, i, op)), "sendbuf changed"
                    assert close(got, want, op), (algo, dtype, op, count)
    comm._planner.force("all_reduce", None)


def test_reduce_every_root(comm):
    n, r = comm.size, comm.rank
    for algo in algorithms(comm, "reduce"):
        comm._planner.force("reduce", algo)
        for dtype in ALL_DTYPES:
            for op in valid_ops(dtype):
                for root in range(n):
                    count = 1 + 37 * root
                    x = data(count, dtype, r, root, op)
                    out = np.full_like(x, 3)
                    comm.reduce(x, out, root=root, op=op)
                    if r == root:
                        want = reduce_ref([data(count, dtype, q, root, op) for q in range(n)], op)
                        assert close(out, want, op), (algo, dtype, op, root)
                    else:
                        assert np.all(out == 3), "a non-root's recvbuf was written"
    comm._planner.force("reduce", None)


def test_broadcast(comm):
    n, r = comm.size, comm.rank
    for algo in algorithms(comm, "broadcast"):
        comm._planner.force("broadcast", algo)
        for dtype in ALL_DTYPES:
            for i, count in enumerate(_sizes(comm)):
                root = (i + 1) % n
                x = data(count, dtype, r, i)
                comm.broadcast(x, root=root)
                assert np.array_equal(x, data(count, dtype, root, i)), (algo, dtype, count)
                # out of place
                out = np.zeros_like(x)
                comm.broadcast(data(count, dtype, r, i), root=root, recvbuf=out)
                assert np.array_equal(out, data(count, dtype, root, i)), (algo, dtype, count, "oop")
    comm._planner.force("broadcast", None)


def test_all_gather(comm):
    n, r = comm.size, comm.rank
    for algo in algorithms(comm, "all_gather"):
        comm._planner.force("all_gather", algo)
        for dtype in ALL_DTYPES:
            for i, count in enumerate(_sizes(comm)):
                want = np.concatenate([data(count, dtype, q, i) for q in range(n)])
                got = comm.all_gather(data(count, dtype, r, i))
                assert got.shape == (n, count)
                assert np.array_equal(got.reshape(-1), want), (algo, dtype, count)
                inplace = np.zeros(n * count, dtype)
                inplace[r * count:(r + 1) * count] = data(count, dtype, r, i)
                comm.all_gather(inplace[r * count:(r + 1) * count], inplace)
                assert np.array_equal(inplace, want), (algo, dtype, count, "in place")
    comm._planner.force("all_gather", None)


def test_reduce_scatter(comm):
    n, r = comm.size, comm.rank
    for algo in algorithms(comm, "reduce_scatter"):
        comm._planner.force("reduce_scatter", algo)
        for dtype in ALL_DTYPES:
            for op in valid_ops(dtype):
                for i, count in enumerate(_sizes(comm)):
                    x = data(n * count, dtype, r, i, op)
                    full = reduce_ref([data(n * count, dtype, q, i, op) for q in range(n)], op)
                    got = comm.reduce_scatter(x, op=op)
                    assert close(got, full[r * count:(r + 1) * count], op), (algo, dtype, op, count)
                    # in place: the result lands in this rank's block of sendbuf
                    comm.reduce_scatter(x, x[r * count:(r + 1) * count], op=op)
                    assert close(x[r * count:(r + 1) * count], full[r * count:(r + 1) * count], op)
    comm._planner.force("reduce_scatter", None)


def test_all_to_all(comm):
    n, r = comm.size, comm.rank
    for algo in algorithms(comm, "all_to_all"):
        comm._planner.force("all_to_all", algo)
        for dtype in ALL_DTYPES:
            for i, count in enumerate(_sizes(comm)):
                x = data(n * count, dtype, r, i)
                want = np.concatenate([data(n * count, dtype, q, i)[r * count:(r + 1) * count]
                                       for q in range(n)])
                got = comm.all_to_all(x)
                assert np.array_equal(got, want), (algo, dtype, count)
                comm.all_to_all(x, x)  # in place
                assert np.array_equal(x, want), (algo, dtype, count, "in place")
    comm._planner.force("all_to_all", None)


def _vcounts(a: int, b: int, n: int):
    """How many elements rank a sends rank b: uneven, with zeros (a rank sends some peers nothing)."""
    return 0 if (a + 2 * b) % 3 == 0 else (a * 7 + b * 3) % 5 + 1


def test_all_to_all_v(comm):
    n, r = comm.size, comm.rank
    for dtype in ALL_DTYPES:
        for scale in (1, 997):  # tiny blocks, and blocks that span several shared-memory slots
            sc = [_vcounts(r, j, n) * scale for j in range(n)]
            rc = [_vcounts(j, r, n) * scale for j in range(n)]
            x = data(sum(sc), dtype, r, scale)
            out = np.full(sum(rc), 7, dtype)
            comm.all_to_all_v(x, out, sc, rc)
            want = []
            for q in range(n):  # rank q's block for this rank, at its packed offset
                qc = [_vcounts(q, j, n) * scale for j in range(n)]
                xq = data(sum(qc), dtype, q, scale)
                want.append(xq[sum(qc[:r]):sum(qc[:r + 1])])
            assert np.array_equal(out, np.concatenate(want)), (dtype, scale)
    # explicit displacements: blocks laid out in reverse rank order with gaps, the gaps left untouched
    sc = [_vcounts(r, j, n) for j in range(n)]
    rc = [_vcounts(j, r, n) for j in range(n)]
    rd, pos = [0] * n, 0
    for j in reversed(range(n)):
        rd[j], pos = pos + 1, pos + 1 + rc[j]
    x = np.arange(sum(sc), dtype=np.int64) + 1000 * r
    out = np.full(pos + 1, -1, np.int64)
    comm.all_to_all_v(x, out, sc, rc, rdispls=rd)
    for j in range(n):
        jc = [_vcounts(j, k, n) for k in range(n)]
        assert np.array_equal(out[rd[j]:rd[j] + rc[j]], np.arange(sum(jc[:r]), sum(jc[:r + 1])) + 1000 * j)
    holes = np.ones(out.size, bool)
    for j in range(n):
        holes[rd[j]:rd[j] + rc[j]] = False
    assert np.all(out[holes] == -1)
    # inside a group, beside a collective
    y = np.full(3, r, np.float64)
    out2 = np.empty(sum(rc), np.float64)
    with comm.group():
        comm.all_reduce(y)
        comm.all_to_all_v(x.astype(np.float64), out2, sc, rc)
    assert np.all(y == n * (n - 1) / 2)
    assert np.array_equal(out2, np.concatenate([
        (np.arange(sum(sc2 := [_vcounts(j, k, n) for k in range(n)])) + 1000 * j)[sum(sc2[:r]):sum(sc2[:r + 1])]
        for j in range(n)]).astype(np.float64))


def test_zero_sized(comm):
    z = np.zeros(0, np.float32)
    assert comm.all_reduce(z).size == 0
    assert comm.all_gather(z).size == 0
    assert comm.reduce_scatter(z).size == 0
    assert comm.broadcast(z).size == 0
    assert comm.all_to_all(z).size == 0
    comm.reduce(z)


def test_send_recv_ring_in_group(comm):
    n, r = comm.size, comm.rank
    big = (3 << 20) // 4 + 5  # several slots: blocking sends around a ring would deadlock without group
    out = np.empty(big, np.float32)
    with comm.group():
        comm.send(data(big, np.dtype(np.float32), r), (r + 1) % n)
        comm.recv(out, (r - 1) % n)
    assert np.array_equal(out, data(big, np.dtype(np.float32), (r - 1) % n))


def test_send_recv_pairs_in_order(comm):
    n, r = comm.size, comm.rank
    if n == 1:
        pytest.skip("needs 2 ranks: point-to-point between distinct ranks (the 2-4 rank runs cover it)")
    if r % 2 == 0 and r + 1 < n:
        comm.send(np.arange(10, dtype=np.int64), r + 1)
        comm.send(np.arange(10, 20, dtype=np.int64), r + 1)
    elif r % 2 == 1:
        a, b = np.empty(10, np.int64), np.empty(10, np.int64)
        comm.recv(a, r - 1)
        comm.recv(b, r - 1)
        assert a.tolist() == list(range(10)) and b.tolist() == list(range(10, 20))


def test_recv_from_any_source(comm):
    """Rank 0 receives every peer's two messages from any source, at a size of several shm slots and a
    small one: right sender, each sender's messages in order, then a collective still matches."""
    n, r = comm.size, comm.rank
    if n == 1:
        with pytest.raises(hpccl.HpcclInvalidUsage, match="one rank"):
            comm.recv_any(np.empty(4, np.int64))
        return
    for size in ((3 << 20) // 8 + 3, 7):
        if r == 0:
            seen = []
            for _ in range(2 * (n - 1)):
                out = np.empty(size, np.int64)
                src = comm.recv_any(out)
                k = seen.count(src)
                assert 0 < src < n and np.array_equal(out, np.arange(size, dtype=np.int64) + 1000 * src + k)
                seen.append(src)
            assert sorted(seen) == sorted(list(range(1, n)) * 2), seen
        else:
            for k in range(2):
                comm.send(np.arange(size, dtype=np.int64) + 1000 * r + k, 0)
        x = np.full(3, r, np.int64)
        comm.all_reduce(x)
        assert x.tolist() == [n * (n - 1) // 2] * 3


def test_group_with_collective_and_self_send(comm):
    r = comm.size, comm.rank
    x = np.full(5, comm.rank, np.int32)
    me = np.empty(5, np.int32)
    with comm.group():
        comm.send(np.arange(5, dtype=np.int32), comm.rank)
        comm.recv(me, comm.rank)
        comm.all_reduce(x)
    assert me.tolist() == list(range(5))
    assert x.tolist() == [sum(range(comm.size))] * 5, r


def test_buffer_protocol_objects(comm):
    n = comm.size
    a = array.array("d", [1.0, 2.0, 3.0])
    comm.all_reduce(a)
    assert list(a) == [n * 1.0, n * 2.0, n * 3.0]
    b = bytearray([1, 2, 3])
    comm.all_reduce(b, op="max")
    assert list(b) == [1, 2, 3]
    m = np.arange(12, dtype=np.float32).reshape(3, 4)
    comm.all_reduce(m)
    assert np.array_equal(m, np.arange(12, dtype=np.float32).reshape(3, 4) * n)


def test_random_floats_within_rounding(comm):
    n, r = comm.size, comm.rank
    for algo in algorithms(comm, "all_reduce"):
        comm._planner.force("all_reduce", algo)
        for dtype in (np.float32, np.float64):
            x = np.random.default_rng(r).standard_normal(4099).astype(dtype)
            want = sum(np.random.default_rng(q).standard_normal(4099).astype(np.float64) for q in range(n))
            got = comm.all_reduce(x)
            assert np.allclose(got, want, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-5)
            # every rank must hold identical bits
            first = comm.broadcast(got.copy(), root=0)
            assert np.array_equal(first, got), algo
    comm._planner.force("all_reduce", None)


def test_torch_cpu_tensors(comm):
    torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
    n = comm.size
    t = torch.arange(6, dtype=torch.bfloat16)
    comm.all_reduce(t)
    assert torch.equal(t, torch.arange(6, dtype=torch.bfloat16) * n)
    f = torch.ones(4)
    out = torch.empty(4 * n)
    comm.all_gather(f, out)
    assert torch.equal(out, torch.ones(4 * n))


def test_barrier(comm):
    """No rank leaves a barrier before the last one entered it (one machine: one clock for all ranks)."""
    import time
    for _ in range(20):
        comm.barrier()
    for late in range(min(comm.size, 3)):
        if comm.rank == late:
            time.sleep(0.2)
        entered = time.time()
        comm.barrier()
        left = time.time()
        times = comm.all_gather(np.array([entered, left]))
        assert times[:, 1].min() >= times[:, 0].max(), (late, times)  # shape (size, 2)


def test_transport_choice_follows_configuration(comm):
    """HPCCL_TRANSPORT=mpi keeps every peer on MPI (even with the network engine built); one node otherwise uses
    shared memory; several nodes use the network transport for ranks of other nodes."""
    from hpccl.transport.mpi import MpiTransport
    from hpccl.transport.shm import ShmTransport
    kinds = {type(t) for t in comm._prim._transport_of.values() if t is not None}
    if config.get("HPCCL_TRANSPORT") == "mpi" and comm.size > 1:
        assert kinds == {MpiTransport} and comm._path == "mpi"
    elif comm.num_nodes == 1 and comm.size > 1:
        assert kinds == {ShmTransport} and comm._path == "shm"
    elif comm.num_nodes > 1:
        assert comm._path in ("mpi", "ucx")
        assert any(not isinstance(t, ShmTransport) for t in comm._prim._transport_of.values())
