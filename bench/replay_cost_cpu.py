"""The calling thread's time in the C replay of a piped GPU network step (hpccl/csrc/_netreplay.c), on the CPU:
two ranks' engines in one process over UCX (TCP), each rank replaying a recorded piped all_reduce step of k
pieces over L lanes on a thread of its own, against a stand-in driver compiled here (gcc) whose calls return at
once and whose piped "kernel" writes the step's last ready token (so the engines post every piece); at most
--depth replays are in flight (a thread waits for the oldest one's done words before the next: depth 1, the
engines are idle while the caller replays; 2 and more, back to back, they work on earlier calls meanwhile).
Prints, per k, the median time inside NetProgram.run() and its slope per piece: the replay's own cost, without
the GPU machine's driver calls. With --gap-ms each replay follows a sleep (the engines asleep too), and a
control without hpccl (a fixed piece of work after the same sleep) shows what the machine itself adds.

    python3 bench/replay_cost_cpu.py [--pieces 1,4,16,64] [--lanes 2] [--reps 300] [--depth 1] [--form pipe]
                                     [--gap-ms 0]
"""
from __future__ import annotations

import argparse
import ctypes
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "net"))

STUBS = r"""
#include <stdint.h>
#include <stddef.h>
int dtoh(void *d, uint64_t s, size_t n, void *st) { (void)d; (void)s; (void)n; (void)st; return 0; }
int htod(uint64_t d, const void *s, size_t n, void *st) { (void)d; (void)s; (void)n; (void)st; return 0; }
int dtod(uint64_t d, uint64_t s, size_t n, void *st) { (void)d; (void)s; (void)n; (void)st; return 0; }
int store(void *st, uint64_t a, uint32_t v, unsigned f) {
  (void)st; (void)f; __atomic_store_n((uint32_t *)(uintptr_t)a, v, __ATOMIC_RELEASE); return 0;
}
int nowait(void *st, uint64_t a, uint32_t v, unsigned f) { (void)st; (void)a; (void)v; (void)f; return 0; }
/* the piped kernel: its tokens written at once (the last one: every piece's batch may go) */
int launch(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sh,
           void *st, void **params, void **extra) {
  (void)fn; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)sh; (void)st; (void)extra;
  uint64_t words = *(uint64_t *)params[6], tokval = *(uint64_t *)params[9];
  __atomic_store_n((uint32_t *)(uintptr_t)words, (uint32_t)tokval, __ATOMIC_RELEASE);
  return 0;
}
int capturing(void *st, int *c) { (void)st; *c = 0; return 0; }
int record(void *ev, void *st) { (void)ev; (void)st; return 0; }
int wait_event(void *st, void *ev, unsigned f) { (void)st; (void)ev; (void)f; return 0; }
"""
PIPED = 0x919ED


def stubs() -> tuple:
    """The stand-in driver's entry points in _netreplay.c's F_* order (the library kept alive by the caller)."""
    cc = shutil.which("gcc")
    if cc is None:
        raise SystemExit("gcc is needed to build the stand-in driver")
    d = Path(tempfile.mkdtemp(prefix="hpccl-replay-cost-"))
    (d / "stubs.c").write_text(STUBS)
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(d / "stubs.so"), str(d / "stubs.c")], check=True)
    lib = ctypes.CDLL(str(d / "stubs.so"))
    names = ("dtoh", "htod", "dtod", "store", "nowait", "launch", "capturing", "record", "wait_event")
    return lib, tuple(ctypes.cast(getattr(lib, n), ctypes.c_void_p).value for n in names)


def program(engs, peer: int, k: int, lanes: int, fns: tuple, words, state, stage: np.ndarray, form: str):
    """A piped all_reduce step of k equal pieces (4 KiB each way per piece) as netstep.StagedNet.step_piped records
    it: a lane sync, the pieces, the kernel; ``form`` "pipe": the pieces as one A_PIPE action (each lane's engine
    cuts them), "pieces": per piece a kernel token and a post of its send and receive to lane i mod L."""
    piece = 4096
    send, recv = stage.ctypes.data, stage.ctypes.data + k * piece
    acts, msgs = [(9, min(k, lanes))], []
    if form == "pipe":
        acts.append((10, k, lanes, peer, send, k, piece, k * piece, peer, recv, k, piece, k * piece))
    for i in range(k if form == "pieces" else 0):
        acts += [(7, 0), (3, 2, i % lanes)]
        msgs += [(0, peer, send + i * piece, piece), (1, peer, recv + i * piece, piece)]
    wa = ctypes.addressof(words)
    args = (0, send, (k * piece) | (k * piece) << 32, recv, 0, 0, wa, piece | piece << 32, lanes | k << 32, 0)
    acts.append((8, PIPED, min(k, 8), 512, args, 0))
    lane_t = tuple((e, wa + 4 + 4 * j, wa + 4 + 4 * j) for j, e in enumerate(engs))
    return engs[0].program(acts, msgs, fns, (wa, wa, wa + 48), lane_t, ctypes.addressof(state), 0, 10.0, 0, None)


