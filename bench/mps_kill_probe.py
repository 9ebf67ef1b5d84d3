"""What a SIGKILL with a kernel in flight does to the other clients of an MPS server (no hpccl involved).

Each case starts a victim process whose stream holds one kind of pending GPU work, a bystander process that
runs small kernels and synchronises throughout, kills the victim, then starts a canary process: a case is
clean when the bystander saw no CUDA error and the canary started and ran a kernel at once.

Kinds of work held by the victim when it dies:
  spin_host      a kernel spinning on a mapped host word nobody will write (no exit of its own)
  spin_dev       a kernel spinning on a device word nobody will write
  spin_lifeline  a kernel spinning on a mapped host word that also leaves once a heartbeat word (bumped every
                 millisecond by a thread of the victim) stops moving for LIFELINE_MS
  spin_bounded   a kernel that spins on the host word for at most 5 ms, then a stream wait on the word
  stream_wait    cuStreamWaitValue32 on the host word (no kernel)
  busy           a kernel that runs for 2 s touching nothing but registers (ends by itself)

Run under MPS: python3 bench/mps_kill_probe.py [case ...]
"""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import threading
import time

CASES = ["stream_wait", "busy", "spin_bounded", "spin_lifeline", "spin_dev", "spin_host"]
LIFELINE_MS = int(os.environ.get("LIFELINE_MS", "20"))

SRC = r"""
__device__ __forceinline__ unsigned long long gt() {
  unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
extern "C" __global__ void spin(volatile unsigned* w, volatile unsigned* hb, unsigned long long life_ns,
                                unsigned long long bound_ns, unsigned* out) {
  if (threadIdx.x) return;
  unsigned last = *hb; unsigned long long t0 = gt(), seen = t0;
  while (*w == 0u) {
    unsigned long long now = gt();
    if (bound_ns && now - t0 > bound_ns) { out[0] = 2u; return; }
    if (life_ns) {
      unsigned h = *hb;
      if (h != last) { last = h; seen = now; } else if (now - seen > life_ns) { out[0] = 1u; return; }
    }
  }
}
extern "C" __global__ void busy(unsigned long long ns, unsigned* out) {
  unsigned long long t0 = gt(); unsigned x = threadIdx.x;
  while (gt() - t0 < ns) x = x * 1664525u + 1013904223u;
  if (x == 7u) out[0] = x;
}
extern "C" __global__ void tick(float* a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) a[i] = a[i] * 0.5f + 1.0f; }
"""


def _mod():
    import cupy as cp
    return cp, cp.RawModule(code=SRC)


def victim(case: str) -> None:
    cp, mod = _mod()
    rt = cp.cuda.runtime
    host = rt.hostAlloc(4096, 2 | 1)  # mapped | portable
    ctypes.memset(host, 0, 4096)
    w, hb = host, host + 64
    dev = cp.zeros(16, dtype=cp.uint32)
    out = cp.zeros(4, dtype=cp.uint32)
    s = cp.cuda.Stream(non_blocking=True)
    stop = threading.Event()
    if case == "spin_lifeline":
        def beat() -> None:
            p = ctypes.c_uint32.from_address(hb)
            while not stop.is_set():
                p.value += 1
                time.sleep(0.001)
        threading.Thread(target=beat, daemon=True).start()
    with s:
        f = mod.get_function("spin")
        if case == "spin_host":
            f((1,), (32,), (w, hb, 0, 0, out.data.ptr))
        elif case == "spin_dev":
            f((1,), (32,), (dev.data.ptr, hb, 0, 0, out.data.ptr))
        elif case == "spin_lifeline":
            f((1,), (32,), (w, hb, LIFELINE_MS * 1000000, 0, out.data.ptr))
        elif case == "spin_bounded":
            for _ in range(50):
                f((1,), (32,), (w, hb, 0, 5000000, out.data.ptr))
            cuda = ctypes.CDLL("libcuda.so.1")
            dptr = ctypes.c_uint64()
            assert cuda.cuMemHostGetDevicePointer_v2(ctypes.byref(dptr), ctypes.c_void_p(w), 0) == 0
            assert cuda.cuStreamWaitValue32_v2(ctypes.c_void_p(s.ptr), dptr, 1, 0) == 0
        elif case == "stream_wait":
            cuda = ctypes.CDLL("libcuda.so.1")
            dptr = ctypes.c_uint64()
            assert cuda.cuMemHostGetDevicePointer_v2(ctypes.byref(dptr), ctypes.c_void_p(w), 0) == 0
            assert cuda.cuStreamWaitValue32_v2(ctypes.c_void_p(s.ptr), dptr, 1, 0) == 0
        elif case == "busy":
            mod.get_function("busy")((132,), (128,), (2_000_000_000, out.data.ptr))
    print("VICTIM_READY", flush=True)
    time.sleep(60)


