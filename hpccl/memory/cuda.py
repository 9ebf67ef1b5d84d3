"""Device memory: turning CuPy arrays, PyTorch CUDA tensors and __cuda_array_interface__ objects into
(pointer, bytes, dtype, device) without copying, streams of either library, and output allocation.

Imported only by the CUDA path (hpccl.gpu.cuda_comm), so CuPy/PyTorch are imported lazily here."""
from __future__ import annotations

import sys
from typing import Any, Dict, NamedTuple, Optional, Tuple

import numpy as np

from ..errors import HpcclInvalidArgument
from ..ops import FP8_NAMES, bfloat16_dtype, check_dtype, dtype_name, is_bfloat16, is_fp8, ml_dtype


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
                     torch.float16: np.dtype(np.float16),
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
        check_dtype(dt, name)
        return DevBuf(obj.data.ptr, obj.size, dt, dt.itemsize, obj.device.id, "cupy", obj)
    mod = type(obj).__module__
    if mod.startswith("torch"):
        if not getattr(obj, "is_cuda", False):
            raise HpcclInvalidArgument(name, "torch tensor is not on a CUDA device")
        if not obj.is_contiguous():
            raise HpcclInvalidArgument(name, "torch tensor is not contiguous; pass t.contiguous()")
        dt = _torch_dtypes().get(obj.dtype)
        if dt is None and str(obj.dtype) == "torch.bfloat16":
            dt = bfloat16_dtype()
        if dt is None and str(obj.dtype)[6:] in FP8_NAMES:
            dt = ml_dtype(str(obj.dtype)[6:])
        if dt is None:
            raise HpcclInvalidArgument(name, f"torch dtype {obj.dtype} is not supported")
        return DevBuf(obj.data_ptr(), obj.numel(), dt, dt.itemsize, obj.device.index, "torch", obj)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is None:
        raise HpcclInvalidArgument(name, f"{type(obj).__name__} is not a CUDA array")
    dt = np.dtype(cai["typestr"])
    if dt.kind == "V" and dt.itemsize == 2:
        dt = bfloat16_dtype()
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


def _pointer_device(ptr: int) -> int:
    import cupy
    try:
        attrs = cupy.cuda.runtime.pointerGetAttributes(ptr)
        return int(attrs.device)
    except Exception:  # noqa: BLE001
        return cupy.cuda.runtime.getDevice()


class _RawStream:
    """A bare cudaStream_t handle in the CUDA stream protocol (``__cuda_stream__``: version 0, the handle)."""
    __slots__ = ("ptr",)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def __cuda_stream__(self) -> Tuple[int, int]:
        return (0, self.ptr)


def cupy_stream(stream: int) -> Any:
    """A CuPy Stream over the handle ``stream`` (not owned), made on the current device: Stream.from_external
    where CuPy has it (ExternalStream is deprecated from CuPy 14 and warns at every use), ExternalStream before."""
    import cupy
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        return from_external(_RawStream(stream))
    return cupy.cuda.ExternalStream(stream)


def stream_object(stream: Any) -> Tuple[int, Optional[int]]:
    """(cudaStream_t as an int, its device or None where the object does not say) of a CuPy Stream, a
    torch.cuda.Stream or any object of the CUDA stream protocol (``__cuda_stream__``, as cuda.core's streams)."""
    ptr = getattr(stream, "ptr", None)
    if ptr is not None:  # CuPy
        return int(ptr), getattr(stream, "device_id", None)
    cs = getattr(stream, "cuda_stream", None)
    if cs is not None:  # torch
        return int(cs), getattr(getattr(stream, "device", None), "index", None)
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        got = proto()
        if (not isinstance(got, tuple) or len(got) != 2 or got[0] != 0
                or not all(type(v) is int for v in got)):
            raise HpcclInvalidArgument("stream", f"{type(stream).__name__}.__cuda_stream__() returned {got!r}, "
                                                 "not (0, handle)")
        return got[1], None
    raise HpcclInvalidArgument("stream", f"{type(stream).__name__} is not a CUDA stream (CuPy or torch stream, "
                                         "an object with __cuda_stream__, or an int handle)")


def stream_handle(stream: Any, buf: Optional[DevBuf]) -> int:
    """cudaStream_t as an int: from an int, a stream object (stream_object), or None (the current stream of
    the buffer's library: torch.cuda.current_stream() for tensors, else CuPy's)."""
    if stream is None:
        if buf is not None and buf.lib == "torch":
            import torch
            return int(torch.cuda.current_stream(buf.device).cuda_stream)
        import cupy
        return int(cupy.cuda.get_current_stream().ptr)
    if isinstance(stream, int):
        return stream
    return stream_object(stream)[0]


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


