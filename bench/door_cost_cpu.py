"""The calling thread's time in a replayed GPU all_reduce across nodes, entered from Python or through the C
front door (HPCCL_NET_DOOR, hpccl/csrc/_netdoor.c), on the CPU.

Two ranks' engines in one process over UCX (TCP), each rank on a thread of its own calling
``Communicator.all_reduce`` (the real method and the real Python path: key, lookup, label, sequence number,
announce, statistics) on a stand-in communicator whose arrays are stand-ins of CuPy's, and whose recording
is replay_cost_cpu.py's piped step against its stand-in driver compiled here (gcc). Three ways, interleaved
round by round: "run" (NetProgram.run alone: what both ways share), "python" and "door". Prints each way's
median per call and the front's share (the way's time minus run's).

    python3 bench/door_cost_cpu.py [--rounds 5] [--calls 400] [--pieces 1]
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay_cost_cpu import program, stubs  # noqa: E402

from hpccl.core.comm import Communicator  # noqa: E402
from hpccl.gpu import netreplay  # noqa: E402
from hpccl.memory.cuda import CallKeys  # noqa: E402
from hpccl.observe.recorder import Recorder  # noqa: E402
from hpccl.ops import SUM  # noqa: E402


class Ptr:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


STREAM = Ptr(1)


class CpArray:
    """What hpccl reads off a CuPy array for a replay's key (host memory here)."""

    def __init__(self, a: np.ndarray) -> None:
        self.a, self.data, self.size, self.dtype, self._c_contiguous = a, Ptr(a.ctypes.data), a.size, a.dtype, True


class Transport:
    def announce(self, seq: int) -> None:
        self.seq = seq


class Dev:
    engine = None


class Waiter:
    collective, seq = "", 0


class Comm:
    """The attributes and methods of a Communicator that a replayed all_reduce uses, the methods its own."""

    all_reduce = Communicator.all_reduce
    _enter = Communicator._enter
    _net_fire = Communicator._net_fire
    _fired = Communicator._fired

    def __init__(self, rank: int, prog) -> None:
        self.rank, self.size = rank, 2
        self._front: dict = {}
        self._door = None
        self._group, self._check_calls, self._observed = None, False, False
        self._destroyed, self._aborted = False, False
        self._seq = 0
        self._waiter, self._transports = Waiter(), [Transport(), Transport()]
        self._rec = Recorder("bench", rank, 2, rank)
        keys = object.__new__(CallKeys)
        keys._cp_nd, keys._cur_stream, keys._cp_contig = CpArray, lambda: STREAM, True
        reps = object.__new__(netreplay.NetReplays)
        reps._progs, reps._refused, reps._replayed, reps.door, reps.nranks = {}, {}, 0, None, 2
        self._dev = Dev()
        self._dev.replays, self._dev.keys = reps, keys
        self.x, self.y = CpArray(np.ones(256, np.float32)), CpArray(np.zeros(256, np.float32))
        key = keys.key("ar", self.x, self.y, SUM, -1, None)
        reps._progs[key] = prog


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--pieces", type=int, default=1)
    a = ap.parse_args()
    from engine_pair import engine_pair
    from hpccl.errors import HpcclSystemError
    from hpccl.transport.engine import _ne as ne
    lib, fns = stubs()
    pair = engine_pair(ne)
    words = [(ctypes.c_uint32 * 16)() for _ in range(2)]
    states = [(ctypes.c_uint32 * 16)() for _ in range(2)]
    for st in states:
        st[2] = st[3] = 0xFFFFFFFF
    stage = [np.zeros(2 * a.pieces * 4096, np.uint8) for _ in range(2)]
    progs = [program([pair[r]], 1 - r, a.pieces, 1, fns, words[r], states[r], stage[r], "pipe") for r in range(2)]
    comms = [Comm(r, progs[r]) for r in range(2)]
    doors = []
    for c in comms:
        d = ne.NetDoor(c, CpArray, True, lambda: STREAM, (), netreplay.NAMES, HpcclSystemError)
        (key, prog), = c._dev.replays._progs.items()
        _coll, ks, kr, op, root, st = key
        assert d.put(0, ks, kr, op, root, st, prog, ks[1] * 4)
        c._rec.stats.external.append(lambda d=d: d.rows("cuda"))
        doors.append(d)
    ways = ("run", "python", "door")
    times = {w: [] for w in ways}
    try:
        for rnd in range(a.rounds):
            for way in ways:
                for r, c in enumerate(comms):
                    c._door = doors[r] if way == "door" else None
                got: list = [[], []]

                def call(r: int) -> None:
                    c, w, st = comms[r], words[r], states[r]
                    for i in range(a.calls):
                        t = time.perf_counter_ns()
                        if way == "run":
                            assert progs[r].run(1, f"all_reduce #{i}") == 0
                        else:
                            c.all_reduce(c.x, c.y)
                        got[r].append(time.perf_counter_ns() - t)
                        want, end = st[6], time.monotonic() + 10  # this call's done value: one in flight
                        while ((w[1] - want) & 0xFFFFFFFF) >= 1 << 31:
                            if time.monotonic() > end:
                                raise SystemExit(f"rank {r}: a replay never ended")
                            time.sleep(0)
                threads = [threading.Thread(target=call, args=(r,)) for r in range(2)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                times[way] += got[0][a.calls // 10:] + got[1][a.calls // 10:]
        med = {w: statistics.median(times[w]) / 1e3 for w in ways}
        for w in ways:
            extra = "" if w == "run" else f"  front {med[w] - med['run']:6.2f} us"
            print(f"{w:<7} {med[w]:7.2f} us per call{extra}", flush=True)
        for c, d in zip(comms, doors):
            assert c._seq == a.rounds * (a.calls * 2), c._seq  # python and door calls both numbered
            assert d.fired == a.rounds * a.calls
            assert c._dev.replays.replayed == a.rounds * a.calls
        print(f"checked: every python and door call numbered and counted ({comms[0]._seq} per rank)", flush=True)
    finally:
        for e in pair:
            e.close()
        del lib
    return 0


if __name__ == "__main__":
    sys.exit(main())