def control(gap_ms: float, reps: int = 100) -> float:
    """Median us of a fixed piece of work with no hpccl in it (fill 64 KiB, sum 200 ints), each after sleeping
    gap_ms: what a thread's first microseconds after a sleep cost on this machine, for comparison."""
    a, times = np.zeros(1 << 16, np.uint8), []
    for _ in range(reps):
        time.sleep(gap_ms / 1e3)
        t = time.perf_counter_ns()
        a[:] = 1
        sum(range(200))
        times.append(time.perf_counter_ns() - t)
    return statistics.median(times) / 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pieces", default="1,4,16,64")
    ap.add_argument("--lanes", type=int, default=2)
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--depth", type=int, default=1, help="replays in flight per rank")
    ap.add_argument("--gap-ms", type=float, default=0.0,
                    help="sleep between a replay's end and the next (the engines go to sleep after a few ms idle)")
    ap.add_argument("--form", choices=("pipe", "pieces"), default="pipe",
                    help="the piped step as one A_PIPE action (this branch's replays) or a post per piece")
    a = ap.parse_args()
    from engine_pair import engine_pair
    from hpccl.transport.engine import _ne as ne
    lib, fns = stubs()
    pairs = [engine_pair(ne) for _ in range(a.lanes)]  # lane j: rank 0's and rank 1's engines
    engs = [[p[r] for p in pairs] for r in range(2)]
    words = [(ctypes.c_uint32 * 16)() for _ in range(2)]  # ready, done per lane, ..., stuck word (12)
    states = [(ctypes.c_uint32 * 16)() for _ in range(2)]  # netstage.NetState: tok, pad, stream, join, vals
    for st in states:
        st[2] = st[3] = 0xFFFFFFFF
    rows = []
    try:
        for k in (int(x) for x in a.pieces.split(",")):
            stage = [np.zeros(2 * k * 4096, np.uint8) for _ in range(2)]
            progs = [program(engs[r], 1 - r, k, a.lanes, fns, words[r], states[r], stage[r], a.form)
                     for r in range(2)]
            times: list = [[], []]

            def run(r: int) -> None:
                st, w = states[r], words[r]
                wants: list = []

                def drain(n: int) -> None:
                    while len(wants) > n:
                        want, end = wants.pop(0), time.monotonic() + 10
                        while any(((w[1 + j] - v) & 0xFFFFFFFF) >= 1 << 31 for j, v in enumerate(want)):
                            if time.monotonic() > end:
                                raise SystemExit(f"rank {r}: a replay's pieces never ended")
                            time.sleep(0)
                for i in range(a.reps):
                    t = time.perf_counter_ns()
                    assert progs[r].run(1, f"all_reduce #{i}") == 0
                    times[r].append(time.perf_counter_ns() - t)
                    wants.append([st[6 + j] for j in range(a.lanes)])  # NetState.val: this replay's done values
                    drain(a.depth - 1)
                    if a.gap_ms:
                        drain(0)
                        time.sleep(a.gap_ms / 1e3)
                drain(0)
            threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            med = statistics.median(times[0][a.reps // 10:] + times[1][a.reps // 10:]) / 1e3
            rows.append((k, med))
            print(f"pieces {k:>3} lanes {a.lanes}: {med:7.2f} us inside run()", flush=True)
        if len(rows) > 1:
            (k0, t0), (k1, t1) = rows[0], rows[-1]
            print(f"slope: {(t1 - t0) / (k1 - k0):.3f} us per piece ({k0} to {k1} pieces)", flush=True)
        if a.gap_ms:
            print(f"control (no hpccl): {control(a.gap_ms):7.2f} us after the same gap, {control(0):7.2f} us "
                  "back to back", flush=True)
    finally:
        for p in pairs:
            for e in p:
                e.close()
        del lib
    return 0


if __name__ == "__main__":
    sys.exit(main())
