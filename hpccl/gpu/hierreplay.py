"""Repeated hier all_reduce calls on GPU buffers replayed as their sub-calls' own replays (HPCCL_HIER_REPLAY).

hier's all_reduce across nodes with several ranks per node (algorithms/hier.py) is three sub-calls: a node
reduce_scatter into a temporary, the network all_reduce of that part, a node all_gather out of it. Each
sub-communicator can replay a repeated call of its own without Python (the node engine's launch snapshots,
hpccl/gpu/cuda_comm.py; the network front door's recordings, hpccl/gpu/netreplay.py), but only when it sees
the same buffers again, and hier's temporary was new at every call. A Chain keeps the temporary of one key
(collective, buffers, dtype, op, stream) for as long as it lives, and records its sub-calls under keys of its
own (views of the caller's buffers that hold no reference to them), so that a repeated call is the node
engine's replay, the door's replay and the node engine's replay again. torch's compiled backend replays the
same three from C (hpccl/torch/replay.py arms them). Any sub-call that cannot be replayed runs the
sub-communicator's Python path, from where the replay stopped. The call must split evenly over the node's
ranks, and avg (a scaling at the end) is left to the Python path. The temporaries kept are bounded (MAX_HELD
bytes, MAX_CHAINS chains per communicator): past either, the chains made so far let theirs go.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from .. import config
from ..ops import AVG

MAX_CHAINS = 64
MAX_HELD = 1 << 30  # bytes of temporaries one communicator's chains keep between calls (a chain needs 1/local)
_U16 = np.dtype(np.uint16)  # a bfloat16 buffer's flat view (memory/cuda.py)


def enabled() -> bool:
    return bool(config.get("HPCCL_HIER_REPLAY"))


def _view(arr: Any) -> Any:
    """A CuPy array over arr's memory that holds no reference to it (valid while the caller's buffer is)."""
    import cupy
    mem = cupy.cuda.UnownedMemory(arr.data.ptr, arr.nbytes, None, arr.data.device_id)
    return cupy.ndarray(arr.shape, arr.dtype, cupy.cuda.MemoryPointer(mem, 0))


class Chain:
    """One key's temporary, its views of the caller's buffers, and the node engine's keys of its two node
    sub-calls."""

    __slots__ = ("part", "send", "recv", "op", "stream", "k_rs", "k_ag")

    def __init__(self, send: Any, recv: Any, op: Any, stream: int, local: int) -> None:
        import cupy
        self.send, self.recv = _view(send), _view(recv)
        self.part = cupy.empty(send.size // local, dtype=send.dtype)  # allocated on the call's stream
        self.op, self.stream = op, stream
        self.k_rs: Optional[tuple] = None
        self.k_ag: Optional[tuple] = None

    def run(self, intra: Any, inter: Any, start: int = 0) -> None:
        """The sub-calls from ``start`` (0: all three) through the sub-communicators' own calls: each replays
        where it has a recording, else runs (and records) its Python path."""
        st = self.stream
        if start <= 0:
            intra.reduce_scatter(self.send, self.part, self.op, stream=st)
        if start <= 1:
            inter.all_reduce(self.part, None, self.op, stream=st)
        if start <= 2:
            intra.all_gather(self.part, self.recv, stream=st)


class HierChains:
    """The chains of one communicator that runs hier on GPU buffers (its 'intra' and 'inter' sub-communicators
    made), by the key its front end computes."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.chains: Dict[tuple, Chain] = {}
        self.fired = 0
        self.held = 0  # bytes of the chains' temporaries

    def takes(self, call: Any) -> bool:
        """A call a chain can carry: all_reduce with a replay key, no avg, splitting evenly over the node, not
        bfloat16 (its flat view is uint16, which the sub-communicators' calls refuse as the user's dtype), its
        temporary within MAX_HELD."""
        send = call.args[0]
        return (call.coll == "all_reduce" and call.key is not None and call.finish is None
                and call.op is not AVG and send.size % self.comm.local_size == 0 and send.dtype != _U16
                and send.nbytes // self.comm.local_size <= MAX_HELD)

    def record(self, call: Any) -> None:
        """Run ``call`` (a first or declined call) through its chain, made now if it has none (the caller's
        stream is current: the temporary is allocated on it)."""
        comm = self.comm
        intra, inter = comm._subcomm("intra"), comm._subcomm("inter")
        ch = self.chains.get(call.key)
        if ch is None:
            send, recv, op = call.args
            part = send.nbytes // comm.local_size
            if len(self.chains) >= MAX_CHAINS or self.held + part > MAX_HELD:
                self.chains.clear()  # their temporaries go back to CuPy's pool once no armed replay holds them
                self.held = 0
            ch = self.chains[call.key] = Chain(send, recv, op, call.stream, comm.local_size)
            self.held += part
        ch.run(intra, inter)
        eng = intra._dev.engine if intra._dev is not None else None
        if eng is not None:  # the keys the node engine snapshotted the two node calls under
            ch.k_rs = eng.fast_key("rs", ch.send, ch.part, ch.op, -1, ch.stream)
            ch.k_ag = eng.fast_key("ag", ch.part, ch.recv, None, -1, ch.stream)

    def get(self, key: tuple) -> Optional[Chain]:
        return self.chains.get(key)

    def fire(self, key: tuple, count: Any) -> bool:
        """Replay the chain of ``key``: False (nothing enqueued) when there is none, the stream is capturing
        (a graph must own its temporaries) or the node engine has no snapshot of the first sub-call; else
        ``count("all_reduce")`` (the communicator's bookkeeping of the call) and the rest, each sub-call replayed or run."""
        ch = self.chains.get(key)
        if ch is None or ch.k_rs is None:
            return False
        comm = self.comm
        intra, inter = comm._sub["intra"], comm._sub["inter"]  # made by the call that made the chain
        eng = intra._dev.engine
        if comm._dev.capturing(ch.stream) or intra._group is not None or not eng.fire(ch.k_rs):
            return False
        count("all_reduce")
        door = inter._door
        if door is None or not door.fire(0, ch.part, None, ch.op, -1, ch.stream):
            ch.run(intra, inter, 1)
        elif not eng.fire(ch.k_ag):
            ch.run(intra, inter, 2)
        self.fired += 1
        return True

    def drop(self) -> None:
        """Forget every chain (a forced choice, a destroyed communicator); their temporaries go back to the
        pool on the streams they were allocated on, so work already enqueued there keeps them until it ends.
        The node engine's snapshots go too: their generation is what tells torch's compiled backend that
        what it armed from a chain is stale."""
        self.chains.clear()
        self.held = 0
        intra = self.comm._sub.get("intra")
        if intra is not None and intra._dev is not None and intra._dev.engine is not None:
            intra._dev.engine.drop()
