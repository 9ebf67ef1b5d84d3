"""Where GPU-Direct slots stall, if they do (issue 33, the one-GPU machine): all_reduce of 1 and 4 MiB on a
non-blocking stream with HPCCL_NET_GPU_DIRECT=1, each synchronized and checked; a watchdog prints every
thread's Python stack (faulthandler) and, where gdb is installed, the native stacks, then exits."""
from __future__ import annotations

import faulthandler
import os
import shutil
import subprocess
import sys
import threading
import time

import cupy
import hpccl


def watchdog(limit: float) -> None:
    time.sleep(limit)
    faulthandler.dump_traceback(all_threads=True)
    for tid in sorted(os.listdir("/proc/self/task")):  # each thread's name, kernel wait and syscall
        try:
            info = [open(f"/proc/self/task/{tid}/{f}").read().split("\n")[0] for f in ("comm", "wchan", "syscall")]
        except OSError:
            continue
        print(f"thread {tid}: {info}", file=sys.stderr, flush=True)
    spy = shutil.which("py-spy") or "/tmp/site/bin/py-spy"
    if os.path.exists(spy):
        out = subprocess.run([spy, "dump", "--native", "--pid", str(os.getpid())], capture_output=True, text=True,
                             timeout=60)
        print(out.stdout[-9000:], out.stderr[-1500:], file=sys.stderr, flush=True)
    else:
        print("no py-spy here", file=sys.stderr, flush=True)
    os._exit(3)


def main() -> None:
    threading.Thread(target=watchdog, args=(float(os.environ.get("PROBE_LIMIT", "40")),), daemon=True).start()
    comm = hpccl.Communicator()
    cupy.cuda.Device(0).use()
    s = cupy.cuda.Stream(non_blocking=True)
    n, r = comm.size, comm.rank
    for mib in (1, 4):
        count = (mib << 20) // 4
        with s:
            x = cupy.arange(count, dtype=cupy.float32) % 1024 + r
            y = cupy.empty_like(x)
            s.synchronize()
            t = time.perf_counter()
            for _ in range(3):
                comm.all_reduce(x, y, stream=s)
            s.synchronize()
            ok = bool((y == (x - r) * n + n * (n - 1) // 2).all())
        print(f"rank {r}: {mib} MiB all_reduce x3 ok={ok} {1e3 * (time.perf_counter() - t):.1f} ms, "
              f"direct steps {comm._dev.prim.net.direct_steps}, path: {comm._dev.path}", flush=True)
    comm.destroy()


if __name__ == "__main__":
    main()
