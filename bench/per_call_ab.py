"""Per-call host cost of hpccl's small-message paths, for an A/B of two commits: 8 B all_reduce through
the front door (numpy) and through Python validation (array.array), a float16 all_reduce (Python's
algorithms) and an 8 B broadcast; the median of 5 blocks of 2000 calls, rank 0's, labelled argv[1].
Run: mpiexec -n 2 python bench/per_call_ab.py LABEL  (PYTHONPATH=a worktree of the other commit for B)"""
import array, sys, time, numpy as np, hpccl
from mpi4py import MPI
comm = hpccl.init()
x = np.ones(2, np.float32); mv = array.array("f", [1.0, 1.0]); y = np.ones(1024, np.float16)
out = {}
for name, fn in (("numpy 8 B (front door)", lambda: comm.all_reduce(x)),
                 ("array.array 8 B (validated)", lambda: comm.all_reduce(mv)),
                 ("float16 2 KiB (Python algorithm)", lambda: comm.all_reduce(y)),
                 ("broadcast numpy 8 B", lambda: comm.broadcast(x, 0))):
    best = []
    for rep in range(5):
        MPI.COMM_WORLD.Barrier()
        t = time.perf_counter()
        for i in range(2000):
            fn()
        best.append((time.perf_counter() - t) / 2000 * 1e6)
    out[name] = sorted(best)[2]
if comm.rank == 0:
    print(sys.argv[1], " | ".join(f"{k}: {v:.2f} us" for k, v in out.items()), flush=True)
comm.destroy()
