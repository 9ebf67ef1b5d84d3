"""Reductions of the 1-byte floats (float8_e4m3fn, float8_e5m2): the input is widened to float32, the
float32 collective runs (any route: hot path, schedule, hier, GPU kernels, network steps), and the result is
rounded once to the 1-byte type (round to nearest even; e4m3fn has no infinity: what overflows is NaN, as
ml_dtypes converts). A ring that rounded its partial sums at every hop would round once per hop instead.
avg divides in float32 before that one rounding. Data-movement collectives never come here: they move the
1-byte words as they are. Functions of the communicator; the frontend wraps a validated Call with wrap()."""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .call import Call
from ..memory import host
from ..errors import HpcclInvalidArgument
from ..ops import AVG, FP8_NAMES, as_op, check_op_dtype, dtype_name, fp8_name, ml_dtype

F32 = np.dtype(np.float32)
TORCH_NAMES = ("torch.float8_e4m3fn", "torch.float8_e5m2")


def of(m: Any, obj: Any, flat: Any, dtype: Any) -> Optional[np.dtype]:
    """The float8 type a reducing call's input holds, or None: ``dtype`` when given (the input must then be
    1-byte words), else the buffer's own (numpy's ml_dtypes arrays, torch's float8 tensors)."""
    have = m.dtype(flat)
    if dtype is None:
        if m is host:
            return have if fp8_name(have) is not None else None
        return m.fp8_of(obj)
    if isinstance(dtype, str):
        want = dtype
    elif str(dtype) in TORCH_NAMES:  # torch.float8_e4m3fn itself
        want = str(dtype)[6:]
    else:
        want = fp8_name(np.dtype(dtype)) if _dtype_like(dtype) else None
    if want not in FP8_NAMES:
        raise HpcclInvalidArgument("dtype", f"{dtype!r} is not a float8 type; use one of {', '.join(FP8_NAMES)} "
                                            "(other types are read from the buffer itself)")
    dt = ml_dtype(want)
    own = None if m is host else m.fp8_of(obj)
    if own is not None and own != dt:
        raise HpcclInvalidArgument("dtype", f"{want} given for a buffer of {dtype_name(own)}")
    if have != dt and (have.itemsize != 1 or fp8_name(have) is not None):
        raise HpcclInvalidArgument("dtype", f"{want} needs a buffer of 1-byte words (uint8 or int8), "
                                            f"not {dtype_name(have)}")
    return dt


def _dtype_like(dtype: Any) -> bool:
    try:
        np.dtype(dtype)
    except TypeError:
        return False
    return True


def wrap(call: Call, dtype: np.dtype) -> Call:
    """The Call that runs the validated reducing ``call`` on fp8 buffers in float32 (no launch snapshot:
    its temporaries are new each call)."""
    args = call.args
    if call.mem is host:  # 1-byte words seen as the float8 type (HPCCL_CHECK then compares that type)
        args = tuple(a.view(dtype) if isinstance(a, np.ndarray) else a for a in args)
    return Call(call.coll, call.mem, call.stream, call.nbytes, args, op=call.op, key=None,
                fn=lambda comm, c: run(comm, c, dtype))


def run(comm: Any, call: Call, dtype: np.dtype) -> None:
    """Widen, run the float32 collective through dispatch (this call's number, no second count), round."""
    from .dispatch import device_collective, host_collective
    m, st, coll, a, op = call.mem, call.stream, call.coll, call.args, call.op
    send, recv = a[0], a[1]
    name = fp8_name(dtype)
    s32 = widen(comm, m, st, send, name)
    if coll == "all_reduce":
        r32, args = s32, (s32, s32, op)
    elif coll == "reduce":
        r32, args = s32, (s32, s32, a[2], op)
    else:  # reduce_scatter
        r32 = temp(comm, m, st, recv.size)
        args = (s32, r32, op)
    writes = coll != "reduce" or comm.rank == a[2]
    inner = Call(coll, m, st, s32.nbytes, args, op=op,
                 finish=r32 if op is AVG and writes else None)
    (host_collective if m is host else device_collective)(comm, inner)
    if writes:
        narrow(m, st, recv, r32, name)


def takes(obj: Any, dtype: Any) -> bool:
    """Whether a call on ``obj`` reduces float8: ``dtype`` given, or the buffer's own type is one (read off
    numpy arrays and torch tensors without viewing them)."""
    if dtype is not None:
        return True
    dt = getattr(obj, "dtype", None)
    if isinstance(dt, np.dtype):
        return fp8_name(dt) is not None
    return str(dt) in TORCH_NAMES


def reduce_scatter_v(comm: Any, sendbuf: Any, recvbuf: Any, recvcounts: Any, op: Any, stream: Any,
                     dtype: Any) -> Any:
    """reduce_scatter_v of float8: the float32 reduce_scatter_v of the widened input (its own call, which
    checks the counts), then each rank's block rounded once into recvbuf."""
    from .p2p import buffer_pair
    op = as_op(op)
    m, send, recv = buffer_pair(comm, "reduce_scatter_v", sendbuf, recvbuf)
    dt = of(m, sendbuf, send, dtype)
    if dt is None:  # a torch tensor's own type that is no float8 after all
        raise HpcclInvalidArgument("sendbuf", f"dtype {dtype_name(m.dtype(send))} is not a float8 type")
    check_op_dtype(op, dt)
    st = m.stream(stream, sendbuf)
    if m is host:
        send, recv = send.view(dt), recv.view(dt)
    name = fp8_name(dt)
    s32, r32 = widen(comm, m, st, send, name), temp(comm, m, st, recv.size)
    comm.reduce_scatter_v(s32, r32, recvcounts, op, stream=None if m is host else st)
    if recv.size:
        narrow(m, st, recv, r32, name)
    return recvbuf


def temp(comm: Any, m: Any, st: Any, count: int) -> Any:
    """A float32 temporary: numpy on the host; on a GPU from the pool with the call's stream current (the
    pool reuses it only in that stream's order), or, while the stream captures a graph, one kept until the
    communicator is destroyed (every replay of the graph writes into it)."""
    if m is host:
        return np.empty(count, F32)
    from ..memory.cuda import cupy_stream
    import cupy
    dev = comm._dev
    if dev.capturing(st):
        from ..kernels import Driver
        with Driver.get().relaxed(), cupy.cuda.Device(m.device):
            a = cupy.empty(count, F32)
        dev.graph_keep.append(a)
        return a
    with cupy.cuda.Device(m.device), cupy_stream(st):
        return cupy.empty(count, F32)


_WIDE: dict = {}  # name -> the float32 value of each of the 256 codes


def widen(comm: Any, m: Any, st: Any, src: Any, name: Optional[str]) -> Any:
    """src as float32 (exact: every fp8 value is a float32); on the host a lookup of the 256 codes (np.take),
    cheaper than ml_dtypes' per-element conversion."""
    if m is host:
        table = _WIDE.get(name)
        if table is None:
            table = _WIDE[name] = np.arange(256, dtype=np.uint8).view(ml_dtype(name)).astype(F32)
        return np.take(table, src.view(np.uint8))
    out = temp(comm, m, st, src.size)
    m.fp8_convert(out, src, name, True, st)
    return out


def narrow(m: Any, st: Any, dst: Any, src32: Any, name: Optional[str]) -> None:
    """dst (fp8) = src32 rounded once to nearest even (ml_dtypes' conversion: e4m3fn overflows to NaN)."""
    if m is host:
        dst[...] = src32.astype(dst.dtype)
    else:
        m.fp8_convert(dst, src32, name, False, st)