# ----- the device memory component: validated flat CuPy views and stream-ordered copy/reduce ----------
#
# The front end (hpccl.core.comm) turns every device buffer into a flat CuPy array, as it turns host buffers
# into flat numpy arrays, so one set of rules (and the host algorithms, over device primitives) serves
# both. CuPy has no bfloat16: a bfloat16 buffer is viewed as uint16, which is not an hpccl dtype, so the
# view is unambiguous; dtype() gives the real dtype back.

_U16 = np.dtype(np.uint16)
_U8 = np.dtype(np.uint8)  # a float8 tensor's view: its bytes move as they are; reductions ask fp8_of


def _cupy_from_ptr(ptr: int, count: int, dtype: np.dtype, device: int, owner: Any) -> Any:
    """A flat CuPy array over memory another library owns (kept alive through ``owner``)."""
    import cupy
    cdt = _U16 if is_bfloat16(dtype) else _U8 if is_fp8(dtype) else dtype
    if count == 0:
        with cupy.cuda.Device(device):
            return cupy.empty(0, dtype=cdt)
    mem = cupy.cuda.UnownedMemory(ptr, count * cdt.itemsize, owner, device)
    return cupy.ndarray((count,), dtype=cdt, memptr=cupy.cuda.MemoryPointer(mem, 0))


