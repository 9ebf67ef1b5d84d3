"""GPU network steps over MPI in stream order: a proxy thread per communicator drives the MPI transport for GPU
work, as NCCL's proxy does, while the caller's stream waits for it on the GPU.

Used only where MPI carries the traffic across nodes (the native engine could not load, or HPCCL_NET=mpi):
with the engine, GPU network steps are staged on the caller's stream by hpccl/gpu/netstep.py and no proxy
thread exists. MPI cannot be assumed CUDA-aware, so the transport stages device buffers through host
memory (transport/mpi.py) and the proxy's thread is what keeps that host-driven work in stream order.

For a step enqueued on stream S the caller (no host sync, returns at once):
  1. records an event on S (the step's inputs are ready when it completes),
  2. queues the step for the proxy thread with a generation number g,
  3. makes S wait until a word in mapped, pinned host memory reaches g (cuStreamWaitValue32; where the
     driver refuses that on host memory, a one-thread kernel polls the word instead).
The proxy thread takes steps in call order (the same order on every rank, so no deadlock), waits for the
event, runs the step (host algorithms over device primitives: MPI moves the staged bytes, hpccl's kernels
combine them, on the proxy's own stream), then writes g: S runs on. A step that fails (a peer never came:
HpcclTimeoutError naming the ranks; a transport error) still writes g, so no stream stays blocked; the
error is kept and raised by the communicator's next call or synchronize(), like ncclCommGetAsyncError.
A CUDA graph cannot hold a host-driven step: enqueue() refuses a capturing stream before doing anything.

While a stream is held, the proxy must not make a CUDA call that synchronizes implicitly (allocating
device or pinned memory, loading a kernel): it would wait for the held stream, which waits for the proxy.
So the kernels a step uses are loaded, the memory it allocates is reserved in the proxy stream's pool,
and the transport's staging buffers are warmed up, all before the caller's stream is held.
"""
from __future__ import annotations

import ctypes
import queue
import threading
import time
from typing import Any, Callable, Optional

from .. import config, log
from ..errors import HpcclError, HpcclSystemError, HpcclUnsupported

WAIT_GEQ = 0  # CU_STREAM_WAIT_VALUE_GEQ (wrap-around safe: (int32)(*addr - value) >= 0)
DEFAULT_STREAMS = (0, 1, 2)  # the legacy default stream (0, cudaStreamLegacy) and per-thread default


class StreamOps:
    """The CUDA side of the proxy (events, the release word and the stream wait); a separate class so the
    proxy's ordering and failure logic is testable without a GPU (tests/test_units.py fakes it)."""

    def __init__(self, device: int, timeout_s: float) -> None:
        import cupy
        from ..kernels import Driver
        self.cupy = cupy
        self.device = device
        self.driver = Driver.get()
        rt = cupy.cuda.runtime
        with cupy.cuda.Device(device):
            self._host = rt.hostAlloc(64, rt.hostAllocMapped | rt.hostAllocPortable)
        ctypes.memset(self._host, 0, 64)
        self.word = ctypes.c_uint32.from_address(self._host)
        self.err = ctypes.c_uint32.from_address(self._host + 32)
        self.dptr = self.driver.host_device_pointer(self._host)
        self.timeout_ns = int(timeout_s * 1e9)
        self._kernel_wait: Optional[Any] = None  # set when cuStreamWaitValue32 is refused
        self._reserved = 0
        with cupy.cuda.Device(device):
            self.stream = cupy.cuda.Stream(non_blocking=True)  # the proxy's stream (its memory pool arena)
        with cupy.cuda.Device(device):  # probe the driver now (value 0 is already reached), and load the
            s = cupy.cuda.Stream(non_blocking=True)  # fallback kernel before any stream is held
            rc = self.driver.wait_value32(ctypes.c_void_p(s.ptr), self.dptr, 0, WAIT_GEQ)
            if rc:
                log.info("PROXY", "cuStreamWaitValue32 on host memory refused (%s); holding streams with a "
                         "polling kernel", self.driver.error_name(rc))
                self._kernel_wait = self._make_kernel_wait()
                self._kernel_wait(s.ptr, 0)
            s.synchronize()

    def capturing(self, stream: int) -> bool:
        try:
            return bool(self.cupy.cuda.runtime.streamIsCapturing(stream))
        except Exception:  # noqa: BLE001 - the legacy stream in some modes; not capturing
            return False

    def record(self, stream: int) -> Any:
        ev = self.cupy.cuda.Event(block=False, disable_timing=True)
        self.cupy.cuda.runtime.eventRecord(ev.ptr, stream)
        return ev

    def ready(self, ev: Any) -> bool:
        return ev.done

    def hold(self, stream: int, gen: int) -> None:
        """Make ``stream`` wait until the release word reaches ``gen``."""
        if self._kernel_wait is None:
            rc = self.driver.wait_value32(ctypes.c_void_p(stream), self.dptr, gen & 0xFFFFFFFF, WAIT_GEQ)
            if rc:
                raise HpcclSystemError(f"holding the stream for a network step failed: {self.driver.error_name(rc)}")
            return
        self._kernel_wait(stream, gen)

    def _make_kernel_wait(self) -> Callable[[int, int], None]:
        from ..kernels import Kernels, Launch
        func = Kernels.for_device(self.device).func("hp_wait_host")
        args = [ctypes.c_uint64(self.dptr), ctypes.c_uint32(0), ctypes.c_uint64(self.dptr + 32),
                ctypes.c_uint64(self.timeout_ns)]
        ln = Launch(self.driver, func, 1, 32, args)

        def wait(stream: int, gen: int) -> None:
            args[1].value = gen & 0xFFFFFFFF
            rc = ln(stream)
            if rc:
                raise HpcclSystemError(f"holding the stream for a network step failed: {self.driver.error_name(rc)}")
        return wait

    def release(self, gen: int) -> None:
        self.word.value = gen & 0xFFFFFFFF

    def thread_setup(self) -> Any:
        """Runs on the proxy thread: make the device current and use the proxy's stream."""
        self.cupy.cuda.Device(self.device).use()
        self.stream.use()
        return self.stream

    def reserve(self, nbytes: int) -> None:
        """Make the proxy stream's memory pool hold a free block of ``nbytes``, so what a step allocates
        (receive temporaries, scratch) is carved from it without a cudaMalloc while a stream is held."""
        if nbytes <= self._reserved:
            return
        cupy = self.cupy
        with cupy.cuda.Device(self.device), self.stream:
            block = cupy.empty(nbytes, dtype=cupy.uint8)
            del block  # back to the pool, cached for allocations on this stream
        self._reserved = nbytes

    def thread_sync(self, s: Any) -> None:
        s.synchronize()

    def close(self) -> None:
        if self._host:
            try:
                self.cupy.cuda.runtime.freeHost(self._host)
            except Exception:  # noqa: BLE001
                pass
            self._host = 0


