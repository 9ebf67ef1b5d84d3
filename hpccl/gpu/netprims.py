"""What the communicator's device side runs a schedule's network steps through: StagedPrimitives (the
runtime's Primitives whose exchanges are staged network steps on the caller's stream, each in the form
netstep.StagedNet takes: one fused kernel, one piped kernel, or copies and a wait) and StagedRunner (the
interface the Python proxy had: a step enqueued now on the caller's thread)."""
from __future__ import annotations

import ctypes
from typing import Any, Callable, Optional, Sequence

from .. import log
from ..errors import HpcclError
from ..runtime.primitives import Primitives, Recv, Send
from ..runtime.progress import Waiter
from .netplan import PIPE_BLOCKS
from .netstep import StagedNet



class StagedPrimitives(Primitives):
    """Primitives whose exchanges are staged network steps enqueued on the current CuPy stream; copies
    and reductions are the device memory component's, on the same stream (nothing waits on the host)."""

    def __init__(self, rank: int, size: int, net: StagedNet, waiter: Waiter, memory: Any) -> None:
        super().__init__(rank, size, {}, None, waiter, memory)
        self.net = net
        self.label = "network step"

    def exchange(self, sends: Sequence[Send] = (), recvs: Sequence[Recv] = (),
                 meanwhile: Optional[Callable[[], None]] = None) -> None:
        import cupy
        mem = self.mem
        self_sends = [b for p, b in sends if p == self.rank]
        remote_recvs = []
        for peer, buf, op, *rest in recvs:
            src = rest[0] if rest else None
            if peer == self.rank:
                incoming = self_sends.pop(0)
                if op is None:
                    mem.copy(buf, incoming)
                else:
                    mem.reduce(buf, buf if src is None else src, incoming, op)
            else:
                remote_recvs.append((peer, buf.nbytes, buf, op, src))
        remote_sends = [(p, b.data.ptr, b.nbytes) for p, b in sends if p != self.rank]
        if remote_sends or remote_recvs:
            stream = cupy.cuda.get_current_stream().ptr
            net = self.net
            kern = None
            if net.fused_size and net.fusable(remote_sends, remote_recvs):
                kern = self._fused_kernel(remote_recvs)
            one_send = remote_sends[0] if remote_sends else None
            one_recv = remote_recvs[0] if remote_recvs else None
            if kern is not None:  # the kernel is loaded before the engine is handed anything
                run = net.capture_fused if net.driver.capturing(stream) else net.step_fused
                run(stream, one_send, one_recv, self.label, lambda ss, rs, tv, words, captured=False: self._fused(
                    stream, kern, ss, rs, tv, words, captured, remote_sends, remote_recvs))
            elif net.pipeable(remote_sends, remote_recvs) and not net.driver.capturing(stream) \
                    and (pipe := self._fused_kernel(remote_recvs, "hp_net_pipe")) is not None:
                net.step_piped(stream, one_send, one_recv, self.label, lambda ss, rs, geom, lanes, tv, words: self._piped(
                    stream, pipe[0], ss, rs, geom, lanes, tv, words, one_send, one_recv))
            else:
                net.step(stream, remote_sends, remote_recvs, self.label, self._consume)
        if meanwhile is not None:  # after the step in stream order: it touches none of the step's buffers
            meanwhile()

    def scratch(self, count: int, dtype: Any, slot: int = 0) -> Any:
        """As Primitives.scratch; while a call is recorded for replay the buffer is kept alive with the
        recording (a larger call may replace it here, and the replay still writes into it)."""
        out = super().scratch(count, dtype, slot)
        if self.net.rec is not None:
            self.net.rec.keep.append(self._scratch[slot])
        return out

    def _fused_kernel(self, recvs: list, name: str = "hp_net_step") -> Optional[tuple]:
        """(function, elements) of the fused (or piped: ``name``) step's kernel for this receive:
        name<dtype, op>, or a byte copy (op 5 over uint8) when nothing is combined; None for a dtype it has
        no reduction for."""
        from ..kernels import DTYPE_IDS, OP_IDS
        from ..ops import dtype_name
        if recvs and recvs[0][3] is not None:
            buf, op = recvs[0][2], recvs[0][3]
            dt = DTYPE_IDS.get(dtype_name(self.mem.dtype(buf)))
            if dt is None or op.value not in OP_IDS:
                return None
            return self.mem._kernel(f"{name}<{dt}, {OP_IDS[op.value]}>", dt), buf.size
        dt = DTYPE_IDS["uint8"]
        return self.mem._kernel(f"{name}<{dt}, 5>", dt), recvs[0][1] if recvs else 0

    def _fused(self, stream: int, kern: tuple, send_stage: int, recv_stage: int, tokval: int, words: int,
               captured: bool, sends: list, recvs: list) -> tuple:
        """Launch the fused step's kernel (hp_net_step, cuda/hpccl_kernels.cu) on ``stream``: stage the send,
        write the token (or, captured, clear the done word and set the arm word), wait for the done word,
        combine the receive; (func, grid, block, args) back."""
        from ..kernels import Launch
        func, count = kern
        ns = sends[0][2] if sends else 0
        out = x = 0
        if recvs:
            _p, _nr, buf, _op, src = recvs[0]
            out, x = buf.data.ptr, (src if src is not None else buf).data.ptr
        vals = (sends[0][1] if sends else 0, send_stage, ns | (count << 32) | (int(captured) << 63), recv_stage, x,
                out, words, tokval)
        args = [ctypes.c_uint64(v) for v in vals]
        rc = Launch(self.net.driver, func, 1, 256, args)(stream)
        if rc:
            raise self.net._cuda("cuLaunchKernel", rc)
        return func, 1, 256, vals

    def _piped(self, stream: int, func: int, send_stage: int, recv_stage: int, geom: int, lanes: int,
               tokval: int, words: int, send: Optional[tuple], recv: Optional[tuple]) -> tuple:
        """Launch the piped step's kernel (hp_net_pipe, cuda/hpccl_kernels.cu) on ``stream``: a block per
        piece in flight (at most PIPE_BLOCKS); (func, grid, block, args) back."""
        from ..kernels import Launch
        out = x = 0
        if recv is not None:
            _p, _nr, buf, _op, src = recv
            out, x = buf.data.ptr, (src if src is not None else buf).data.ptr
        ns = send[2] if send is not None else 0
        nr = recv[1] if recv is not None else 0
        vals = (send[1] if send is not None else 0, send_stage, ns | (nr << 32), recv_stage, x, out, words, geom,
                lanes, tokval)
        grid = min(lanes >> 32, PIPE_BLOCKS)
        rc = Launch(self.net.driver, func, grid, 512, [ctypes.c_uint64(v) for v in vals])(stream)
        if rc:
            raise self.net._cuda("cuLaunchKernel", rc)
        return func, grid, 512, vals

    def _consume(self, addr: int, r: tuple) -> None:
        """Received data at ``addr`` (pinned memory, mapped at the same address on the device: UVA) into
        its buffer: a copy, or a reduce kernel reading it in place."""
        _peer, n, buf, op, src = r
        if op is None:
            import cupy
            s = cupy.cuda.get_current_stream().ptr
            rc = self.net.driver.memcpy_htod(buf.data.ptr, ctypes.c_void_p(addr), n, ctypes.c_void_p(s))
            if rc:
                raise self.net._cuda("cuMemcpyHtoDAsync", rc)
            if self.net.rec is not None:
                self.net.rec.copy(1, buf.data.ptr, addr, n, s)
        else:
            self.mem.reduce_ptrs(buf, (src if src is not None else buf).data.ptr, addr, op)


