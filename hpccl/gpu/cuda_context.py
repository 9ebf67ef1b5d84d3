"""CUDA context around a communicator's GPU calls: the current device while a call runs, CuPy's device and
stream set to the caller's (stream_context), the refusal of a capturing stream where a network step cannot
be captured, and the lazy timer of traced GPU calls.
Imports CuPy only when a GPU call needs it; functions of the communicator (the fields they read)."""
from __future__ import annotations

from typing import Any, Optional

from ..errors import HpcclUnsupported


def on_device(device: int) -> Optional[int]:
    """Make ``device`` the calling thread's current GPU (its context is the one hpccl's kernels were loaded
    in: launching them from another GPU's context fails with CUDA_ERROR_INVALID_HANDLE); returns the GPU
    to go back to afterwards, or None when it already was current."""
    import cupy
    rt = cupy.cuda.runtime
    cur = rt.getDevice()
    if cur == device:
        return None
    rt.setDevice(device)
    return cur


def net_capturable(comm: Any) -> bool:
    """True when this communicator's GPU network steps (and those of hier's sub-communicators) are
    staged on the network engine, which a CUDA graph can hold."""
    return _not_capturable(comm) is None


def _not_capturable(comm: Any) -> Optional[str]:
    """Why a capture of comm's network steps cannot be taken now, or None when it can."""
    dev = comm._dev
    if dev is None:
        return ("the first GPU call of a communicator spanning nodes sets up its network path (collectively, "
                "with host synchronisation), which a CUDA graph cannot hold; make one call before capturing")
    if not getattr(dev.proxy, "capturable", False):
        return ("on a communicator spanning nodes this call needs a network step driven by the host (UCX), "
                "which a CUDA graph cannot hold; capture only single-node calls")
    for sub in comm._sub.values():
        if sub.num_nodes > 1:
            why = _not_capturable(sub)
            if why is not None:
                return why
    return None


def check_capture(comm: Any, stream: int, what: str, hier: bool = False) -> None:
    """Calls whose algorithm has a network step refuse a capturing stream before enqueuing anything,
    unless that step is staged on the network engine (capturable) and set up (``hier``: the call runs on
    the sub-communicators, which its first call makes)."""
    if comm.num_nodes > 1:
        why = _not_capturable(comm)
        if why is None and hier and not all(n in comm._sub for n in ("intra", "inter")):
            why = ("the first hierarchical GPU call of a communicator makes its node and network "
                   "sub-communicators (collectively, with host synchronisation), which a CUDA graph cannot "
                   "hold; make one such call (all_reduce, all_gather, reduce_scatter, broadcast or reduce) "
                   "before capturing")
        if why is None:
            return
        import cupy
        try:
            capturing = cupy.cuda.runtime.streamIsCapturing(stream)
        except Exception:  # noqa: BLE001
            capturing = False
        if capturing:
            raise HpcclUnsupported(f"{what}: {why}")


def gpu_begin(comm: Any, device: int, stream: int) -> Optional[int]:
    """A CUDA event before a traced GPU call on its stream (None inside a capture); the communicator's
    GpuTimer (hpccl/observe/trace.py) is made at its first traced GPU call."""
    if comm._gpu_timer is None:
        from ..observe.trace import GpuTimer
        comm._gpu_timer = GpuTimer(device)
    return comm._gpu_timer.begin(stream)


def stream_context(device: int, stream: int) -> Any:
    """CuPy's device and current stream set to the caller's, so CuPy work (hier's temporaries and copies,
    avg's scaling) is ordered with the kernels on that stream."""
    import contextlib
    import cupy
    from ..memory.cuda import cupy_stream
    stack = contextlib.ExitStack()
    stack.enter_context(cupy.cuda.Device(device))
    stack.enter_context(cupy_stream(stream))  # made after the device is entered: its device is the current one
    return stack
