"""New processes joining a running job at set-up (grow and join): over MPI, the old ranks accept on a port
(MPI_Comm_accept) that the new processes connect to (MPI_Comm_connect), and both sides merge into one
intracommunicator, old ranks first; over a store, the old ranks' lowest posts an offer under a key the new
processes wait for. Every wait is bounded by HPCCL_TIMEOUT and names the side that never came."""
from __future__ import annotations

import math
import os
import pickle
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Optional, Tuple

from .. import config
from ..errors import HpcclInvalidArgument, HpcclTimeoutError
from .mpi import _mpi

_TAG_HELLO, _TAG_VERDICT = 31011, 31012  # on the intercommunicator of one accept/connect
# a process that connects to the port only to end an accept no new process came to (MPI_Comm_accept has no
# timeout of its own): it says so, and leaves
_RESCUE = ("import sys\nfrom mpi4py import MPI\ninfo = MPI.Info.Create(); info.Set('timeout', sys.argv[2])\n"
           "i = MPI.COMM_SELF.Connect(sys.argv[1], info, root=0)\ni.send(('rescue', 1), dest=0, tag=%d)\n"
           "i.Disconnect()\n" % _TAG_HELLO)
UNCHANGED = "the communicator grown from is unchanged"  # what a failed grow leaves (errors.HpcclTimeoutError)
NOTHING = "nothing was built"  # what a failed join leaves
_LAUNCHER_ENV = ("PMI_", "PMIX_", "HYDRA", "MPI_LOCAL", "MPIR_", "OMPI_")  # the rescuer is an MPI singleton


def open_port() -> str:
    """A new MPI port name (MPI_Open_port) for the old ranks' rank 0 to grow on; pass it to the new processes
    out of band (a file, the environment) and close it with close_port once grown."""
    MPI = _mpi()
    return MPI.Open_port()


def close_port(port: str) -> None:
    """Release a port open_port gave (MPI_Close_port)."""
    _mpi().Close_port(port)


def _after(what: str) -> str:
    return UNCHANGED if what == "grow" else NOTHING


def _wait(done: Callable[[], bool], timeout: float, what: str, missing: list, detail: str) -> None:
    start, nap = time.monotonic(), 1e-4
    while not done():
        if time.monotonic() - start > timeout:
            raise HpcclTimeoutError(what, 0, missing, timeout, detail, _after(what))
        time.sleep(nap)
        nap = min(nap * 2, 5e-3)


def _recv_timed(inter: Any, src: int, tag: int, timeout: float, what: str, missing: list, detail: str) -> Any:
    _wait(lambda: inter.iprobe(source=src, tag=tag), timeout, what, missing, detail)
    return inter.recv(source=src, tag=tag)


def _rescue(port: str, done: threading.Event, timeout: float) -> None:
    """After ``timeout`` with the accept still waiting, connect to the port from a process of its own (an
    MPI singleton) so that the accept returns and grow can name the processes that never came."""
    if done.wait(timeout):
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_ENV)}
    try:
        subprocess.run([sys.executable, "-c", _RESCUE, port, "10"], env=env, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):  # the accept then waits on: nothing else can end it
        pass