class StagedRunner:
    """What the communicator's device side calls for a step with a network part (the interface the
    Python proxy had): the step runs now, on the caller's thread, enqueuing stream work; failures of
    steps already handed to the engine are raised by the next call."""

    def __init__(self, net: StagedNet, prim: StagedPrimitives, device: int, on_fail: Callable[..., None]) -> None:
        #: captured network steps (a template per lane and step, posted by the engine at each replay when the
        #: graph sets its arm word), on every layout: hier's captured calls hold node kernels and these steps
        #: in one stream order
        self.capturable = True
        self.net, self.prim, self.device = net, prim, device
        self._on_fail = on_fail
        self._raised: Optional[HpcclError] = None
        self.ops = self  # reserve() below: nothing to reserve, no stream is held by a thread

    def reserve(self, nbytes: int) -> None:
        """Staged steps allocate on the caller's thread, in stream order: nothing to set aside."""

    def enqueue(self, stream: int, step: Callable[[], None], what: str) -> None:
        self.raise_error()
        from .cuda_context import stream_context
        self.prim.label = what
        with stream_context(self.device, stream):
            self.net.enter(stream)
            try:
                step()
            finally:
                self.net.leave(stream)

    @property
    def error(self) -> Optional[HpcclError]:
        return self._raised or self.net.error()

    def raise_error(self) -> None:
        err = self.error
        if err is not None:
            if self._raised is None:
                self._raised = err
                log.warn("NET", "a network step failed: %s", err)
                try:
                    self._on_fail()
                except Exception:  # noqa: BLE001
                    pass
            raise err

    def drain(self, timeout: Optional[float] = None) -> bool:
        return True

    def close(self) -> None:
        self.net.close()