def bystander(seconds: float) -> None:
    cp, mod = _mod()
    a = cp.ones(1 << 20, dtype=cp.float32)
    f = mod.get_function("tick")
    t_end = time.monotonic() + seconds
    n = 0
    print("BYSTANDER_READY", flush=True)
    try:
        while time.monotonic() < t_end:
            f(((1 << 20) // 256,), (256,), (a, 1 << 20))
            cp.cuda.Device().synchronize()
            n += 1
        print(json.dumps({"bystander": "ok", "kernels": n}), flush=True)
    except Exception as exc:  # noqa: BLE001
        print(json.dumps({"bystander": f"{type(exc).__name__}: {exc}", "kernels": n}), flush=True)
        sys.exit(3)


def canary() -> None:
    cp, mod = _mod()
    a = cp.ones(1024, dtype=cp.float32)
    mod.get_function("tick")((4,), (256,), (a, 1024))
    cp.cuda.Device().synchronize()
    assert float(a[0]) == 1.5
    print("CANARY_OK", flush=True)


def run_case(case: str) -> dict:
    me = [sys.executable, __file__]
    by = subprocess.Popen(me + ["--bystander", "6"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert by.stdout.readline().strip() == "BYSTANDER_READY"
    v = subprocess.Popen(me + ["--victim", case], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = v.stdout.readline().strip()
    time.sleep(0.5)  # the victim's work is surely running or waiting
    t_kill = time.monotonic()
    v.kill()
    v.wait()
    t_dead = time.monotonic() - t_kill
    time.sleep(0.3)
    c0 = time.monotonic()
    c = subprocess.run(me + ["--canary"], capture_output=True, text=True, timeout=60)
    canary_s = time.monotonic() - c0
    bout = by.communicate(timeout=60)[0]
    res = {"case": case, "victim": line, "victim_exit_s": round(t_dead, 3), "canary": "CANARY_OK" in c.stdout,
           "canary_s": round(canary_s, 2),
           "canary_err": [] if "CANARY_OK" in c.stdout else (c.stdout + c.stderr).strip().splitlines()[-1:],
           "bystander": [ln for ln in bout.splitlines() if ln.startswith("{")] or bout.splitlines()[-2:]}
    if not res["canary"]:  # wait for the server to take clients again before the next case
        for _ in range(30):
            time.sleep(1)
            if "CANARY_OK" in subprocess.run(me + ["--canary"], capture_output=True, text=True, timeout=60).stdout:
                break
    return res


if __name__ == "__main__":
    if sys.argv[1:2] == ["--victim"]:
        victim(sys.argv[2])
    elif sys.argv[1:2] == ["--bystander"]:
        bystander(float(sys.argv[2]))
    elif sys.argv[1:2] == ["--canary"]:
        canary()
    else:
        for case in sys.argv[1:] or CASES:
            r = run_case(case)
            ok = r["canary"] and all('"ok"' in b for b in r["bystander"])
            print(("CLEAN " if ok else "FAULT ") + json.dumps(r), flush=True)
