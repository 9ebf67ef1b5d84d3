"""Which transports a communicator uses (its transport table's message rows), chosen once at set-up: shared
memory inside a node (unless HPCCL_TRANSPORT=mpi or the CPU's memory ordering rules it out), and between
nodes one network stack, the native engine (transport/engine.py), or MPI where the engine cannot load or
HPCCL_NET=mpi asks for it; the same on every rank. Functions of the communicator being built (the fields
they read)."""
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


#: HPCCL_NET's accepted values: '' (the engine, else MPI with one warning), 'ucx' and 'engine' (the engine,
#: or an error naming why it cannot load), 'mpi'
NET_CHOICES = ("", "ucx", "engine", "mpi")


def net_choice() -> str:
    """HPCCL_NET, checked. 'ucxx' (the removed ucxx transport, issue 34) is refused with a message that
    names what replaces it, so an old job script fails at init instead of silently taking another path."""
    want = config.get("HPCCL_NET")
    if want == "ucxx":
        raise HpcclInvalidArgument("HPCCL_NET", "'ucxx': the ucxx transport was removed; across nodes hpccl "
                                   "uses its native engine (HPCCL_NET=engine or ucx, or unset) or MPI "
                                   "(HPCCL_NET=mpi)")
    if want not in NET_CHOICES:
        raise HpcclInvalidArgument("HPCCL_NET", f"{want!r} is not ucx, engine or mpi (or unset)")
    return want


def net_transport(comm: Any) -> Optional[Transport]:
    """The transport to ranks that shared memory does not reach: None on one node (unless
    HPCCL_TRANSPORT=mpi), else the native engine when it loads (HPCCL_NET=ucx/engine insists), else MPI."""
    comm._net_note = "one node: no network" if comm.num_nodes == 1 and not comm._force_mpi else ""
    if comm.num_nodes == 1 and not comm._force_mpi:
        return None
    t = new_net_transport(comm)
    comm._table.add(getattr(t, "impl", t.name), "messages across the network",
                    [r for r in range(comm.size) if r not in comm._table.of], t)
    return t


def engine_problem() -> str:
    """Why hpccl's native network engine cannot load in this process ('' when it can)."""
    try:
        from .engine import EngineTransport  # noqa: F401
    except ImportError as exc:
        return str(exc) or type(exc).__name__
    return ""


def new_net_transport(comm: Any) -> Transport:
    """A network transport of its own to every rank (collective): hpccl's native engine when it loads on
    every rank (HPCCL_NET=ucx or engine insists), else MPI. Every rank takes the same path (an agreement over
    the bootstrap); rank 0 warns once per communicator when the engine is missing, naming why."""
    want = net_choice()
    if comm.num_nodes > 1 and want != "mpi":
        everyone = comm._boot.allgather(engine_problem())
        missing = [r for r, w in enumerate(everyone) if w]
        if not missing:
            from .engine import EngineTransport
            comm._net_note = "hpccl's native engine"
            return EngineTransport(comm._boot, comm.rank, list(comm.nodes.node_of))
        why = f"rank(s) {missing}: {everyone[missing[0]]}"
        if want in ("ucx", "engine"):
            raise HpcclUnsupported(f"HPCCL_NET={want} but the network engine cannot load on {why}")
        if comm.rank == 0 and comm.parent_ranks is None and not comm._net_warned:
            log.warn("TRANSPORT", "the native network engine is not in use (%s); calls across nodes take "
                     "the slower MPI path", why)
        comm._net_warned = True  # once per communicator (its GPU side asks again)
        comm._net_note = f"MPI: the native engine cannot load ({why})"
    elif comm.num_nodes == 1:
        comm._net_note = "MPI within one node (shared memory not in use: HPCCL_TRANSPORT=mpi or the CPU's " \
                         "memory ordering)"
    else:
        comm._net_note = "MPI (HPCCL_NET=mpi)"
    if comm._boot.comm is None:
        raise HpcclUnsupported("ranks on different nodes need hpccl's native network engine (built against "
                               "UCX at install: pip install hpccl[ucx]) when the communicator was not built "
                               "over MPI")
    return MpiTransport(comm._boot.comm.Dup())


def net_path(comm: Any) -> str:
    """Which network path ``comm``'s calls across nodes take, and why (hpccl-info, the INIT log)."""
    return comm._net_note or "unknown"


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
