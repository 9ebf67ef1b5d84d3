"""Bad input: a clear error naming the argument, raised before any data moves, buffers untouched,
and the communicator still usable afterwards."""
from __future__ import annotations

import numpy as np
import pytest

import hpccl
from hpccl import HpcclInvalidArgument, HpcclInvalidUsage


@pytest.fixture(scope="module")
def comm():
    c = hpccl.init()
    yield c
    c.destroy()


def _arg(exc_info) -> str:
    return exc_info.value.argument


def test_avg_on_integers_is_refused(comm):
    x = np.arange(5, dtype=np.int32)
    with pytest.raises(HpcclInvalidArgument) as e:
        comm.all_reduce(x, op="avg")
    assert _arg(e) == "op" and "avg" in str(e.value)
    assert x.tolist() == list(range(5))


def test_unknown_op_and_dtype(comm):
    with pytest.raises(HpcclInvalidArgument) as e:
        comm.all_reduce(np.ones(3), op="xor")
    assert _arg(e) == "op"
    with pytest.raises(HpcclInvalidArgument) as e:
        comm.all_reduce(np.ones(3, np.complex64))
    assert _arg(e) == "sendbuf" and "complex64" in str(e.value)
    with pytest.raises(HpcclInvalidArgument) as e:
        comm.all_reduce(object())
    assert _arg(e) == "sendbuf"


def test_output_must_be_contiguous_and_writable(comm):
    out = np.zeros(20)[::2]
    with pytest.raises(HpcclInvalidArgument) as e:
        comm.all_reduce(np.ones(10), out)
    assert _arg(e) == "recvbuf" and "contiguous" in str(e.value)
    ro = np.zeros(10)
    ro.flags.writeable = False
    with pytest.raises(HpcclInvalidArgument) as e:
        comm.all_reduce(np.ones(10), ro)
    assert _arg(e) == "recvbuf" and "read-only" in str(e.value)
    with pytest.raises(HpcclInvalidArgument) as e:
        comm.all_reduce(ro)  # in place into a read-only buffer
    assert _arg(e) == "sendbuf"
    with pytest.raises(HpcclInvalidArgument) as e:
        comm.all_reduce(b"abc")
    assert _arg(e) == "sendbuf"
    assert np.all(out == 0) and np.all(ro == 0)


def test_size_and_dtype_mismatch(comm):
    out = np.full(9, 7.0)
    with pytest.raises(HpcclInvalidArgument) as e:
        comm.all_reduce(np.ones(10), out)
    assert _arg(e) == "recvbuf" and "needs 10" in str(e.value)
    with pytest.raises(HpcclInvalidArgument) as e:
        comm.all_reduce(np.ones(9, np.float32), out)
    assert _arg(e) == "recvbuf" and "dtype" in str(e.value)
    with pytest.raises(HpcclInvalidArgument) as e:
        comm.all_gather(np.ones(3), np.empty(3 * comm.size + 1))
    assert _arg(e) == "recvbuf"
    if comm.size > 1:  # every count is a multiple of 1 rank
        with pytest.raises(HpcclInvalidArgument) as e:
            comm.reduce_scatter(np.ones(comm.size * 2 + 1))
        assert _arg(e) == "sendbuf" and "multiple" in str(e.value)
    assert np.all(out == 7.0)


def test_all_to_all_not_divisible(comm):
    if comm.size == 1:
        pytest.skip("any count divides by 1 rank; the 2-4 rank runs check the refusal")
    with pytest.raises(HpcclInvalidArgument):
        comm.all_to_all(np.ones(comm.size + 1))


