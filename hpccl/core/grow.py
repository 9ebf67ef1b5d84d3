"""Growing a communicator: new processes (a later mpiexec or srun step, torchrun workers, plain processes)
join a running one, like ncclCommGrow. The old ranks call grow (collective over the old communicator), the
new processes call join; everyone gets a new communicator of the old ranks, in their order, then the new
ones. It is built the way every communicator is (node discovery, address exchange, transports, the network
engine's endpoints), over a bootstrap that spans both sides: an MPI intracommunicator merged from a port's
accept and connect, or a store under a key of its own. The old communicator is left as it was."""
from __future__ import annotations

from typing import Any, Optional

from .. import config
from ..bootstrap import StoreBootstrap, join as joining
from ..errors import HpcclInvalidArgument, HpcclTimeoutError

DEFAULT_KEY = "hpccl-grow"


def _count(n_new: Any) -> int:
    if isinstance(n_new, bool) or not isinstance(n_new, int) or n_new <= 0:
        raise HpcclInvalidArgument("n_new", f"{n_new!r} is not a positive number of new processes")
    return int(n_new)


def _named(exc: HpcclTimeoutError, what: str, old: int, size: int) -> HpcclTimeoutError:
    """The set-up timeout of a grown communicator, saying which side the missing ranks are on."""
    new = [r for r in exc.missing if r >= old]
    gone = [r for r in exc.missing if r < old]
    parts = ([f"ranks {new} are new processes (hpccl.join) that never arrived"] if new else []) + \
            ([f"ranks {gone} are old ranks (grow) that never arrived"] if gone else [])
    detail = "; ".join(parts) or exc.detail
    return HpcclTimeoutError(what, exc.seq, exc.missing, exc.timeout,
                             f"{detail}; the grown communicator has ranks 0..{old - 1} old, {old}..{size - 1} new",
                             joining.UNCHANGED if what == "grow" else joining.NOTHING)


def _build(cls: Any, boot: Any, node_id: Optional[str], what: str, old: int, size: int) -> Any:
    try:
        return cls(boot, node_id=node_id)
    except HpcclTimeoutError as exc:
        raise _named(exc, what, old, size) from None


def grow(comm: Any, n_new: Any, port: Optional[str], store: Any, key: str) -> Any:
    """The old ranks' side (see Communicator.grow)."""
    n_new = _count(n_new)
    comm._alive("grow")
    if port is not None and store is not None:
        raise HpcclInvalidArgument("port", "give port (MPI) or store, not both")
    if port is None and store is None:
        store = comm._boot.store if isinstance(comm._boot, StoreBootstrap) else None
        if store is None:
            raise HpcclInvalidArgument("port", "a communicator over MPI grows through an MPI port (hpccl.open_port() "
                                       "at rank 0, its name passed to every old rank) or through a store: pass one")
    if store is not None:
        joining.check_store(store)
        if not isinstance(key, str) or not key:
            raise HpcclInvalidArgument("key", f"expected a non-empty string, got {key!r}")
    elif comm._boot.comm is None:
        raise HpcclInvalidArgument("port", "this communicator was built over a store (no MPI communicator to accept "
                                   "on): grow it with store=")
    elif comm.rank == 0 and (not isinstance(port, str) or not port):
        raise HpcclInvalidArgument("port", f"expected the MPI port name from hpccl.open_port(), got {port!r}")
    old, size = comm.size, comm.size + n_new
    new_ranks = list(range(old, size))
    route = "mpi" if store is None else "store"
    used = comm.rank == 0 and store is not None and store.check([joining.offer_key(key)])
    table = comm._boot.allgather((n_new, route, key if store is not None else None, used), "grow")
    for i, name in ((0, "n_new"), (1, "port"), (2, "key")):
        if len({t[i] for t in table}) > 1:
            raise HpcclInvalidArgument(name, f"the old ranks disagree: {[t[i] for t in table]} (by rank)")
    if table[0][3]:
        raise HpcclInvalidArgument("key", f"{key!r} was used by an earlier grow on this store: each grow needs a key "
                                   "of its own")
    if store is None:
        merged = joining.accept(comm._boot, port, n_new, new_ranks)
        try:
            return _build(type(comm), merged, comm._node_override, "grow", old, size)
        finally:
            merged.Free()
    if comm.rank == 0:
        joining.post_offer(store, key, old, n_new)
    boot = StoreBootstrap(store, comm.rank, size, f"{key}/c", comm._boot.world_rank)
    return _build(type(comm), boot, comm._node_override, "grow", old, size)


def join(cls: Any, port: Optional[str], mpi_comm: Any, store: Any, rank: Any, key: str,
         node_id: Optional[str]) -> Any:
    """The new processes' side (see hpccl.join)."""
    if (port is None) == (store is None):
        raise HpcclInvalidArgument("port", "give port (the MPI port the old ranks grow on) or store, one of them")
    if port is not None:
        if not isinstance(port, str) or not port:
            raise HpcclInvalidArgument("port", f"expected the MPI port name the old ranks grow on, got {port!r}")
        from mpi4py import MPI
        mine = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        if not isinstance(mine, MPI.Intracomm) or mine == MPI.COMM_NULL:
            raise HpcclInvalidArgument("mpi_comm", f"expected the new processes' mpi4py intracommunicator, "
                                       f"got {mine!r}")
        merged = joining.connect(mine, port)
        try:
            old = merged.Get_size() - mine.Get_size()
            return _build(cls, merged, node_id, "join", old, merged.Get_size())
        finally:
            merged.Free()
    joining.check_store(store)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise HpcclInvalidArgument("rank", f"{rank!r} is not this process's place among the new ones (0, 1, ...)")
    if not isinstance(key, str) or not key:
        raise HpcclInvalidArgument("key", f"expected a non-empty string, got {key!r}")
    old, n_new = joining.take_offer(store, key, config.get("HPCCL_TIMEOUT"))
    if rank >= n_new:
        raise HpcclInvalidArgument("rank", f"{rank} is not below n_new={n_new}, the number of new processes the old "
                                   "ranks grow by")
    boot = StoreBootstrap(store, old + rank, old + n_new, f"{key}/c", old + rank)
    return _build(cls, boot, node_id, "join", old, old + n_new)
