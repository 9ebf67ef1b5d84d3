"""Which transports a communicator uses (its transport table's message rows), chosen once at set-up: shared memory inside a node (unless
HPCCL_TRANSPORT=mpi or the CPU's memory ordering rules it out), and the network engine, ucxx or MPI between
nodes, the same on every rank. Functions of the communicator being built (the fields they read)."""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

from .. import config, log
from ..errors import HpcclInvalidArgument, HpcclUnsupported
from .base import Transport
from .mpi import MpiTransport
from .shm import ShmTransport, ordering_problem


def forced() -> str:
    """HPCCL_TRANSPORT, checked: '' (choose), 'shm' or 'mpi'."""
    force = config.get("HPCCL_TRANSPORT")
    if force not in ("", "shm", "mpi"):
        raise HpcclInvalidArgument("HPCCL_TRANSPORT", f"{force!r} is not shm or mpi")
    return force


def node_transport(comm: Any, force: str, local: List[int], tag: str) -> Tuple[Optional[ShmTransport], bool]:
    """(shared memory among this node's ranks or None, whether MPI is forced): MPI when HPCCL_TRANSPORT=mpi
    or the CPU's ordering rules shared memory out; every rank passes ShmTransport's two set-up barriers."""
    problem = ordering_problem() if comm.local_size > 1 and force != "mpi" else None
    if problem is not None:
        if force == "shm":
            raise HpcclUnsupported(f"HPCCL_TRANSPORT=shm: {problem}")
        if comm.local_rank == 0:
            log.warn("TRANSPORT", "%s", problem)
        force = "mpi"
        comm._boot.barrier()  # keep ShmTransport's two set-up barriers matched across nodes
        comm._boot.barrier()
    if force != "mpi" and comm.local_size > 1:
        return ShmTransport(comm._boot, comm.rank, local, f"{tag}-n{comm.node}"), False
    if force != "mpi":
        comm._boot.barrier()  # keep ShmTransport's two set-up barriers matched across nodes
        comm._boot.barrier()
    return None, force == "mpi"


def net_transport(comm: Any) -> Optional[Transport]:
    """The transport to ranks that shared memory does not reach: None on one node (unless
    HPCCL_TRANSPORT=mpi), else UCX when it loads (HPCCL_NET=ucx insists), else MPI."""
    if comm.num_nodes == 1 and not comm._force_mpi:
        return None
    t = new_net_transport(comm)
    comm._table.add(getattr(t, "impl", t.name), "messages across the network",
                    [r for r in range(comm.size) if r not in comm._table.of], t)
    return t


def new_net_transport(comm: Any) -> Transport:
    """A network transport of its own to every rank (collective): hpccl's native engine when it loads
    (HPCCL_NET=engine insists), else ucxx (HPCCL_NET=ucxx insists; ucx: either), else MPI. Every rank takes the same
    path (an agreement over the bootstrap), warning once when the engine is missing."""
    want = config.get("HPCCL_NET")
    if want not in ("", "ucx", "engine", "ucxx", "mpi"):
        raise HpcclInvalidArgument("HPCCL_NET", f"{want!r} is not ucx, engine, ucxx or mpi")
    t: Optional[Transport] = None
    why = ""
    if comm.num_nodes > 1 and want in ("", "ucx", "engine"):
        try:
            from .engine import EngineTransport
        except ImportError as exc:
            why = str(exc)
        everyone = comm._boot.allgather(why)
        missing = [r for r, w in enumerate(everyone) if w]
        if missing:
            if want == "engine":
                raise HpcclUnsupported(f"HPCCL_NET=engine but the network engine cannot load on rank(s) "
                                       f"{missing}: {everyone[missing[0]]}")
            if comm.rank == 0 and comm.parent_ranks is None:
                log.warn("TRANSPORT", "the native network engine is not in use (rank(s) %s: %s); calls "
                         "across nodes take the slower ucxx/MPI path", missing, everyone[missing[0]])
        else:
            t = EngineTransport(comm._boot, comm.rank, list(comm.nodes.node_of))
    if t is None and comm.num_nodes > 1 and want in ("", "ucx", "ucxx"):
        try:
            from .ucx import UcxTransport
        except ImportError as exc:
            if want in ("ucx", "ucxx"):
                raise HpcclUnsupported(f"HPCCL_NET={want} but neither the network engine nor the ucxx "
                                       f"transport can load: {exc}") from None
        else:
            t = UcxTransport(comm._boot, comm.rank)
    if t is None:
        if comm._boot.comm is None:
            raise HpcclUnsupported("ranks on different nodes need the UCX transport (pip install "
                                   "hpccl[ucx]) when the communicator was not built over MPI")
        t = MpiTransport(comm._boot.comm.Dup())
    return t


def check_env(comm: Any, shm: Optional[ShmTransport]) -> None:
    """HPCCL_CHECK_ENV: warn, once per node, where the environment falls short of this set-up's needs."""
    try:
        from ..envcheck import check_environment
    except ImportError:
        return
    need = shm.segment_bytes if shm is not None else 0  # per rank: check_shm multiplies by local_size
    use_ucx = any(t.name == "ucx" for t in comm._transports)
    if comm.local_rank != 0 or comm.parent_ranks is not None:
        return  # once per node, not again for hier's sub-communicators
    for msg in check_environment(need, comm.local_size, False, use_ucx=use_ucx):
        log.warn("ENV", "%s", msg)
