"""hpccl-info: versions, every HPCCL_* value with its source, and the topology hpccl detects.

Run alone for this process's view, or under mpiexec to see the node map of the whole job."""
from __future__ import annotations

import argparse
import importlib
import os
import platform
import shutil
import socket
import sys
from typing import List, Optional

from hpccl.text import block, one_line


def _version(mod: str) -> str:
    try:
        m = importlib.import_module(mod)
    except Exception as exc:  # noqa: BLE001 - report any import failure as absent
        return f"not available ({type(exc).__name__})"
    return str(getattr(m, "__version__", "present"))


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="hpccl-info", description=__doc__.split("\n\n")[0])
    p.add_argument("--gpu-network", action="store_true",
                   help="check GPU-Direct RDMA between nodes even when the job has one node or no GPU "
                        "is visible (it is checked anyway when GPUs are visible and nodes > 1)")
    p.add_argument("--analyze", metavar="DIR",
                   help="read the flight-recorder dumps in DIR (HPCCL_DUMP_DIR of a failed job) and say "
                        "where each rank stopped; needs no MPI")
    p.add_argument("--metrics", metavar="FILE|DIR|URL", nargs="?", const="",
                   help="print hpccl's Prometheus metrics from a .prom file, a folder of them (HPCCL_METRICS_FILE) "
                        "or an endpoint's URL (HPCCL_METRICS_PORT); alone, this environment's; needs no MPI")
    a = p.parse_args(argv)
    if a.metrics is not None:
        from hpccl.cli.scrape import show
        print(block("\n".join(show(a.metrics))), flush=True)
        return 0
    if a.analyze:
        from hpccl.observe.recorder import analyze
        print(block("\n".join(analyze(a.analyze))), flush=True)
        return 0
    import hpccl
    from hpccl import config
    from mpi4py import MPI

    comm = hpccl.init()
    lines: List[str] = []
    say = lines.append
    say(f"hpccl {hpccl.__version__} on Python {platform.python_version()} ({sys.executable})")
    for mod in ("numpy", "mpi4py", "ml_dtypes", "cupy", "torch", "libucx", "pynvml"):
        say(f"  {mod:<10} {_version(mod)}")
    say(f"  MPI        {one_line(MPI.Get_library_version())}")
    from hpccl.host import hotpath
    say("  hot path   " + (f"compiled ({hotpath._hotpath.__file__})" if hotpath.available() else
                          "not built (no C compiler at install): small host calls run in Python, slower"))
    try:
        from hpccl.transport import engine as _eng
        (maj, mnr, rel), hdr = _eng._ne.version()
        say(f"  network    native engine ({_eng._ne.__file__}; libucp {maj}.{mnr}.{rel}, built against "
            f"UCX {hdr[0]}.{hdr[1]} headers): calls across nodes, GPU steps staged in stream order; small host "
            f"calls with every rank its own node in C up to HPCCL_NET_HOT_SIZE="
            f"{config.get('HPCCL_NET_HOT_SIZE')} bytes" + ("" if config.get("HPCCL_NET_HOT_SIZE") > 0 else " (off)"))
    except ImportError as exc:
        say(f"  network    native engine not available ({exc}): calls across nodes take the slower MPI path")
    say("configuration (HPCCL_*; source env or default):")
    for name, value, source, doc in config.describe():
        say(f"  {name:<24} = {str(value)!r:<14} [{source}]  {doc}")
    try:
        from hpccl.transport.ucx_config import wire_config
        wire = {**wire_config(), **config.get("HPCCL_UCX_CONFIG")}
        user = {k: os.environ[k] for k in sorted(os.environ) if k.startswith("UCX_TCP_")}
        say("UCX settings hpccl gives its own context: "
            + (" ".join(f"UCX_{k}={v}" for k, v in wire.items()) or "none")
            + (f"; the user's: {' '.join(f'{k}={v}' for k, v in user.items())}" if user else ""))
    except Exception as exc:  # noqa: BLE001 - a bad HPCCL_UCX_TCP_TUNE: say so, the rest still prints
        say(f"UCX: not usable ({type(exc).__name__}: {exc})")
    say("topology:")
    say(f"  ranks {comm.size}, nodes {comm.num_nodes}, host path '{comm._path}'")
    from hpccl.transport.select import net_path
    say(f"  network path: {net_path(comm)}")
    for node in range(comm.num_nodes):
        say(f"  node {node} ({comm.nodes.node_names[node]}): ranks {comm.nodes.ranks_on(node)}")
    eng = comm._table.find("engine") if comm.num_nodes > 1 else None
    if eng is not None and hasattr(eng, "auto_lanes"):  # what a GPU side made now would use (collective)
        lanes = min(comm._boot.allgather(eng.auto_lanes()))
        say(f"  network lanes for GPU steps: {lanes} (HPCCL_NET_LANES={config.get('HPCCL_NET_LANES')}"
            + (", auto: 1 with an RDMA transport, else up to 4 by this rank's cores" if
               config.get("HPCCL_NET_LANES") <= 0 else "") + "; the fewest any rank chooses)")
    shm = shutil.disk_usage("/dev/shm") if os.path.isdir("/dev/shm") else None
    say(f"  this host {socket.gethostname()}: {os.cpu_count()} CPUs, /dev/shm "
        + (f"{shm.total / 2**20:.0f} MiB ({shm.free / 2**20:.0f} free)" if shm else "absent"))
    gpus = False
    try:
        from hpccl.topology import nvml
        say(nvml.describe())
        gpus = bool(nvml.gpus())
    except Exception as exc:  # noqa: BLE001 - no GPU or no NVML is a normal state
        say(f"  GPUs: none visible ({type(exc).__name__}: {exc})")
    try:
        from hpccl.envcheck import check_environment, describe_gpudirect
        # GPUs on a communicator that spans nodes: CUDA buffers go between nodes, so GPU-Direct RDMA
        # matters (or --gpu-network asks for the check anyway).
        gpu_network = a.gpu_network or (gpus and comm.num_nodes > 1)
        if gpu_network:
            say(f"  network: {describe_gpudirect()}")
        from hpccl.transport.shm import ShmTransport
        need = ShmTransport.segment_size(comm.local_size) if comm.local_size > 1 else 0
        for msg in check_environment(need, comm.local_size, gpus, gpu_network=gpu_network):
            say(f"  environment: {msg}")
    except ImportError:
        pass
    if comm.rank == 0:  # versions, names and messages from MPI, CUDA, NVML and UCX: printed as plain text
        print(block("\n".join(lines)), flush=True)
    comm.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