class DeviceMemory:
    """Memory component for CUDA buffers of one device. Copies and reductions are enqueued on CuPy's
    current stream; with ``blocking`` they also wait for it (the proxy thread: UCX reads the result
    next, outside any stream)."""

    kind = "cuda"

    def __init__(self, device: int, blocking: bool = False) -> None:
        self.device = device
        self.blocking = blocking
        self._kernels: Any = None
        self._launch: Dict[tuple, Any] = {}  # (dtype, op) whose kernels are loaded
        self.rec: Any = None  # a netreplay.Recording while a network call is recorded for replay

    # -- validation and views --------------------------------------------------------------------------
    def view(self, obj: Any, name: str) -> Tuple[Any, Any]:
        """(flat CuPy array, the object as given) after the checks every device argument gets."""
        b = device_view(obj, name)
        if b.device != self.device:
            raise HpcclInvalidArgument(name, f"buffer is on GPU {b.device}, but this rank's communicator "
                                             f"uses GPU {self.device} (set the device before the first GPU "
                                             "call, or HPCCL_CUDA_DEVICE)")
        if b.lib == "cupy":
            o = b.obj
            return (o if o.ndim == 1 else o.reshape(-1)), o
        return _cupy_from_ptr(b.ptr, b.count, b.dtype, b.device, b.obj), obj

    @staticmethod
    def dtype(flat: Any) -> np.dtype:
        return bfloat16_dtype() if flat.dtype == _U16 else flat.dtype

    @staticmethod
    def writable(flat: Any, name: str) -> None:
        """Device views are writable (read-only CUDA arrays are refused by device_view)."""

    def empty_out(self, shape: Tuple[int, ...], like_obj: Any, like_flat: Any) -> Tuple[Any, Any]:
        """A new output in the caller's library (torch tensors beget tensors), and its flat view."""
        mod = type(like_obj).__module__
        if mod.startswith("torch"):
            import torch
            t = torch.empty(shape, dtype=like_obj.dtype, device=like_obj.device)
            return self.view(t, "recvbuf")[0], t
        import cupy
        with cupy.cuda.Device(self.device):
            out = cupy.empty(shape, dtype=like_flat.dtype)
        return out.reshape(-1), out

    @staticmethod
    def span(a: Any) -> Tuple[int, int]:
        p = a.data.ptr
        return p, p + a.nbytes

    def shares(self, a: Any, b: Any) -> bool:
        (a0, a1), (b0, b1) = self.span(a), self.span(b)
        return a0 < b1 and b0 < a1 and a1 > a0 and b1 > b0

    def same(self, a: Any, b: Any) -> bool:
        return a.data.ptr == b.data.ptr and a.nbytes == b.nbytes

    def stream(self, stream: Any, like_obj: Any) -> int:
        """The caller's stream as a handle, refused when it belongs to another device."""
        lib = "torch" if type(like_obj).__module__.startswith("torch") else "cupy"
        if stream is None:
            if lib == "torch":
                import torch
                return int(torch.cuda.current_stream(self.device).cuda_stream)
            import cupy
            return int(cupy.cuda.get_current_stream().ptr)
        if isinstance(stream, int) and not isinstance(stream, bool):
            h, dev = stream, None
        else:
            h, dev = stream_object(stream)
        if dev is None:  # an int handle, or an object that does not say: ask the driver
            from ..kernels import Driver
            drv = Driver.get()
            # cuStreamGetDevice invalidates a capture in progress on that stream: a capturing stream is
            # checked by the launch itself (a stream of another GPU's context fails it)
            dev = None if drv.capturing(h) else drv.stream_device(h)
        if dev is not None and dev >= 0 and dev != self.device:
            raise HpcclInvalidArgument("stream", f"stream belongs to GPU {dev}, but this rank's communicator "
                                                 f"uses GPU {self.device}")
        return h

    def clone(self, a: Any, stream: int) -> Any:
        """A private copy of ``a``, ordered on ``stream`` (an input that partially overlaps the output)."""
        import cupy
        if self.rec is not None:
            self.rec.refuse("an input copied aside")
        with cupy.cuda.Device(self.device), cupy_stream(stream):
            return a.copy()

    # -- the operations algorithms use -------------------------------------------------------------------
    def _done(self) -> None:
        if self.blocking:
            import cupy
            cupy.cuda.get_current_stream().synchronize()

    def copy(self, dst: Any, src: Any) -> None:
        """dst[:] = src (equal byte length), on the current stream."""
        import cupy
        n = dst.nbytes
        if n:
            s = cupy.cuda.get_current_stream().ptr
            cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, n, 3, s)  # device to device
            if self.rec is not None:
                self.rec.copy(2, dst.data.ptr, src.data.ptr, n, s)
        self._done()

    def _kernel(self, name: str, dt: int) -> int:
        if self._kernels is None:
            from ..kernels import Kernels
            self._kernels = Kernels.for_device(self.device)
        return self._kernels.func(name, dt)

    def prepare(self, dtype: np.dtype, op: Any) -> None:
        """Load the kernels a network step will combine ``dtype`` with, before the caller's stream is
        held: with CUDA's lazy loading, a first launch inside the step could wait for that very stream."""
        import ctypes
        import cupy
        from ..kernels import DTYPE_IDS, OP_IDS
        key = (dtype, op)
        if key in self._launch:
            return
        dt = DTYPE_IDS[dtype_name(dtype)]
        names = [f"hp_reduce_local<{dt}, {OP_IDS[op.value]}>"] if op is not None else []
        if op is not None and op.value == "avg":
            names.append(f"hp_scale_local<{dt}>")
        z = ctypes.c_uint64(0)
        with cupy.cuda.Device(self.device):
            s = cupy.cuda.Stream(non_blocking=True)
            for name in names:  # an empty launch loads the function
                args = [z, z, z, z] if "reduce" in name else [z, z, ctypes.c_int(1)]
                self._run(name, dt, 0, args, s.ptr)
            s.synchronize()
        self._launch[key] = True

    def _run(self, name: str, dt: int, n: int, args: list, stream: Optional[int] = None) -> None:
        import cupy
        from ..kernels import Driver, Launch
        grid = max(1, min(1024, -(-n // 512)))
        ln = Launch(Driver.get(), self._kernel(name, dt), grid, 512, args)
        s = cupy.cuda.get_current_stream().ptr if stream is None else stream
        rc = ln(s)
        if self.rec is not None and not rc:
            self.rec.launch(ln.fi, grid, 512, tuple(a.value for a in args), s)
        if rc:
            from ..errors import HpcclSystemError
            raise HpcclSystemError(f"{name}: cuLaunchKernel failed: {Driver.get().error_name(rc)}")

    def reduce(self, dst: Any, a: Any, b: Any, op: Any) -> None:
        """dst = a op b elementwise on the GPU (dst may alias a or b); avg combines as sum."""
        import ctypes
        from ..kernels import DTYPE_IDS, OP_IDS
        n = dst.size
        if n:
            dt = DTYPE_IDS[dtype_name(self.dtype(dst))]
            self._run(f"hp_reduce_local<{dt}, {OP_IDS[op.value]}>", dt, n,
                      [ctypes.c_uint64(dst.data.ptr), ctypes.c_uint64(a.data.ptr), ctypes.c_uint64(b.data.ptr),
                       ctypes.c_uint64(n)])
        self._done()

    def reduce_ptrs(self, dst: Any, a: int, b: int, op: Any) -> None:
        """dst = (memory at a) op (memory at b), elementwise over dst's length; a and b are device
        addresses (b may be mapped pinned host memory: a network step's staged data)."""
        import ctypes
        from ..kernels import DTYPE_IDS, OP_IDS
        n = dst.size
        if n:
            dt = DTYPE_IDS[dtype_name(self.dtype(dst))]
            self._run(f"hp_reduce_local<{dt}, {OP_IDS[op.value]}>", dt, n,
                      [ctypes.c_uint64(dst.data.ptr), ctypes.c_uint64(a), ctypes.c_uint64(b), ctypes.c_uint64(n)])
        self._done()

    def scale_avg(self, buf: Any, nranks: int) -> None:
        """buf /= nranks (the last step of avg), on the GPU."""
        import ctypes
        from ..kernels import DTYPE_IDS
        if buf.size:
            dt = DTYPE_IDS[dtype_name(self.dtype(buf))]
            self._run(f"hp_scale_local<{dt}>", dt, buf.size,
                      [ctypes.c_uint64(buf.data.ptr), ctypes.c_uint64(buf.size), ctypes.c_int(nranks)])
        self._done()

    @staticmethod
    def fp8_of(obj: Any) -> Optional[np.dtype]:
        """The float8 type of a torch float8 tensor (its flat view is uint8), else None."""
        name = str(getattr(obj, "dtype", ""))[6:]
        return ml_dtype(name) if name in FP8_NAMES and type(obj).__module__.startswith("torch") else None

    def fp8_convert(self, dst: Any, src: Any, name: str, widen: bool, stream: int) -> None:
        """On ``stream``: dst (float32) = src (float8 words) widened, or dst (float8 words) = src (float32)
        rounded once (cuda/hpccl_kernels.cu hp_fp8_widen / hp_fp8_narrow)."""
        import ctypes
        n = dst.size
        if n:
            self._run("hp_fp8_widen" if widen else "hp_fp8_narrow", None, n,
                      [ctypes.c_uint64(dst.data.ptr), ctypes.c_uint64(src.data.ptr), ctypes.c_uint64(n),
                       ctypes.c_int(FP8_NAMES.index(name))], stream)

    def finish(self, buf: Any, op: Any, nranks: int) -> None:
        from ..ops import AVG
        if op is AVG:
            self.scale_avg(buf, nranks)

    def empty(self, count: int, dtype: np.dtype) -> Any:
        import cupy
        with cupy.cuda.Device(self.device):
            out = cupy.empty(count, dtype=dtype)
        if self.rec is not None:  # a replay of the call reuses it: kept alive with the recording
            self.rec.keep.append(out)
        return out


class CallKeys:
    """The key a repeated GPU call is replayed under (collective, buffers, dtype, op, root, stream), read
    straight off CuPy arrays and torch tensors: None for anything else (that call is not replayed)."""

    def __init__(self) -> None:
        import cupy
        self._cp_nd = cupy.ndarray
        self._cur_stream = cupy.cuda.get_current_stream
        probe = cupy.empty(1, dtype=cupy.uint8)
        self._cp_contig = hasattr(probe, "_c_contiguous")

    def _bkey(self, obj: Any) -> Optional[tuple]:
        """(ptr, count, dtype, contiguous) of a CuPy array or torch tensor on a GPU; None otherwise."""
        if type(obj) is self._cp_nd:
            return (obj.data.ptr, obj.size, obj.dtype,
                    obj._c_contiguous if self._cp_contig else obj.flags.c_contiguous)
        if type(obj).__module__.startswith("torch") and getattr(obj, "is_cuda", False):
            return (obj.data_ptr(), obj.numel(), obj.dtype, obj.is_contiguous())
        return None

    def key(self, coll: str, sendbuf: Any, recvbuf: Any, op: Any, root: int, stream: Any) -> Optional[tuple]:
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


_BLOCKING: Dict[int, DeviceMemory] = {}


def blocking_memory(arr: Any) -> DeviceMemory:
    """The blocking component for ``arr``'s device (what transports use to combine received data)."""
    return blocking_for_device(arr.device.id)


def blocking_for_device(dev: int) -> DeviceMemory:
    """The one blocking component of a device (the proxy's primitives and the transports share it, and
    so its loaded kernels)."""
    m = _BLOCKING.get(dev)
    if m is None:
        m = _BLOCKING[dev] = DeviceMemory(dev, blocking=True)
    return m
