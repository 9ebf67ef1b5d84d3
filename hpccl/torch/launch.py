"""How torch's groups get their hpccl communicators: the creator torch calls per group (MPI under mpiexec
or srun, else the c10d Store), the backend's registration, and init_process_group for MPI launchers."""
from __future__ import annotations

import os
from typing import Any, Sequence

import torch.distributed as dist

from .. import Communicator, config
from ..bootstrap import StoreBootstrap
from ..errors import HpcclInvalidArgument
from .process_group import BACKEND, HpcclProcessGroup


def _group_class() -> type:
    """ReplayGroup when the compiled backend is built (or builds now), else the Python one."""
    from .native import load
    if load() is None:
        return HpcclProcessGroup
    from .replay import ReplayGroup
    return ReplayGroup


def _mpi_comm(global_ranks: Sequence[int], group_size: int) -> Any:
    """The MPI communicator of a torch group: the world for the default group (whose ranks must be MPI's),
    else the MPI group of the same world ranks (created only by its members, as torch calls this)."""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    ranks = list(global_ranks) or list(range(group_size))
    if ranks == list(range(world.Get_size())):
        return world
    if max(ranks) >= world.Get_size():
        raise HpcclInvalidArgument("world_size", f"torch's group has ranks {ranks} but MPI's world has "
                                                 f"{world.Get_size()}: launch every torch rank as an MPI rank")
    return world.Create_group(world.Get_group().Incl(ranks))


_MPI_ENV = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALRANKID")


def _use_mpi() -> bool:
    mode = config.get("HPCCL_BOOTSTRAP")
    if mode not in ("auto", "mpi", "store"):
        raise HpcclInvalidArgument("HPCCL_BOOTSTRAP", f"{mode!r} is not auto, mpi or store")
    return mode == "mpi" or (mode == "auto" and any(v in os.environ for v in _MPI_ENV))


def create(dist_opts: Any, backend_opts: Any = None) -> HpcclProcessGroup:
    """The creator torch calls for each group that uses "hpccl" (extended API)."""
    if not _use_mpi():
        boot = StoreBootstrap(dist_opts.store, dist_opts.group_rank, dist_opts.group_size, "hpccl")
        return _group_class()(Communicator(boot), dist_opts.group_rank, dist_opts.group_size)
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    ranks = list(dist_opts.global_ranks_in_group)
    if not ranks and dist_opts.group_size == world.Get_size() and dist_opts.group_rank != world.Get_rank():
        raise HpcclInvalidArgument("rank", f"torch rank {dist_opts.group_rank} is MPI rank {world.Get_rank()}: "
                                           "the hpccl backend needs torch's ranks to be MPI's (use "
                                           "hpccl.torch.init_process_group(), or RANK from the MPI launcher)")
    mc = _mpi_comm(ranks, dist_opts.group_size)
    comm = Communicator(mc)
    if comm.size != dist_opts.group_size:
        raise HpcclInvalidArgument("world_size", f"torch's group has {dist_opts.group_size} ranks, the MPI "
                                                 f"communicator {comm.size}")
    return _group_class()(comm, dist_opts.group_rank, dist_opts.group_size)


def register() -> None:
    """Register the "hpccl" backend with torch.distributed (idempotent; done by importing hpccl.torch)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, create, extended_api=True, devices=["cpu", "cuda"])


def init_process_group(backend: str = BACKEND, **kwargs: Any) -> None:
    """torch.distributed.init_process_group for whichever launcher started this process: under mpiexec or
    srun, rank, world size and a TCP store from MPI (rank 0's host and a free port broadcast over MPI);
    under torchrun (or any launcher that sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT), torch's
    env://; with no launcher, one process. Frameworks that adopt an existing default group (accelerate,
    DeepSpeed) then run on hpccl."""
    import socket
    if not _use_mpi() and "init_method" not in kwargs and "store" not in kwargs:
        if all(v in os.environ for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
            dist.init_process_group(backend, **kwargs)
        else:  # no launcher: a world of one
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                                    **kwargs)
        _bind(kwargs.get("device_id"))
        return
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    addr = None
    if world.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        host = os.environ.get("MASTER_ADDR") or socket.gethostbyname(socket.gethostname())
        addr = f"tcp://{host}:{port}"
    addr = world.bcast(addr, root=0)
    kwargs.setdefault("init_method", addr)
    dist.init_process_group(backend, rank=world.Get_rank(), world_size=world.Get_size(), **kwargs)
    _bind(kwargs.get("device_id"))


def _bind(dev: Any) -> None:
    pg = dist.group.WORLD
    if dev is not None and isinstance(pg, HpcclProcessGroup) and pg.bound_device_id is None:
        pg.bound_device_id = dev  # torch binds only Backend objects; split_group reads it
