"""The Work torch gets back from an asynchronous call, and a group's CUDA side (hpccl's stream per device,
its join event and completion events): the same contract as ProcessGroupNCCL's Work."""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist


def on_stream(ids: tuple) -> tuple:
    """Make the stream ``ids`` (stream_id, device_index, device_type) current on its device; returns the one
    it replaced. torch.cuda.stream()'s context manager costs tens of us per call from Python."""
    prev = torch._C._cuda_getCurrentStream(ids[1])
    torch._C._cuda_setStream(stream_id=ids[0], device_index=ids[1], device_type=ids[2])
    return prev


class Side:
    """A group's CUDA resources on one device: hpccl's stream, the event that joins it to the caller's
    stream, and a ring of completion events (a Work waited on after its event was re-recorded waits for
    later work on the same stream: stronger, never wrong)."""

    RING = 64

    def __init__(self, idx: int) -> None:
        from ..kernels import Driver
        self.drv = Driver.get()
        self.stream = torch.cuda.Stream(device=idx)
        self.h = int(self.stream.cuda_stream)
        self.ids = (self.stream.stream_id, self.stream.device_index, self.stream.device_type)
        self.device = torch.device("cuda", idx)
        with torch.cuda.device(idx):
            self.join = self.drv.event()
            self.ring = [self.drv.event() for _ in range(self.RING)]
        self.i = 0

    def after(self, caller: int) -> None:
        """hpccl's stream starts after the work the caller's stream holds so far."""
        self.drv.event_record(self.join, caller)
        self.drv.stream_wait_event(self.h, self.join, 0)

    def done_event(self) -> int:
        """A ring event recorded on hpccl's stream now."""
        ev = self.ring[self.i]
        self.i = (self.i + 1) % self.RING
        self.drv.event_record(ev, self.h)
        return ev


class Work(dist._Work):
    """A collective's Work, as ProcessGroupNCCL's behaves: host work is complete when made; CUDA work ends
    with an event on hpccl's stream, and wait() makes the caller's current stream wait on it (no host
    sync). The future is made only when asked for (torch's CUDA futures cost tens of us to complete).
    ``source``: the sender, for a receive from any source."""

    def __init__(self, result: Any, side: Optional[Side] = None, device: int = 0, source: int = -1) -> None:
        super().__init__()
        self._result, self._side, self._device, self._source = result, side, device, source
        self._event = side.done_event() if side is not None else 0

    def wait(self, timeout: Any = None) -> bool:
        if self._side is not None:
            self._side.drv.stream_wait_event(torch._C._cuda_getCurrentRawStream(self._device), self._event, 0)
        return True

    def is_completed(self) -> bool:
        return self._side is None or self._side.drv.event_query(self._event) == 0

    def is_success(self) -> bool:
        return True

    def exception(self) -> Any:
        return None

    def synchronize(self) -> None:
        if self._side is not None:
            self._side.drv.event_synchronize(self._event)

    def result(self) -> Any:
        r = self._result
        return r if isinstance(r, list) else ([] if r is None else [r])

    def _source_rank(self) -> int:
        """The rank a receive from any source took its message from (dist.recv returns it)."""
        if self._source < 0:
            raise RuntimeError("sourceRank() may only be called on a receive from any source")
        return self._source

    def get_future(self) -> torch.futures.Future:
        if self._side is None:
            fut: torch.futures.Future = torch.futures.Future()
            fut.set_result(self._result)
            return fut
        fut = torch.futures.Future(devices=[self._side.device])
        prev = on_stream(self._side.ids)  # its completion event is recorded after this Work's
        try:
            fut.set_result(self._result)
        finally:
            on_stream(prev)
        return fut
