"""Another GPU workload beside a job (tests/gpu/test_coexist.py): kernels that hold most of one GPU's
multiprocessors, launched back to back until SIGTERM. Each kernel's blocks (1024 threads, two per SM fill an
SM's threads) spin for --ms milliseconds. Prints 'ready' once kernels run, and at exit how many finished.

    python3 gpu_hog.py DEVICE [--fraction 0.9] [--ms 5]
"""
import argparse
import signal
import sys

import cupy

SRC = r"""
extern "C" __global__ void hog(unsigned long long ns, unsigned int* done) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
  __syncthreads();
  if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(done, 1u);
}
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("device", type=int)
    ap.add_argument("--fraction", type=float, default=0.9, help="share of the SMs whose threads it takes")
    ap.add_argument("--ms", type=float, default=5.0, help="milliseconds each kernel spins")
    ap.add_argument("--once", action="store_true", help="one kernel: 'ready' as soon as it runs, then exit")
    a = ap.parse_args()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    with cupy.cuda.Device(a.device):
        sms = cupy.cuda.Device(a.device).attributes["MultiProcessorCount"]
        k = cupy.RawModule(code=SRC).get_function("hog")
        done = cupy.zeros(1, cupy.uint32)
        st = cupy.cuda.Stream(non_blocking=True)
        grid = max(1, int(2 * sms * a.fraction))
        ns = cupy.uint64(int(a.ms * 1e6))
        launched = 0
        if a.once:
            with st:
                k((grid,), (1024,), (ns, done))
            import time
            time.sleep(0.5)  # its blocks are resident by now: nothing else gets a multiprocessor
            print(f"ready: one kernel of {grid} blocks of 1024 threads on {sms} SMs for {a.ms} ms", flush=True)
            while not stop and not st.done:
                time.sleep(0.05)
            print("hog kernels finished: 1 of 1", flush=True)
            return 0
        with st:
            k((grid,), (1024,), (ns, done))
            launched += 1
            st.synchronize()
            print(f"ready: {grid} blocks of 1024 threads on {sms} SMs, {a.ms} ms each", flush=True)
            while not stop:
                k((grid,), (1024,), (ns, done))
                launched += 1
                if launched % 4 == 0:
                    st.synchronize()  # at most a few kernels queued, so SIGTERM ends it quickly
            st.synchronize()
        print(f"hog kernels finished: {int(done.get()[0])} of {launched}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
