"""Device memory: turning CuPy arrays, PyTorch CUDA tensors and __cuda_array_interface__ objects into
(pointer, bytes, dtype, device) without copying, streams of either library, and output allocation.

Imported only by the CUDA path (hpccl.cuda_comm), so CuPy/PyTorch are imported lazily here."""
from __future__ import annotations

import sys
from typing import Any, NamedTuple, Optional, Tuple

import numpy as np

from ..errors import HpcclInvalidArgument
from ..ops import bfloat16, check_dtype, dtype_name


class DevBuf(NamedTuple):
    """A flat, contiguous device buffer."""

    ptr: int
    count: int
    dtype: np.dtype
    itemsize: int
    device: int
    lib: str        # 'cupy', 'torch' or 'cai'
    obj: Any

    @property
    def nbytes(self) -> int:
        return self.count * self.itemsize

    @property
    def dtname(self) -> str:
        return dtype_name(self.dtype)


_TORCH_DT = None


def _torch_dtypes():
    global _TORCH_DT
    if _TORCH_DT is None:
        import torch
        _TORCH_DT = {torch.int8: np.dtype(np.int8), torch.uint8: np.dtype(np.uint8),
                     torch.int32: np.dtype(np.int32), torch.int64: np.dtype(np.int64),
                     torch.float16: np.dtype(np.float16), torch.bfloat16: bfloat16,
                     torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}
        for name, np_dt in (("uint32", np.uint32), ("uint64", np.uint64)):
            if hasattr(torch, name):
                _TORCH_DT[getattr(torch, name)] = np.dtype(np_dt)
    return _TORCH_DT


def _cupy_ndarray():
    mod = sys.modules.get("cupy")
    return getattr(mod, "ndarray", None) if mod is not None else None


def device_view(obj: Any, name: str) -> DevBuf:
    """Validate a device buffer argument: contiguous, supported dtype; raises HpcclInvalidArgument."""
    cp_nd = _cupy_ndarray()
    if cp_nd is not None and type(obj) is cp_nd:
        if not obj.flags.c_contiguous:
            raise HpcclInvalidArgument(name, "CuPy array is not C-contiguous; pass cupy.ascontiguousarray(x)")
        dt = obj.dtype
        if dt not in _OK:
            check_dtype(dt, name)
        return DevBuf(obj.data.ptr, obj.size, dt, dt.itemsize, obj.device.id, "cupy", obj)
    mod = type(obj).__module__
    if mod.startswith("torch"):
        if not getattr(obj, "is_cuda", False):
            raise HpcclInvalidArgument(name, "torch tensor is not on a CUDA device")
        if not obj.is_contiguous():
            raise HpcclInvalidArgument(name, "torch tensor is not contiguous; pass t.contiguous()")
        dt = _torch_dtypes().get(obj.dtype)
        if dt is None:
            raise HpcclInvalidArgument(name, f"torch dtype {obj.dtype} is not supported")
        return DevBuf(obj.data_ptr(), obj.numel(), dt, dt.itemsize, obj.device.index, "torch", obj)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is None:
        raise HpcclInvalidArgument(name, f"{type(obj).__name__} is not a CUDA array")
    dt = np.dtype(cai["typestr"])
    if dt.kind == "V" and dt.itemsize == 2:
        dt = bfloat16
    check_dtype(dt, name)
    shape = tuple(cai["shape"])
    count = int(np.prod(shape)) if shape else 1
    strides = cai.get("strides")
    if strides is not None:
        expect, acc = [], dt.itemsize
        for s in reversed(shape):
            expect.append(acc)
            acc *= s
        if tuple(reversed(expect)) != tuple(strides) and count > 1:
            raise HpcclInvalidArgument(name, "CUDA array is not C-contiguous")
    ptr = int(cai["data"][0])
    if cai["data"][1]:
        raise HpcclInvalidArgument(name, "CUDA array is read-only")
    return DevBuf(ptr, count, dt, dt.itemsize, _pointer_device(ptr), "cai", obj)


_OK = {np.dtype(t) for t in (np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64, np.float16,
                             np.float32, np.float64)} | {bfloat16}


def _pointer_device(ptr: int) -> int:
    import cupy
    try:
        attrs = cupy.cuda.runtime.pointerGetAttributes(ptr)
        return int(attrs.device)
    except Exception:  # noqa: BLE001
        return cupy.cuda.runtime.getDevice()


def overlaps(a: DevBuf, b: DevBuf) -> bool:
    return a.ptr < b.ptr + b.nbytes and b.ptr < a.ptr + a.nbytes and a.nbytes > 0 and b.nbytes > 0


def empty_like(buf: DevBuf, shape: Tuple[int, ...]) -> Any:
    """A new array of ``shape`` and buf's dtype from buf's library, on buf's device (the one allowed
    allocation: an output the caller did not supply)."""
    if buf.lib == "torch":
        import torch
        return torch.empty(shape, dtype=buf.obj.dtype, device=buf.obj.device)
    import cupy
    with cupy.cuda.Device(buf.device):
        return cupy.empty(shape, dtype=buf.dtype)


def shape_of(obj: Any) -> Tuple[int, ...]:
    s = getattr(obj, "shape", None)
    if s is not None:
        return tuple(int(x) for x in s)
    return tuple(obj.__cuda_array_interface__["shape"])


def stream_handle(stream: Any, buf: Optional[DevBuf]) -> int:
    """cudaStream_t as an int: from a CuPy Stream, a torch.cuda.Stream, an int, or None (the current
    stream of the buffer's library: torch.cuda.current_stream() for tensors, else CuPy's)."""
    if stream is None:
        if buf is not None and buf.lib == "torch":
            import torch
            return int(torch.cuda.current_stream(buf.device).cuda_stream)
        import cupy
        return int(cupy.cuda.get_current_stream().ptr)
    if isinstance(stream, int):
        return stream
    ptr = getattr(stream, "ptr", None)
    if ptr is not None:
        return int(ptr)
    cs = getattr(stream, "cuda_stream", None)
    if cs is not None:
        return int(cs)
    raise HpcclInvalidArgument("stream", f"{type(stream).__name__} is not a CUDA stream (CuPy Stream, "
                                         "torch.cuda.Stream or an int handle)")


class DeviceAlloc:
    """A raw cudaMalloc allocation (not from a pool: CUDA IPC needs the allocation's own base)."""

    def __init__(self, nbytes: int, device: int) -> None:
        import cupy
        self.device = device
        self.nbytes = nbytes
        with cupy.cuda.Device(device):
            self.ptr = cupy.cuda.runtime.malloc(nbytes)

    def free(self) -> None:
        if self.ptr:
            import cupy
            with cupy.cuda.Device(self.device):
                cupy.cuda.runtime.free(self.ptr)
            self.ptr = 0
