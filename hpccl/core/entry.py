"""How a collective enters the communicator before any Python validation: plain numpy calls through the
compiled hot path's front door, repeated device calls replayed from their launch snapshots (one node), from
the network door's recordings (one rank per node) or from hier's chains, each counted as the validating path
counts a call. Mixed into the Communicator (hpccl/core/comm.py), whose state it reads."""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..errors import HpcclError
from ..host import hotcalls
from ..memory.interop import CUDA

FIRED = object()  # the device fast path replayed the call
_perf = time.perf_counter
_SHORT = {"all_reduce": "ar", "reduce": "red", "broadcast": "bc", "all_gather": "ag", "reduce_scatter": "rs",
          "all_to_all": "a2a"}  # the collectives' names in launch-snapshot keys


class Entry:
    """The front door and the replays of a Communicator's collectives, and where a validated Call goes."""

    def _submit(self, call: Any) -> None:
        """A validated Call runs now, or at the end of the group() it was made in."""
        if self._group is not None:
            self._group.append(call)
        else:
            self._run(call)

    def _front_door(self, coll: str, sendbuf: Any, recvbuf: Any, out_required: bool, *args: Any) -> bool:
        """Hand a call on plain numpy arrays to the hot path before any Python validation; True when it
        took the call (anything it declines goes the validating way). ``out_required``: the collective
        allocates its output when recvbuf is None, which only Python does."""
        hot = self._front.get(coll)
        if (hot is None or type(sendbuf) is not np.ndarray or self._group is not None
                or (out_required and type(recvbuf) is not np.ndarray)):
            return False
        try:
            rc = getattr(hot, coll)(sendbuf, recvbuf, *args, self._seq + 1)
        except OverflowError:  # a root past C's int: nothing ran, and the Spec names it
            return False
        except (HpcclError, OSError) as exc:
            hotcalls.door_raised(self, exc, coll)
        return hotcalls.door_done(self, hot, coll, rc)

    def _enter(self, coll: str, sendbuf: Any, recvbuf: Any, op: Any, root: int, stream: Any,
               out_required: bool = False) -> Any:
        """A collective's opening after its front door: a repeated single-node device call replays its
        launch snapshot (returns FIRED) or gets the key to snapshot this call under (else None); then a
        destroyed or aborted communicator refuses the call. Host buffers and groups never replay."""
        key = None
        if self._dev is not None and type(sendbuf) is not np.ndarray and (recvbuf is not None or not out_required):
            eng = self._dev.engine
            if eng is not None and self._group is None and not self._check_calls and not self._observed:
                key = eng.fast_key(_SHORT[coll], sendbuf, recvbuf, op, root, stream)
                if key is not None:
                    t0 = _perf()
                    if eng.fire(key):
                        self._fired(coll, key, self._planner.replays.get(key, ""), t0)
                        return FIRED
            elif (self._dev.replays is not None and self._group is None and not self._check_calls
                  and not self._observed and not self._destroyed and not self._aborted):
                key = self._dev.keys.key(_SHORT[coll], sendbuf, recvbuf, op, root, stream)
                if key is not None:
                    t0 = _perf()
                    if self._net_fire(coll, key):
                        self._fired(coll, key, "replayed", t0)
                        return FIRED
            elif (self._dev.hier is not None and coll == "all_reduce" and self._group is None
                  and not self._check_calls and not self._observed and not self._destroyed and not self._aborted):
                key = self._dev.keys.key("ar", sendbuf, recvbuf, op, root, stream)
                if key is not None:
                    t0 = _perf()
                    if self._dev.hier.fire(key, self._counted):
                        self._fired(coll, key, "hier replayed", t0)
                        return FIRED
        if self._destroyed or self._aborted:
            self._alive(coll)
        return key

    def _fired(self, coll: str, key: tuple, algo: str, t0: float) -> None:
        """Count a call enqueued from its snapshot or recording (key[1]: the send buffer's address, count,
        dtype) in the statistics, as the validating path counts it."""
        ks = key[1]
        self._rec.stats.add_replayed(coll, CUDA, algo,
                                     ks[1] * ks[2].itemsize * (self.size if coll == "all_gather" else 1), _perf() - t0)

    def _counted(self, coll: str) -> None:
        """The bookkeeping of _run for a replayed call (recordings, hier's chains): its number, told to the
        waiter and announced to the transports."""
        seq = self._seq = self._seq + 1
        self._waiter.collective, self._waiter.seq = coll, seq
        for t in self._transports:
            t.announce(seq)

    def _net_fire(self, coll: str, key: tuple) -> bool:
        """Enqueue a repeated GPU call across nodes from its recording (hpccl/gpu/netreplay.py); False when
        there is none, or it could not run (capture, a failed step: the Python path runs and reports)."""
        if self._dev.replays.fire(key, self._rec.name(coll, self._seq + 1)):
            return False
        self._counted(coll)
        return True