def accept(boot: Any, port: Optional[str], n_new: int, new_ranks: list) -> Any:
    """The old side over MPI (every old rank, collective over ``boot``'s MPI communicator): accept the new
    processes on ``port`` (read at rank 0) and merge; a raw MPI intracommunicator, old ranks first."""
    MPI = _mpi()
    timeout = boot.timeout
    done = threading.Event()
    if boot.rank == 0:
        threading.Thread(target=_rescue, args=(port, done, timeout), daemon=True, name="hpccl-grow-rescue").start()
    try:
        inter = boot.comm.Accept(port if boot.rank == 0 else None, root=0)
    except MPI.Exception as exc:
        done.set()
        raise HpcclInvalidArgument("port", f"MPI_Comm_accept failed on {port!r}: {str(exc).splitlines()[0]}") from None
    done.set()
    verdict = None
    if boot.rank == 0:
        kind, count = _recv_timed(inter, 0, _TAG_HELLO, timeout, "grow", new_ranks,
                                  "the connected side never said who it is")
        if kind == "rescue":
            verdict = ("timeout", f"no new process connected to the port within HPCCL_TIMEOUT ({n_new} expected, "
                                  f"to be ranks {new_ranks} of the grown communicator)")
        else:
            if count != n_new:
                verdict = ("n_new", f"{count} new process(es) connected, but n_new={n_new}")
            for r in range(inter.Get_remote_size()):  # every new process hears whether it is in
                inter.send(verdict, dest=r, tag=_TAG_VERDICT)
    verdict = boot.bcast(verdict)
    if verdict is not None:
        inter.Disconnect()
        if verdict[0] == "timeout":
            raise HpcclTimeoutError("grow", 0, new_ranks, timeout, verdict[1], UNCHANGED)
        raise HpcclInvalidArgument("n_new", verdict[1])
    merged = inter.Merge(high=False)
    inter.Free()
    return merged


def connect(mpi_comm: Any, port: Any) -> Any:
    """The new side over MPI (every new process, collective over ``mpi_comm``): connect to ``port`` and merge;
    a raw MPI intracommunicator, the old ranks first."""
    MPI = _mpi()
    if not isinstance(port, str) or not port:
        raise HpcclInvalidArgument("port", f"expected the MPI port name the old ranks grow on, got {port!r}")
    timeout = config.get("HPCCL_TIMEOUT")
    info = MPI.Info.Create()
    info.Set("timeout", str(max(1, math.ceil(timeout))))  # MPICH's bound on a connect nobody accepts
    t0 = time.monotonic()
    try:
        inter = mpi_comm.Connect(port, info, root=0)
    except MPI.Exception as exc:
        first = str(exc).splitlines()[0]
        if time.monotonic() - t0 >= 0.9 * timeout:
            raise HpcclTimeoutError("join", 0, [], timeout, f"no old rank accepted on port {port!r}: the old ranks "
                                    f"never called grow on it ({first})", NOTHING) from None
        raise HpcclInvalidArgument("port", f"MPI_Comm_connect to {port!r} failed: {first}") from None
    finally:
        info.Free()
    if mpi_comm.Get_rank() == 0:
        inter.send(("join", mpi_comm.Get_size()), dest=0, tag=_TAG_HELLO)
    verdict = _recv_timed(inter, 0, _TAG_VERDICT, timeout, "join", [0],
                          "rank 0 of the old ranks accepted but never answered")
    if verdict is not None:
        inter.Disconnect()
        raise HpcclInvalidArgument("mpi_comm", f"the old ranks refused this join: {verdict[1]}")
    merged = inter.Merge(high=True)
    inter.Free()
    return merged


def offer_key(key: str) -> str:
    return f"{key}/offer"


def post_offer(store: Any, key: str, old_size: int, n_new: int) -> None:
    """Old rank 0 over a store: tell the new processes the grown communicator's shape."""
    store.set(offer_key(key), pickle.dumps((old_size, n_new)))


def take_offer(store: Any, key: str, timeout: float) -> Tuple[int, int]:
    """A new process over a store: (old size, n_new) once the old ranks' offer under ``key`` is there."""
    _wait(lambda: store.check([offer_key(key)]), timeout, "join", [0],
          f"no offer under key {key!r}: the old ranks never called grow with this key (rank 0 posts it)")
    return pickle.loads(store.get(offer_key(key)))


def check_store(store: Any) -> None:
    """A store needs set(key, bytes), get(key) and check([keys]) (torch.distributed.Store has them)."""
    lacks = [m for m in ("set", "get", "check") if not callable(getattr(store, m, None))]
    if lacks:
        raise HpcclInvalidArgument("store", f"{type(store).__name__} has no {', '.join(lacks)}: a store needs "
                                   "set(key, bytes), get(key) and check([keys])")
