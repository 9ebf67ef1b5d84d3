"""The float8 random-case campaign: tests/mpi/mpi_fp8.py's draw (run_case) for seeds FIRST..LAST-1, every
case against the float64 reference rounded once; rank 0 prints the count per collective. Run from the
repository root: HPCCL_NODE_ID=split:2 mpiexec -n 4 python bench/fp8_campaign.py 100 1000"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "mpi"))

import hpccl  # noqa: E402
from mpi_fp8 import run_case  # noqa: E402


def main() -> None:
    first, last = int(sys.argv[1]), int(sys.argv[2])
    comm = hpccl.init()
    t0, per = time.perf_counter(), {}
    for seed in range(first, last):
        coll = run_case(comm, seed)
        per[coll] = per.get(coll, 0) + 1
    if comm.rank == 0:
        print(f"fp8 campaign: {comm.size} ranks, {comm.num_nodes} node(s), seeds {first}..{last - 1}: "
              f"{last - first} cases passed in {time.perf_counter() - t0:.1f} s; per collective "
              f"{dict(sorted(per.items()))}", flush=True)
    comm.destroy()


if __name__ == "__main__":
    main()