class Proxy:
    """One per communicator that has GPU network steps; steps run in the order they were enqueued."""

    def __init__(self, ops: Any, on_fail: Callable[[], None], name: str = "hpccl-proxy") -> None:
        self.ops = ops
        self._on_fail = on_fail
        self._q: "queue.Queue[Any]" = queue.Queue()
        self._gen = 0          # issued (caller thread)
        self._done = 0         # released (proxy thread)
        self._cv = threading.Condition()
        self.error: Optional[BaseException] = None
        self.hold_streams = bool(config.get("HPCCL_GPU_NET_ASYNC"))
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # ----- caller side ---------------------------------------------------------------------------------
    def check_capture(self, stream: int, what: str) -> None:
        """Refuse a capturing stream before anything is enqueued: a graph cannot replay a host step."""
        if self.ops.capturing(stream):
            raise HpcclUnsupported(f"{what}: this call needs a network step driven by the host (MPI between "
                                   "nodes, without hpccl's native engine), which a CUDA graph cannot hold; "
                                   "capture only single-node calls, or use the engine")

    def enqueue(self, stream: int, step: Callable[[], None], what: str) -> None:
        """Order ``step`` after what ``stream`` holds and before what the caller enqueues next.

        Held (asynchronous) only with ``hold_streams`` and a non-default stream; otherwise the step has
        completed when this returns. A held stream makes every implicitly synchronizing CUDA call of
        the process (a first kernel load, a device allocation) wait for the step, and a caller thread
        that waits so while holding the GIL starves the proxy thread: measured as a hang on the GPU
        machine (docs/GPU.md). On the default streams the wait would, through implicit
        synchronization, also stall the step's own CUDA copies."""
        self.check_capture(stream, what)
        ev = self.ops.record(stream)
        self._gen += 1
        gen = self._gen
        self._q.put((ev, step, gen, what))
        if stream in DEFAULT_STREAMS or not self.hold_streams:
            self.drain()
            self.raise_error()
        else:
            self.ops.hold(stream, gen)

    def drain(self, timeout: Optional[float] = None) -> bool:
        """Wait until every enqueued step has run (or failed); False if ``timeout`` passed first."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while self._done < self._gen:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(left if left is not None else 1.0)
        return True

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    # ----- proxy thread --------------------------------------------------------------------------------
    def _loop(self) -> None:
        s = None
        try:
            s = self.ops.thread_setup()
        except BaseException as exc:  # noqa: BLE001
            self.error = HpcclSystemError(f"the network proxy thread could not start: {exc}")
        while True:
            item = self._q.get()
            if item is None:
                return
            ev, step, gen, what = item
            try:
                if self.error is None:
                    polls = 0
                    while not self.ops.ready(ev):  # spin briefly (latency), then nap (CPU)
                        polls += 1
                        if polls > 200:
                            time.sleep(2e-5)
                    step()
                    self.ops.thread_sync(s)
            except BaseException as exc:  # noqa: BLE001 - kept and raised on the caller's thread
                if self.error is None:
                    self.error = exc if isinstance(exc, HpcclError) else HpcclSystemError(
                        f"{what}: network step failed: {type(exc).__name__}: {exc}")
                    log.warn("PROXY", "%s failed: %s", what, self.error)
                    try:
                        self._on_fail()
                    except Exception:  # noqa: BLE001
                        pass
            finally:
                self.ops.release(gen)  # the stream runs on, also after a failure
                with self._cv:
                    self._done = gen
                    self._cv.notify_all()

    def close(self) -> None:
        """Run what is queued (each step ends or times out), stop the thread, free the release word."""
        self.drain()
        self._q.put(None)
        self._thread.join()
        self.ops.close()