def test_all_to_all_v_bad_counts(comm):
    """Every locally visible mistake names its argument before anything is sent (the next call still works)."""
    n, r = comm.size, comm.rank
    x, out = np.arange(2 * n, dtype=np.float32), np.zeros(2 * n, np.float32)
    cases = [
        (dict(sendcounts=[2] * (n + 1), recvcounts=[2] * n), "sendcounts"),
        (dict(sendcounts=[2] * n, recvcounts=[-1] + [2] * (n - 1)), "recvcounts"),
        (dict(sendcounts=[3] * n, recvcounts=[2] * n), "sendcounts"),  # past the end of sendbuf
        (dict(sendcounts=[2] * n, recvcounts=[2] * n, rdispls=[0] * n), "rdispls" if n > 1 else None),
        (dict(sendcounts=[2] * n, recvcounts=[2] * n, sdispls=[2 * n - 1] * n), "sdispls"),
        (dict(sendcounts=["a"] * n, recvcounts=[2] * n), "sendcounts"),
        (dict(sendcounts=[2] * n, recvcounts=[2 if j != r else 1 for j in range(n)]), "recvcounts"),
    ]
    for kw, arg in cases:
        if arg is None:
            continue
        with pytest.raises(HpcclInvalidArgument) as e:
            comm.all_to_all_v(x, out, **kw)
        assert _arg(e) == arg, (kw, str(e.value))
    with pytest.raises(HpcclInvalidArgument) as e:
        comm.all_to_all_v(x, np.zeros(2 * n, np.float64), [2] * n, [2] * n)
    assert _arg(e) == "recvbuf"
    assert np.all(out == 0)  # nothing was written
    comm.all_to_all_v(x, out, [2] * n, [2] * n)
    assert np.array_equal(out, np.concatenate([np.arange(2 * r, 2 * r + 2, dtype=np.float32)] * n))


def test_root_and_peer_out_of_range(comm):
    for bad in (-1, comm.size, 1.5, True, "0"):
        with pytest.raises(HpcclInvalidArgument) as e:
            comm.broadcast(np.ones(3), root=bad)
        assert _arg(e) == "root"
        with pytest.raises(HpcclInvalidArgument) as e:
            comm.reduce(np.ones(3), root=bad)
        assert _arg(e) == "root"
        with pytest.raises(HpcclInvalidArgument) as e:
            comm.send(np.ones(3), bad)
        assert _arg(e) == "peer"
        with pytest.raises(HpcclInvalidArgument) as e:
            comm.recv(np.ones(3), bad)
        assert _arg(e) == "peer"


def test_recv_any_bad_use(comm):
    """Receive from any source: refused inside group() (its sender is known only when it runs) and into a
    read-only buffer, before anything is received; the GPU refusal is in tests/gpu (no GPU needed here)."""
    with pytest.raises(hpccl.HpcclInvalidUsage, match="group"):
        with comm.group():
            comm.recv_any(np.empty(3))
    ro = np.zeros(3)
    ro.flags.writeable = False
    with pytest.raises(HpcclInvalidArgument) as e:
        comm.recv_any(ro)
    assert _arg(e) == "buf"


def test_register_takes_gpu_buffers_only(comm):
    """comm.register of host memory is refused, naming the argument, before anything (no GPU needed); the
    GPU cases are in tests/gpu/test_registered.py."""
    for buf in (np.ones(10), bytearray(16)):
        with pytest.raises(HpcclInvalidArgument) as e:
            comm.register(buf)
        assert _arg(e) == "buf" and "host memory" in str(e.value)
    with pytest.raises(HpcclInvalidArgument):
        comm.deregister(np.ones(10))


def test_still_works_after_bad_calls(comm):
    x = np.ones(100)
    comm.all_reduce(x)
    assert np.all(x == comm.size)


def test_use_after_destroy():
    c = hpccl.init()
    c.destroy()
    c.destroy()  # idempotent
    with pytest.raises(HpcclInvalidUsage, match="destroyed"):
        c.all_reduce(np.ones(3))
    with pytest.raises(HpcclInvalidUsage, match="destroyed"):
        c.barrier()
    with pytest.raises(HpcclInvalidUsage, match="destroyed"):
        c.register(np.ones(3))


def test_error_codes_are_stable():
    assert HpcclInvalidArgument("x", "y").code == 2
    assert hpccl.HpcclTimeoutError("all_reduce", 3, [1], 2.0).code == 4
    assert isinstance(HpcclInvalidArgument("x", "y"), ValueError)
